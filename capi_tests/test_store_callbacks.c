/* A store served by the application's callbacks (tc_store_new_callbacks):
   every operation forwards to the callbacks, a failing callback becomes the
   error it returned with its message, missing functions are refused or
   unsupported by name, destroy runs once after the last user (a comm) is
   gone, and comms of 2, 3 and 4 forked ranks bootstrap over such stores
   (each rank's callbacks forward to a shared FileStore) and all-reduce. */
#include "capi_util.h"
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>

#undef EXPECT_OK
#define EXPECT_OK(call) EXPECT_RC(call, TC_SUCCESS, "")

/* The callbacks' user data: the store they forward to, and counters. */
typedef struct {
    tc_store_t *target;
    int destroyed;
    int calls;
    int fail_next; /* nonzero: the next set fails with this code */
} forward_t;

/* Forwards a failed tc_store_* call's detail as the callback's message. */
static tc_result_t relay(tc_result_t rc, tc_store_reply_t *reply) {
    if (rc != TC_SUCCESS) tc_store_reply_error(reply, tc_last_error());
    return rc;
}

static tc_result_t fw_set(void *ud, const char *key, const void *value, size_t len, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
    if (f->fail_next) {
        int code = f->fail_next;
        f->fail_next = 0;
        if (code != 77) tc_store_reply_error(reply, "the disk is on fire");
        return code;
    }
    return relay(tc_store_set(f->target, key, value, len), reply);
}

static tc_result_t fw_get(void *ud, const char *key, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
    void *v = NULL;
    size_t len = 0;
    tc_result_t rc = tc_store_get_alloc(f->target, key, &v, &len);
    if (rc != TC_SUCCESS) return relay(rc, reply);
    rc = tc_store_reply_value(reply, v, len);
    tc_free(v);
    return rc;
}

static tc_result_t fw_add(void *ud, const char *key, int64_t delta, int64_t *out, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
    return relay(tc_store_add(f->target, key, delta, out), reply);
}

static tc_result_t fw_check(void *ud, const char *const *keys, size_t n, int *ready, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
    return relay(tc_store_check(f->target, (const char **)keys, n, ready), reply);
}

static tc_result_t fw_wait(void *ud, const char *const *keys, size_t n, int64_t timeout_ms, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    __atomic_add_fetch(&f->calls, 1, __ATOMIC_RELAXED);
    return relay(tc_store_wait(f->target, (const char **)keys, n, timeout_ms), reply);
}

static tc_result_t fw_delete(void *ud, const char *key, int *deleted, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    return relay(tc_store_delete(f->target, key, deleted), reply);
}

static tc_result_t fw_num_keys(void *ud, int64_t *n, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    return relay(tc_store_num_keys(f->target, n), reply);
}

static tc_result_t fw_compare_set(void *ud, const char *key, const void *e, size_t elen, const void *d,
                                  size_t dlen, tc_store_reply_t *reply) {
    forward_t *f = (forward_t *)ud;
    void *cur = NULL;
    size_t len = 0;
    tc_result_t rc = tc_store_compare_set(f->target, key, e, elen, d, dlen, &cur, &len);
    if (rc != TC_SUCCESS) return relay(rc, reply);
    rc = tc_store_reply_value(reply, cur, len);
    tc_free(cur);
    return rc;
}

static tc_result_t get_without_value(void *ud, const char *key, tc_store_reply_t *reply) {
    (void)ud, (void)key, (void)reply;
    return TC_SUCCESS;
}

static void fw_destroy(void *ud) { ((forward_t *)ud)->destroyed++; }

static tc_store_callbacks_t forwarding(forward_t *f) {
    tc_store_callbacks_t cb = TC_STORE_CALLBACKS_INIT;
    cb.user_data = f;
    cb.set = fw_set;
    cb.get = fw_get;
    cb.add = fw_add;
    cb.check = fw_check;
    cb.wait = fw_wait;
    cb.delete_key = fw_delete;
    cb.compare_set = fw_compare_set;
    cb.num_keys = fw_num_keys;
    cb.destroy = fw_destroy;
    cb.timeout_ms = 5000;
    return cb;
}

#define THREADS 4
#define ADDS 100

