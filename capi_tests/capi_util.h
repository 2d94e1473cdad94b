/* Shared helpers of the C API tests: CHECK macros that report the failing
   expression, the result code and tc_last_error(). */
#ifndef CAPI_UTIL_H
#define CAPI_UTIL_H

/* For mkstemp; include this header before any system header. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
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

/* A one-rank FileStore at a fresh temporary path, written to `path` (at
   least 32 bytes) so that the caller can unlink it at the end. */
static inline tc_store_t *capi_temp_store(char *path) {
    strcpy(path, "/tmp/tc_capi_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        exit(2);
    }
    close(fd);
    unlink(path);
    tc_store_t *store = NULL;
    EXPECT_OK(tc_store_file_new(path, 1, &store));
    return store;
}

/* A one-rank host comm over `store`, abort-on-error off; NULL on failure
   (counted as a failed check). */
static inline tc_comm_t *capi_one_rank_comm(const char *name, tc_store_t *store) {
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = name;
    o.rank = 0;
    o.world_size = 1;
    o.store = store;
    o.abort_on_error = 0;
    tc_comm_t *comm = NULL;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &comm));
    return comm;
}

/* Forks `size` ranks (at most 8), each running rank_main(path, rank, size)
   with `path` a fresh FileStore path they share, and waits for them; a rank
   that does not exit 0 is a failed check, reported with `what`. `path` (at
   least 32 bytes) is left holding that path, its file removed. */
static inline void capi_run_ranks(const char *what, int size, int (*rank_main)(const char *, int, int),
                                  char *path) {
    strcpy(path, "/tmp/tc_capi_ranks_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || size > 8) exit(2);
    close(fd);
    unlink(path);
    pid_t pids[8];
    for (int r = 0; r < size; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(path, r, size));
    }
    for (int r = 0; r < size; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "%s, %d ranks: rank %d ended with status 0x%x\n", what, size, r, status);
            capi_failures++;
        }
    }
    unlink(path);
}

#endif
