/* Shared helpers of the C API tests: CHECK macros that report the failing
   expression, the result code and tc_last_error(). */
#ifndef CAPI_UTIL_H
#define CAPI_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <torchcomm.h>

static int capi_failures = 0;

static const char *capi_text(const char *s) { return s ? s : "(null)"; }

/* True when this thread's last error mentions `needle` (always for NULL). */
static int capi_last_error_mentions(const char *needle) {
    return needle == NULL || strstr(tc_last_error(), needle) != NULL;
}

#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            capi_failures++;                                                       \
        }                                                                          \
    } while (0)

/* Expects `call` to return `code`; on success of the expectation, also checks
   that tc_last_error() mentions `needle` (NULL: no check). */
#define EXPECT_RC(call, code, needle)                                              \
    do {                                                                           \
        tc_result_t rc_ = (call);                                                  \
        if (rc_ != (code)) {                                                       \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d; last error: %s\n", \
                    __FILE__, __LINE__, #call, rc_, tc_result_string(rc_), (int)(code),  \
                    tc_last_error());                                              \
            capi_failures++;                                                       \
        } else if (!capi_last_error_mentions(needle)) {                        \
            fprintf(stderr, "%s:%d: %s: last error \"%s\" does not mention \"%s\"\n", \
                    __FILE__, __LINE__, #call, tc_last_error(), capi_text(needle));        \
            capi_failures++;                                                       \
        }                                                                          \
    } while (0)

#define EXPECT_OK(call) EXPECT_RC(call, TC_SUCCESS, (const char *)NULL)

#define CAPI_DONE(name)                                                            \
    do {                                                                           \
        if (capi_failures) {                                                       \
            fprintf(stderr, "%s: %d check(s) failed\n", name, capi_failures);      \
            return 1;                                                              \
        }                                                                          \
        printf("%s: all checks passed\n", name);                                   \
        return 0;                                                                  \
    } while (0)

#endif