static void *adder(void *arg) {
    for (int i = 0; i < ADDS; i++)
        if (tc_store_add((tc_store_t *)arg, "threads", 1, NULL) != TC_SUCCESS) return (void *)1;
    return NULL;
}

static void one_process(void) {
    char path[32];
    tc_store_t *file = capi_temp_store(path);
    forward_t f = {file, 0, 0, 0};
    tc_store_callbacks_t cb = forwarding(&f);
    tc_store_t *s = NULL, *prefix = NULL;
    EXPECT_OK(tc_store_new_callbacks(&cb, &s));
    if (s == NULL) return;

    /* Every operation reaches the target through the callbacks. */
    EXPECT_OK(tc_store_set(s, "k", "hello", 5));
    char buf[16];
    size_t len = 0;
    EXPECT_OK(tc_store_get(file, "k", buf, sizeof buf, &len));
    CHECK(len == 5 && memcmp(buf, "hello", 5) == 0);
    EXPECT_OK(tc_store_get(s, "k", buf, sizeof buf, &len));
    CHECK(len == 5 && memcmp(buf, "hello", 5) == 0);
    int64_t n = 0;
    EXPECT_OK(tc_store_add(s, "c", 6, &n));
    EXPECT_OK(tc_store_add(s, "c", 15, &n));
    CHECK(n == 21);
    const char *present[] = {"k", "c"}, *absent[] = {"k", "nope"};
    int ready = -1;
    EXPECT_OK(tc_store_check(s, present, 2, &ready));
    CHECK(ready == 1);
    EXPECT_OK(tc_store_check(s, absent, 2, &ready));
    CHECK(ready == 0);
    EXPECT_OK(tc_store_wait(s, present, 2, 1000));
    EXPECT_RC(tc_store_wait(s, absent, 2, 100), TC_ERR_TIMEOUT, "store callback wait");
    void *cur = NULL;
    EXPECT_OK(tc_store_compare_set(s, "cs", NULL, 0, "first", 5, &cur, &len));
    CHECK(len == 5 && cur && memcmp(cur, "first", 5) == 0);
    tc_free(cur);
    int deleted = -1;
    EXPECT_OK(tc_store_delete(s, "cs", &deleted));
    CHECK(deleted == 1);
    EXPECT_OK(tc_store_num_keys(s, &n));
    CHECK(n == 2);
    /* A prefix store over it adds prefix/ before the callbacks see the key. */
    EXPECT_OK(tc_store_prefix_new(s, "pg", &prefix));
    EXPECT_OK(tc_store_set(prefix, "x", "v", 1));
    EXPECT_OK(tc_store_get(file, "pg/x", buf, sizeof buf, &len));
    CHECK(len == 1 && buf[0] == 'v');
    /* Several threads at once. */
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, adder, s);
    for (int i = 0; i < THREADS; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    EXPECT_OK(tc_store_add(file, "threads", 0, &n));
    CHECK(n == THREADS * ADDS);

    /* A failing callback: its code and message, after the operation and key. */
    f.fail_next = TC_ERR_SYSTEM;
    EXPECT_RC(tc_store_set(s, "k", "v", 1), TC_ERR_SYSTEM, "store callback set (key \"k\") failed: the disk is on fire");
    f.fail_next = 77; /* not a library code, no message */
    EXPECT_RC(tc_store_set(s, "k", "v", 1), TC_ERR_REMOTE, "returned 77 without a message");

    /* A comm bootstraps over it; the store's handle may go first. */
    int calls_before = f.calls;
    tc_comm_t *comm = capi_one_rank_comm("callback-store", prefix);
    CHECK(comm != NULL);
    CHECK(f.calls > calls_before);
    tc_store_free(prefix);
    tc_store_free(s);
    CHECK(f.destroyed == 0); /* the comm still holds it */
    if (comm) {
        float x = 2.0f;
        tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
        EXPECT_OK(tc_all_reduce(comm, &x, 1, TC_FLOAT32, sum, NULL, NULL));
        CHECK(x == 2.0f);
        EXPECT_OK(tc_comm_finalize(comm));
        tc_comm_destroy(comm);
    }
    CHECK(f.destroyed == 1);

    /* Missing required functions are named; optional ones are unsupported. */
    tc_store_t *const sentinel = (tc_store_t *)&capi_failures;
    tc_store_t *untouched = sentinel;
    forward_t g = {file, 0, 0, 0};
    cb = forwarding(&g);
    cb.wait = NULL;
    EXPECT_RC(tc_store_new_callbacks(&cb, &untouched), TC_ERR_NULL_ARGUMENT, "'callbacks->wait'");
    CHECK(untouched == sentinel && g.destroyed == 0);
    cb = forwarding(&g);
    cb.magic = 1;
    EXPECT_RC(tc_store_new_callbacks(&cb, &untouched), TC_ERR_INVALID_ARGUMENT, "tc_store_callbacks_t");
    EXPECT_RC(tc_store_new_callbacks(NULL, &untouched), TC_ERR_NULL_ARGUMENT, "'callbacks'");
    cb = forwarding(&g);
    EXPECT_RC(tc_store_new_callbacks(&cb, NULL), TC_ERR_NULL_ARGUMENT, "'out'");
    CHECK(untouched == sentinel);
    cb.delete_key = NULL;
    cb.compare_set = NULL;
    cb.num_keys = NULL;
    cb.destroy = NULL;
    cb.get = get_without_value;
    EXPECT_OK(tc_store_new_callbacks(&cb, &s));
    EXPECT_RC(tc_store_delete(s, "k", &deleted), TC_ERR_UNSUPPORTED, "delete_key");
    EXPECT_RC(tc_store_num_keys(s, &n), TC_ERR_UNSUPPORTED, "num_keys");
    EXPECT_RC(tc_store_compare_set(s, "k", NULL, 0, "a", 1, &cur, &len), TC_ERR_UNSUPPORTED, "compare_set");
    EXPECT_RC(tc_store_get(s, "k", buf, sizeof buf, &len), TC_ERR_REMOTE, "without answering a value");
    tc_store_free(s);
    CHECK(g.destroyed == 0); /* destroy was NULL */

    EXPECT_RC(tc_store_reply_value(NULL, "v", 1), TC_ERR_NULL_ARGUMENT, "'reply'");
    EXPECT_RC(tc_store_reply_error(NULL, "m"), TC_ERR_NULL_ARGUMENT, "'reply'");
    tc_store_free(file);
    unlink(path);
}

