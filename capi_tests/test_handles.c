/* Misused handles are refused, never dereferenced: a double free or destroy,
   a call after free or destroy, a pointer to zeroed memory, a garbage
   pointer, and a handle of one type passed as another each give
   TC_ERR_INVALID_ARGUMENT naming the expected type ("not a live tc_work_t"),
   for every handle type (comm, work, store, window, batch, local group); free and
   destroy functions leave such a handle alone and set tc_last_error. A
   just-freed work is still refused after many new works were made (its
   address is not handed out again at once). Threads creating, querying and
   freeing works at once see no false refusal. Nothing here reads invalid
   memory, so it runs under valgrind as it is. */
#include "capi_util.h"
#include <pthread.h>
#include <stdint.h>

#define NOT_LIVE(type) "handle is not a live " type

/* Expects a free/destroy call to have refused `name`'s handle. */
#define EXPECT_REFUSED_FREE(call, func, type)                                             \
    do {                                                                                 \
        call;                                                                            \
        if (strstr(tc_last_error(), func ": argument") == NULL ||                         \
            strstr(tc_last_error(), NOT_LIVE(type)) == NULL) {                           \
            fprintf(stderr, "%s:%d: %s: last error \"%s\" is not a refusal of a %s\n",    \
                    __FILE__, __LINE__, #call, tc_last_error(), type);                   \
            capi_failures++;                                                             \
        }                                                                                \
        tc_dtype_size(TC_FLOAT32, NULL); /* replaces the last error */                   \
    } while (0)

static tc_comm_t *shared_comm;

static void *work_churn(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) {
        tc_op_options_t async = TC_OP_OPTIONS_INIT;
        async.async_op = 1;
        tc_work_t *w = NULL;
        EXPECT_OK(tc_barrier(shared_comm, &async, &w));
        int32_t status = -1;
        EXPECT_OK(tc_work_status(w, &status));
        EXPECT_OK(tc_work_wait(w, NULL));
        tc_work_free(w);
    }
    return NULL;
}

