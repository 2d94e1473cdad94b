/* TorchComm 0.3 parity calls with real processes, at 2, 3 and 4 ranks (one
   forked job per size over a FileStore):
   - tc_comm_get_ranks: 0..n-1 on the world; a split's and a split-of-a-
     split's ranks in the world's numbering; the in/out count protocol;
   - tc_comm_get_backend_version names gloo;
   - tags: a batch whose tagged entries come in another order on each side,
     tc_send/tc_recv with opts.tag, and a version-1 tc_op_options_t whose
     bytes past its fields are garbage (its tag is 0, as before tags);
   - tc_gather_single to every root, and a persistent all-gather executed
     three times (the last in place), with per-size counts;
   - tc_comm_set_timeout / tc_comm_set_hints on a live two-rank child: a
     refused hint applies nothing (a slow send still arrives), an applied
     timeout fails the next slow receive with TC_ERR_TIMEOUT, an operation
     issued before the change keeps its deadline.
   Under valgrind (TC_UNDER_VALGRIND) the job is skipped as in
   test_comm_names.c (gloo's rendezvous padding). */
#include "capi_util.h"
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

static const tc_device_t cpu = {TC_DEVICE_CPU, 0};
/* The delay of a "slow" send: well beyond the short timeouts set below. */
enum { SLOW_MS = 1500, SHORT_MS = 300 };

static tc_comm_options_t options(const char *name, int rank, int size, tc_store_t *store) {
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = name;
    o.rank = rank;
    o.world_size = size;
    o.store = store;
    o.abort_on_error = 0;
    o.timeout_ms = 60000; /* a rank left waiting fails instead of hanging */
    return o;
}