/* One rank of a job whose store is a callback store over the shared file. */
static int rank_main(const char *path, int rank, int size) {
    tc_store_t *file = NULL;
    if (tc_store_file_new(path, size, &file) != TC_SUCCESS) return 3;
    forward_t f = {file, 0, 0, 0};
    tc_store_callbacks_t cb = forwarding(&f);
    tc_store_t *s = NULL;
    EXPECT_OK(tc_store_new_callbacks(&cb, &s));
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = "callbacks";
    o.rank = rank;
    o.world_size = size;
    o.store = s;
    o.abort_on_error = 0;
    o.timeout_ms = 20000;
    tc_comm_t *comm = NULL;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &comm));
    tc_store_free(s);
    if (comm) {
        double x[3] = {rank, 1, 2 * rank};
        EXPECT_OK(tc_all_reduce(comm, x, 3, TC_FLOAT64, (tc_reduce_op_t)TC_REDUCE_OP(TC_SUM), NULL, NULL));
        double s0 = size * (size - 1) / 2.0;
        CHECK(x[0] == s0 && x[1] == size && x[2] == 2 * s0);
        EXPECT_OK(tc_comm_finalize(comm));
        tc_comm_destroy(comm);
    }
    CHECK(f.destroyed == 1 && f.calls > 0);
    tc_store_free(file);
    return capi_failures ? 1 : 0;
}

static void job(int size) {
    char path[32];
    capi_run_ranks("test_store_callbacks", size, rank_main, path);
}

int main(void) {
    one_process();
    if (getenv("TC_UNDER_VALGRIND") == NULL)
        for (int size = 2; size <= 4; size++) job(size);
    else
        fprintf(stderr, "test_store_callbacks: multi-process part SKIPPED under valgrind (forked ranks)\n");
    CAPI_DONE("test_store_callbacks");
}
