/* The C store API: TCP server and client, file and prefix stores, every
   operation, and the error paths (NULL arguments, buffer too small, wait
   timeout, connect failure, out-parameters untouched on failure). */
#include "capi_util.h"
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* An empty needle matches any message; it keeps gcc's -Wnonnull quiet on
   the NULL-needle path of EXPECT_RC in this large function. */
#undef EXPECT_OK
#define EXPECT_OK(call) EXPECT_RC(call, TC_SUCCESS, "")

#define THREADS 4
#define ADDS 200

static void *adder(void *arg) {
    tc_store_t *s = (tc_store_t *)arg;
    for (int i = 0; i < ADDS; i++) {
        if (tc_store_add(s, "shared_counter", 1, NULL) != TC_SUCCESS) {
            fprintf(stderr, "adder: %s\n", tc_last_error());
            return (void *)1;
        }
    }
    return NULL;
}

int main(void) {
    tc_store_t *server = NULL, *client = NULL, *prefix = NULL, *file = NULL;
    tc_store_t *const sentinel = (tc_store_t *)&capi_failures;
    tc_store_t *untouched = sentinel;

    /* A server on a free port; world_size 1 waits for itself only. */
    EXPECT_OK(tc_store_tcp_new("127.0.0.1", 0, 1, 1, 10000, &server));
    uint16_t port = 0;
    EXPECT_OK(tc_store_tcp_port(server, &port));
    CHECK(port != 0);
    if (server == NULL || port == 0) CAPI_DONE("test_store");
    EXPECT_OK(tc_store_tcp_new("localhost", port, 0, -1, 10000, &client));
    if (client == NULL) CAPI_DONE("test_store");

    /* set / get into a caller buffer */
    EXPECT_OK(tc_store_set(client, "greeting", "hello", 5));
    char buf[16];
    size_t len = 0;
    EXPECT_OK(tc_store_get(server, "greeting", buf, sizeof buf, &len));
    CHECK(len == 5 && memcmp(buf, "hello", 5) == 0);
    len = 0;
    EXPECT_RC(tc_store_get(server, "greeting", buf, 2, &len), TC_ERR_BUFFER_TOO_SMALL, "5 bytes");
    CHECK(len == 5);
    len = 0;
    EXPECT_RC(tc_store_get(server, "greeting", NULL, 0, &len), TC_ERR_BUFFER_TOO_SMALL, "");
    CHECK(len == 5);
    EXPECT_RC(tc_store_get(server, "greeting", NULL, 4, &len), TC_ERR_NULL_ARGUMENT, "buf");
    EXPECT_OK(tc_store_set(client, "empty", NULL, 0));
    EXPECT_OK(tc_store_get(client, "empty", NULL, 0, &len));
    CHECK(len == 0);

    /* get_alloc */
    void *value = NULL;
    len = 0;
    EXPECT_OK(tc_store_get_alloc(client, "greeting", &value, &len));
    CHECK(value != NULL && len == 5 && memcmp(value, "hello", 5) == 0);
    tc_free(value);
    tc_free(NULL);
    EXPECT_RC(tc_store_get_alloc(client, "greeting", NULL, &len), TC_ERR_NULL_ARGUMENT, "value");

    /* add: "6" then 21 */
    int64_t n = 0;
    EXPECT_OK(tc_store_add(client, "counter", 6, &n));
    CHECK(n == 6);
    EXPECT_OK(tc_store_get(client, "counter", buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == '6');
    EXPECT_OK(tc_store_add(client, "counter", 15, &n));
    CHECK(n == 21);

    /* compare_set, including the missing-key quirk */
    void *cur = NULL;
    size_t cur_len = 0;
    EXPECT_OK(tc_store_compare_set(client, "cs", "x", 1, "y", 1, &cur, &cur_len));
    CHECK(cur_len == 1 && memcmp(cur, "x", 1) == 0);
    tc_free(cur);
    EXPECT_OK(tc_store_compare_set(client, "cs", NULL, 0, "first", 5, &cur, &cur_len));
    CHECK(cur_len == 5 && memcmp(cur, "first", 5) == 0);
    tc_free(cur);
    EXPECT_OK(tc_store_compare_set(client, "cs", "first", 5, "second", 6, &cur, &cur_len));
    CHECK(cur_len == 6 && memcmp(cur, "second", 6) == 0);
    tc_free(cur);

    /* check and wait */
    const char *present[] = {"greeting", "counter"};
    const char *absent[] = {"greeting", "nope"};
    int ready = -1;
    EXPECT_OK(tc_store_check(client, present, 2, &ready));
    CHECK(ready == 1);
    EXPECT_OK(tc_store_check(client, absent, 2, &ready));
    CHECK(ready == 0);
    EXPECT_OK(tc_store_wait(client, present, 2, 1000));
    EXPECT_RC(tc_store_wait(client, absent, 2, 200), TC_ERR_TIMEOUT, "wait timeout after 200ms, keys: /greeting, /nope");
    /* still usable after the timeout */
    EXPECT_OK(tc_store_add(client, "counter", 0, &n));
    CHECK(n == 21);

    /* delete and num_keys (init/ counts) */
    int deleted = -1;
    EXPECT_OK(tc_store_delete(client, "cs", &deleted));
    CHECK(deleted == 1);
    EXPECT_OK(tc_store_delete(client, "cs", &deleted));
    CHECK(deleted == 0);
    EXPECT_OK(tc_store_num_keys(client, &n));
    CHECK(n == 4); /* init/, greeting, empty, counter */

    /* prefix: torch's prefix/key rule */
    EXPECT_OK(tc_store_prefix_new(client, "pg", &prefix));
    EXPECT_OK(tc_store_set(prefix, "k", "v", 1));
    EXPECT_OK(tc_store_get(server, "pg/k", buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'v');
    EXPECT_OK(tc_store_tcp_port(prefix, &port));

    /* one handle, several threads */
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, adder, client);
    for (int i = 0; i < THREADS; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    EXPECT_OK(tc_store_add(server, "shared_counter", 0, &n));
    CHECK(n == THREADS * ADDS);

    /* file store */
    char path[64];
    snprintf(path, sizeof path, "/tmp/tc_store_capi_%ld", (long)getpid());
    EXPECT_OK(tc_store_file_new(path, 1, &file));
    EXPECT_OK(tc_store_add(file, "c", 6, &n));
    EXPECT_OK(tc_store_add(file, "c", 15, &n));
    CHECK(n == 21);
    EXPECT_OK(tc_store_get(file, "c", buf, sizeof buf, &len));
    CHECK(len == 2 && memcmp(buf, "21", 2) == 0);
    EXPECT_RC(tc_store_wait(file, absent, 2, 100), TC_ERR_TIMEOUT, "wait timeout after 100ms");
    EXPECT_RC(tc_store_tcp_port(file, &port), TC_ERR_INVALID_USAGE, "");
    tc_store_free(file);
    CHECK(access(path, F_OK) != 0); /* last of world_size 1 removed it */

    /* NULL arguments name themselves; out-parameters stay untouched */
    EXPECT_RC(tc_store_set(NULL, "k", "v", 1), TC_ERR_NULL_ARGUMENT, "store");
    EXPECT_RC(tc_store_set(client, NULL, "v", 1), TC_ERR_NULL_ARGUMENT, "key");
    EXPECT_RC(tc_store_set(client, "k", NULL, 1), TC_ERR_NULL_ARGUMENT, "value");
    EXPECT_RC(tc_store_check(client, NULL, 1, &ready), TC_ERR_NULL_ARGUMENT, "keys");
    EXPECT_RC(tc_store_check(client, present, 2, NULL), TC_ERR_NULL_ARGUMENT, "ready");
    EXPECT_RC(tc_store_num_keys(client, NULL), TC_ERR_NULL_ARGUMENT, "'n'");
    EXPECT_RC(tc_store_tcp_new(NULL, port, 0, -1, 100, &untouched), TC_ERR_NULL_ARGUMENT, "host");
    EXPECT_RC(tc_store_tcp_new("127.0.0.1", port, 0, -1, 100, NULL), TC_ERR_NULL_ARGUMENT, "out");
    EXPECT_RC(tc_store_tcp_new("127.0.0.1", 0, 1, 0, 100, &untouched), TC_ERR_INVALID_ARGUMENT, "world_size");
    EXPECT_RC(tc_store_prefix_new(NULL, "p", &untouched), TC_ERR_NULL_ARGUMENT, "base");
    EXPECT_RC(tc_store_file_new(NULL, 1, &untouched), TC_ERR_NULL_ARGUMENT, "path");
    CHECK(untouched == sentinel);
    /* connect failure names host and port */
    EXPECT_RC(tc_store_tcp_new("127.0.0.1", 1, 0, -1, 200, &untouched), TC_ERR_TIMEOUT, "127.0.0.1:1");
    CHECK(untouched == sentinel);

    tc_store_free(prefix);
    tc_store_free(client);
    tc_store_free(server);
    tc_store_free(NULL);
    CAPI_DONE("test_store");
}