static void close_comm(tc_comm_t *comm) {
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Checks tc_comm_get_ranks(comm) against `expected` (n entries). */
static void expect_ranks(tc_comm_t *comm, const int *expected, size_t n) {
    size_t count = 0;
    EXPECT_OK(tc_comm_get_ranks(comm, NULL, &count));
    CHECK(count == n);
    int got[8];
    for (int i = 0; i < 8; i++) got[i] = -9;
    count = n - 1;
    EXPECT_RC(tc_comm_get_ranks(comm, got, &count), TC_ERR_INVALID_ARGUMENT, "capacity");
    CHECK(count == n && got[0] == -9);
    count = 8;
    EXPECT_OK(tc_comm_get_ranks(comm, got, &count));
    CHECK(count == n);
    for (size_t i = 0; i < n; i++) {
        if (got[i] != expected[i]) {
            fprintf(stderr, "get_ranks[%zu] = %d, expected %d\n", i, got[i], expected[i]);
            capi_failures++;
        }
    }
    CHECK(got[n] == -9);
}

/* World 0..n-1; child = the world's ranks reversed; grandchild = the
   child's ranks 1 and 0, i.e. world ranks n-2 and n-1. */
static void ranks_through_splits(tc_comm_t *world, int rank, int size) {
    int ids[4], reversed[4];
    for (int i = 0; i < size; i++) ids[i] = i, reversed[i] = size - 1 - i;
    expect_ranks(world, ids, (size_t)size);
    tc_comm_t *child = NULL, *grandchild = NULL;
    EXPECT_OK(tc_comm_split(world, reversed, (size_t)size, "reversed", NULL, &child));
    if (child == NULL) return;
    expect_ranks(child, reversed, (size_t)size);
    int pair[2] = {1, 0}, child_rank = size - 1 - rank;
    EXPECT_OK(tc_comm_split(child, pair, child_rank < 2 ? 2 : 0, "grandchild", NULL, &grandchild));
    if (grandchild) {
        int expected[2] = {size - 2, size - 1};
        expect_ranks(grandchild, expected, 2);
        close_comm(grandchild);
    }
    close_comm(child);
}

static void backend_version(tc_comm_t *world) {
    const char *v = NULL;
    EXPECT_OK(tc_comm_get_backend_version(world, &v));
    CHECK(v != NULL && strncmp(v, "gloo ", 5) == 0 && strstr(v, "torchcomm ") != NULL);
}

/* Rank 1 of a two-rank child sends one float to rank 0 after `delay_ms`. */
static void slow_send(tc_comm_t *pair, int delay_ms) {
    float x = 42.0f;
    sleep_ms(delay_ms);
    (void)tc_send(pair, &x, 1, TC_FLOAT32, 0, NULL, NULL); /* fails once rank 0 gave up */
}

static float recv_one(tc_comm_t *pair, tc_result_t expected) {
    float x = 0.0f;
    EXPECT_RC(tc_recv(pair, &x, 1, TC_FLOAT32, 1, NULL, NULL), expected, (const char *)NULL);
    return x;
}

/* On child "hints" (ranks 0, 1): a refused hint list applies nothing; an
   applied timeout_ms hint makes the next slow receive time out. */
static void live_hints(tc_comm_t *world, int rank) {
    int pair_ranks[2] = {0, 1};
    tc_comm_t *pair = NULL;
    EXPECT_OK(tc_comm_split(world, pair_ranks, rank < 2 ? 2 : 0, "hints", NULL, &pair));
    if (pair == NULL) return;
    if (rank == 1) {
        slow_send(pair, SLOW_MS);
        slow_send(pair, SLOW_MS);
    } else {
        tc_hint_t refused[2] = {{"timeout_ms", "300"}, {"gloo.iface", "lo"}};
        EXPECT_RC(tc_comm_set_hints(pair, refused, 2), TC_ERR_UNSUPPORTED, "gloo.iface");
        tc_hint_t bad_value = {"abort_on_error", "yes"};
        EXPECT_RC(tc_comm_set_hints(pair, &bad_value, 1), TC_ERR_INVALID_ARGUMENT, "abort_on_error");
        CHECK(recv_one(pair, TC_SUCCESS) == 42.0f); /* still the 60 s timeout */
        tc_hint_t applied[2] = {{"abort_on_error", "0"}, {"timeout_ms", "300"}};
        EXPECT_OK(tc_comm_set_hints(pair, applied, 2));
        recv_one(pair, TC_ERR_TIMEOUT);
    }
    (void)tc_comm_finalize(pair); /* reports the timeout */
    tc_comm_destroy(pair);
}

/* On child "timeout" (ranks 0, 1): a receive issued before set_timeout
   keeps its (long) deadline; the next one gets the short timeout. */
static void live_timeout(tc_comm_t *world, int rank) {
    int pair_ranks[2] = {0, 1};
    tc_comm_t *pair = NULL;
    EXPECT_OK(tc_comm_split(world, pair_ranks, rank < 2 ? 2 : 0, "timeout", NULL, &pair));
    if (pair == NULL) return;
    if (rank == 1) {
        slow_send(pair, SLOW_MS);
        slow_send(pair, SLOW_MS);
    } else {
        float x = 0.0f;
        tc_op_options_t async = TC_OP_OPTIONS_INIT;
        async.async_op = 1;
        tc_work_t *w = NULL;
        EXPECT_OK(tc_recv(pair, &x, 1, TC_FLOAT32, 1, &async, &w));
        EXPECT_OK(tc_comm_set_timeout(pair, SHORT_MS));
        if (w) EXPECT_OK(tc_work_wait_blocking(w));
        tc_work_free(w);
        CHECK(x == 42.0f);
        recv_one(pair, TC_ERR_TIMEOUT);
        EXPECT_RC(tc_comm_set_timeout(pair, -5), TC_ERR_INVALID_ARGUMENT, "timeout_ms");
    }
    (void)tc_comm_finalize(pair);
    tc_comm_destroy(pair);
}

/* Ranks 0 and 1 of the world exchange tagged messages. */
static void tags(tc_comm_t *world, int rank) {
    if (rank > 1) return;
    int peer = 1 - rank;
    int32_t one[3] = {1, 1, 1}, two[5] = {2, 2, 2, 2, 2}, got1[3] = {0}, got2[5] = {0};
    tc_batch_t *b = NULL;
    EXPECT_OK(tc_batch_begin(world, &b));
    if (rank == 0) {
        EXPECT_OK(tc_batch_send_tagged(b, two, 5, TC_INT32, peer, 2));
        EXPECT_OK(tc_batch_send_tagged(b, one, 3, TC_INT32, peer, 1));
    } else {
        EXPECT_OK(tc_batch_recv_tagged(b, got1, 3, TC_INT32, peer, 1));
        EXPECT_OK(tc_batch_recv_tagged(b, got2, 5, TC_INT32, peer, 2));
    }
    EXPECT_OK(tc_batch_issue(b, NULL, NULL));
    tc_batch_free(b);
    if (rank == 1) CHECK(memcmp(got1, one, sizeof one) == 0 && memcmp(got2, two, sizeof two) == 0);

    tc_op_options_t tagged = TC_OP_OPTIONS_INIT;
    tagged.tag = 4;
    int32_t x = rank == 0 ? 44 : 0;
    if (rank == 0) EXPECT_OK(tc_send(world, &x, 1, TC_INT32, peer, &tagged, NULL));
    else EXPECT_OK(tc_recv(world, &x, 1, TC_INT32, peer, &tagged, NULL));
    CHECK(x == 44);

    /* A caller built against version 1: the library must not read `tag`. */
    tc_op_options_t v1 = TC_OP_OPTIONS_INIT;
    v1.version = 1;
    v1.tag = 0xdead;
    x = rank == 0 ? 55 : 0;
    if (rank == 0) EXPECT_OK(tc_send(world, &x, 1, TC_INT32, peer, &v1, NULL));
    else EXPECT_OK(tc_recv(world, &x, 1, TC_INT32, peer, NULL, NULL));
    CHECK(x == 55);
}

/* gather_single of `count` = size + 1 int32 to every root; then a
   persistent all-gather of the same count, executed three times. */
static void gathers(tc_comm_t *world, int rank, int size) {
    enum { MAXN = 4 * 5 };
    size_t count = (size_t)size + 1;
    int32_t in[5], out[MAXN];
    for (int root = 0; root < size; root++) {
        for (size_t i = 0; i < count; i++) in[i] = rank * 100 + (int32_t)i + root;
        for (int i = 0; i < MAXN; i++) out[i] = -1;
        EXPECT_OK(tc_gather_single(world, rank == root ? out : NULL, in, count, TC_INT32, root, NULL, NULL));
        for (size_t k = 0; k < count * (size_t)size; k++) {
            int32_t want = rank == root ? (int32_t)(k / count) * 100 + (int32_t)(k % count) + root : -1;
            if (out[k] != want) {
                fprintf(stderr, "gather_single root %d: out[%zu] = %d, expected %d\n", root, k, out[k], want);
                capi_failures++;
            }
        }
    }
    tc_all_gather_p_t *p = NULL;
    for (int i = 0; i < MAXN; i++) out[i] = -1;
    EXPECT_OK(tc_all_gather_p_init(world, out, count, TC_INT32, NULL, &p));
    if (p == NULL) return;
    for (int round = 0; round < 3; round++) {
        int32_t *src = in;
        if (round == 2) src = out + (size_t)rank * count; /* in place */
        for (size_t i = 0; i < count; i++) src[i] = rank * 100 + (int32_t)i + round;
        tc_work_t *w = NULL;
        tc_op_options_t async = TC_OP_OPTIONS_INIT;
        async.async_op = 1;
        EXPECT_OK(tc_all_gather_p_exec(p, src, &async, &w));
        if (w) EXPECT_OK(tc_work_wait_blocking(w));
        tc_work_free(w);
        for (size_t k = 0; k < count * (size_t)size; k++)
            CHECK(out[k] == (int32_t)(k / count) * 100 + (int32_t)(k % count) + round);
    }
    tc_all_gather_p_free(p);
}

static int rank_main(const char *path, int rank, int size) {
    tc_store_t *store = NULL;
    EXPECT_OK(tc_store_file_new(path, size, &store));
    tc_comm_options_t o = options("world", rank, size, store);
    tc_comm_t *world = NULL;
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &world));
    if (world == NULL) return 1;
    ranks_through_splits(world, rank, size);
    backend_version(world);
    tags(world, rank);
    gathers(world, rank, size);
    live_hints(world, rank);
    live_timeout(world, rank);
    close_comm(world);
    tc_store_free(store);
    return capi_failures ? 1 : 0;
}

static void job(int size) {
    char path[32];
    capi_run_ranks("test_parity", size, rank_main, path);
}

int main(void) {
    if (getenv("TC_UNDER_VALGRIND") != NULL) {
        fprintf(stderr, "test_parity: SKIPPED under valgrind (gloo's multi-rank rendezvous, see test_comm_names.c)\n");
        CAPI_DONE("test_parity");
    }
    for (int size = 2; size <= 4; size++) job(size);
    CAPI_DONE("test_parity");
}