static void garbage_and_zeroed(tc_comm_t *comm) {
    static unsigned char zeros[512];
    int rank = -1, done = -1;
    tc_comm_t *zero_comm = (tc_comm_t *)(void *)zeros;
    tc_comm_t *wild_comm = (tc_comm_t *)(uintptr_t)0x5a5a5a50;
    tc_work_t *wild_work = (tc_work_t *)(uintptr_t)0xdeadbeef0ull;
    EXPECT_RC(tc_comm_get_rank(zero_comm, &rank), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_comm_t"));
    EXPECT_RC(tc_comm_get_rank(wild_comm, &rank), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_comm_t"));
    EXPECT_RC(tc_barrier(wild_comm, NULL, NULL), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_comm_t"));
    EXPECT_RC(tc_work_is_completed(wild_work, &done), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_work_t"));
    EXPECT_RC(tc_work_wait((tc_work_t *)(void *)zeros, NULL), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_work_t"));
    /* one byte into a live handle is not that handle */
    EXPECT_RC(tc_comm_get_rank((tc_comm_t *)((char *)comm + 1), &rank), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_comm_t"));
    CHECK(rank == -1 && done == -1 && zeros[0] == 0);
    EXPECT_REFUSED_FREE(tc_comm_destroy(wild_comm), "tc_comm_destroy", "tc_comm_t");
    EXPECT_REFUSED_FREE(tc_work_free(wild_work), "tc_work_free", "tc_work_t");
    EXPECT_REFUSED_FREE(tc_store_free((tc_store_t *)(void *)zeros), "tc_store_free", "tc_store_t");
}

static void wrong_types(tc_comm_t *comm, tc_store_t *store) {
    tc_work_t *work = NULL;
    EXPECT_OK(tc_barrier(comm, NULL, &work));
    int rank = -1;
    uint16_t port = 0;
    EXPECT_RC(tc_work_wait((tc_work_t *)comm, NULL), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_work_t") " (it is a live tc_comm_t)");
    EXPECT_RC(tc_comm_get_rank((tc_comm_t *)work, &rank), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_comm_t") " (it is a live tc_work_t)");
    EXPECT_RC(tc_store_tcp_port((tc_store_t *)comm, &port), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_store_t"));
    EXPECT_RC(tc_window_deregister((tc_window_t *)store), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_window_t"));
    EXPECT_RC(tc_batch_send((tc_batch_t *)work, &rank, 1, TC_INT32, 0), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_batch_t"));
    /* a comm given as the store of new comm options */
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = "never-made";
    o.rank = 0;
    o.world_size = 1;
    o.store = (tc_store_t *)comm;
    tc_comm_t *never = NULL;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    EXPECT_RC(tc_comm_new("gloo", cpu, &o, &never), TC_ERR_INVALID_ARGUMENT, "'opts.store'");
    CHECK(never == NULL && rank == -1);
    /* freeing through the wrong function frees nothing */
    EXPECT_REFUSED_FREE(tc_work_free((tc_work_t *)comm), "tc_work_free", "tc_work_t");
    EXPECT_REFUSED_FREE(tc_comm_destroy((tc_comm_t *)work), "tc_comm_destroy", "tc_comm_t");
    EXPECT_OK(tc_comm_get_rank(comm, &rank));
    EXPECT_OK(tc_work_wait(work, NULL));
    tc_work_free(work);
}

/* Free every kind of handle, then use and free it again. */
static void use_after_free(tc_comm_t *comm, tc_store_t *store) {
    tc_work_t *work = NULL;
    EXPECT_OK(tc_barrier(comm, NULL, &work));
    tc_work_free(work);
    int done = -1;
    EXPECT_RC(tc_work_is_completed(work, &done), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_work_t"));
    EXPECT_RC(tc_work_wait_blocking(work), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_work_t"));
    EXPECT_REFUSED_FREE(tc_work_free(work), "tc_work_free", "tc_work_t");
    CHECK(done == -1);

    tc_batch_t *batch = NULL;
    EXPECT_OK(tc_batch_begin(comm, &batch));
    tc_batch_free(batch);
    EXPECT_RC(tc_batch_issue(batch, NULL, NULL), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_batch_t"));
    EXPECT_REFUSED_FREE(tc_batch_free(batch), "tc_batch_free", "tc_batch_t");

    tc_window_t *win = NULL;
    EXPECT_OK(tc_window_new(comm, &win));
    tc_window_free(win);
    EXPECT_RC(tc_window_deregister(win), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_window_t"));
    EXPECT_REFUSED_FREE(tc_window_free(win), "tc_window_free", "tc_window_t");

    tc_store_t *prefix = NULL;
    EXPECT_OK(tc_store_prefix_new(store, "p", &prefix));
    tc_store_free(prefix);
    EXPECT_RC(tc_store_set(prefix, "k", "v", 1), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_store_t"));
    EXPECT_REFUSED_FREE(tc_store_free(prefix), "tc_store_free", "tc_store_t");
}

/* A work freed twice with many works made in between: the second free is
   refused and frees none of them. */
static void double_free_after_reuse(tc_comm_t *comm) {
    enum { N = 100 };
    tc_work_t *first = NULL, *later[N];
    EXPECT_OK(tc_barrier(comm, NULL, &first));
    tc_work_free(first);
    for (int i = 0; i < N; i++) EXPECT_OK(tc_barrier(comm, NULL, &later[i]));
    EXPECT_REFUSED_FREE(tc_work_free(first), "tc_work_free", "tc_work_t");
    for (int i = 0; i < N; i++) {
        int32_t status = -1;
        EXPECT_OK(tc_work_status(later[i], &status));
        CHECK(status == TC_WORK_COMPLETED);
        tc_work_free(later[i]);
    }
}

/* Calls on a destroyed comm, a second destroy, and its work outliving it. */
static void after_destroy(tc_store_t *store) {
    tc_comm_t *comm = capi_one_rank_comm("handles-destroyed", store);
    if (comm == NULL) return;
    tc_work_t *work = NULL;
    EXPECT_OK(tc_barrier(comm, NULL, &work));
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    int rank = -1;
    float x = 1;
    EXPECT_RC(tc_comm_get_rank(comm, &rank), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_comm_t"));
    EXPECT_RC(tc_all_reduce(comm, &x, 1, TC_FLOAT32, (tc_reduce_op_t)TC_REDUCE_OP(TC_SUM), NULL, NULL),
              TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_comm_t"));
    EXPECT_RC(tc_comm_finalize(comm), TC_ERR_INVALID_ARGUMENT, NOT_LIVE("tc_comm_t"));
    EXPECT_REFUSED_FREE(tc_comm_destroy(comm), "tc_comm_destroy", "tc_comm_t");
    CHECK(rank == -1);
    EXPECT_OK(tc_work_wait(work, NULL)); /* a work outlives its comm's handle */
    tc_work_free(work);
}

/* A device group (CPU members: no driver needed) misused like the others. */
static void local_group(tc_comm_t *comm) {
    tc_device_t cpus[2] = {{TC_DEVICE_CPU, 0}, {TC_DEVICE_CPU, 0}};
    tc_local_t *g = NULL;
    EXPECT_OK(tc_local_new(cpus, 2, NULL, &g));
    float src = 1.0f, a = 0.0f, b = 0.0f;
    void *dsts[2] = {&a, &b};
    int rank = -1;
    EXPECT_RC(tc_local_broadcast((tc_local_t *)comm, &src, 0, dsts, 1, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_local_t") " (it is a live tc_comm_t)");
    EXPECT_RC(tc_comm_get_rank((tc_comm_t *)g, &rank), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_comm_t") " (it is a live tc_local_t)");
    EXPECT_REFUSED_FREE(tc_local_free((tc_local_t *)comm), "tc_local_free", "tc_local_t");
    EXPECT_OK(tc_comm_get_rank(comm, &rank));
    EXPECT_OK(tc_local_broadcast(g, &src, 0, dsts, 1, TC_FLOAT32, NULL));
    CHECK(a == 1.0f && b == 1.0f);
    tc_local_free(g);
    a = b = 0.0f;
    EXPECT_RC(tc_local_broadcast(g, &src, 0, dsts, 1, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT,
              NOT_LIVE("tc_local_t"));
    EXPECT_REFUSED_FREE(tc_local_free(g), "tc_local_free", "tc_local_t");
    CHECK(a == 0.0f && b == 0.0f);
}

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *comm = capi_one_rank_comm("handles", store);
    if (comm == NULL) CAPI_DONE("test_handles");

    garbage_and_zeroed(comm);
    wrong_types(comm, store);
    use_after_free(comm, store);
    double_free_after_reuse(comm);
    after_destroy(store);
    local_group(comm);

    shared_comm = comm;
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, work_churn, NULL);
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);

    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    tc_store_free(store);
    EXPECT_REFUSED_FREE(tc_store_free(store), "tc_store_free", "tc_store_t");
    unlink(path);
    CAPI_DONE("test_handles");
}
