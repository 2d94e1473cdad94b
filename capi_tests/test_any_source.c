/* Receives from any source (tc_recv with TC_ANY_SOURCE, tc_work_source)
   with real processes, at 2, 3 and 4 ranks (one forked job per size over a
   FileStore):
   - every other rank sends its rank to rank 0 with tag 4; rank 0 takes each
     with TC_ANY_SOURCE, blocking (async_op 0, asking for the work) or not,
     and tc_work_source names the sender of the payload, each sender once;
   - a tag-7 receive from any source never takes a tag-3 message sent first;
   - a size mismatch fails with TC_ERR_INVALID_USAGE naming the sender, and
     tc_work_source then refuses the failed work naming its state;
   - tc_work_source on a receive naming its peer reports that peer; on a
     send, NULL or a receive not completed yet it fails naming why;
   - TC_ANY_SOURCE in a batch: TC_ERR_UNSUPPORTED naming batch[0].peer; on a
     send: TC_ERR_INVALID_ARGUMENT; on a comm of one rank: refused.
   Under valgrind (TC_UNDER_VALGRIND) the multi-rank job is skipped as in
   test_parity.c (gloo's rendezvous padding); the one-rank checks run. */
#include "capi_util.h"
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

static const tc_device_t cpu = {TC_DEVICE_CPU, 0};

static tc_op_options_t tagged(uint32_t tag, int async_op) {
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.tag = tag;
    o.async_op = async_op;
    return o;
}

/* Rank 0: a receive from any source of `count` int32 with `tag`; the sender
   in *from (-1 when it failed); its result. */
static tc_result_t recv_any(tc_comm_t *comm, int32_t *buf, size_t count, uint32_t tag, int async_op,
                            int32_t *from) {
    tc_op_options_t o = tagged(tag, async_op);
    tc_work_t *w = NULL;
    *from = -1;
    tc_result_t rc = tc_recv(comm, buf, count, TC_INT32, TC_ANY_SOURCE, &o, &w);
    if (rc != TC_SUCCESS) return rc;
    rc = tc_work_wait(w, NULL);
    if (rc == TC_SUCCESS) {
        EXPECT_OK(tc_work_source(w, from));
    } else {
        int32_t untouched = -5;
        EXPECT_RC(tc_work_source(w, &untouched), TC_ERR_INVALID_USAGE, "failed");
        CHECK(untouched == -5);
    }
    tc_work_free(w);
    return rc;
}

static void send_tagged(tc_comm_t *comm, int32_t *buf, size_t count, int peer, uint32_t tag) {
    tc_op_options_t o = tagged(tag, 0);
    EXPECT_OK(tc_send(comm, buf, count, TC_INT32, peer, &o, NULL));
}

static void exchanges(tc_comm_t *comm, int rank, int size) {
    if (rank != 0) {
        int32_t mine = rank;
        send_tagged(comm, &mine, 1, 0, 4);
        int32_t three = 300 + rank, seven = 700 + rank;
        send_tagged(comm, &three, 1, 0, 3);
        send_tagged(comm, &seven, 1, 0, 7);
        if (rank == 1) {
            int32_t wrong[3] = {1, 1, 1};
            send_tagged(comm, wrong, 3, 0, 9);
        }
        int32_t named = 42;
        send_tagged(comm, &named, 1, 0, 0);
        return;
    }
    int seen[4] = {0, 0, 0, 0};
    for (int k = 1; k < size; k++) {
        int32_t v = -1, from = -1;
        EXPECT_OK(recv_any(comm, &v, 1, 4, k % 2, &from));
        CHECK(from >= 1 && from < size && v == from);
        if (from >= 1 && from < size) seen[from]++;
    }
    for (int q = 1; q < size; q++) CHECK(seen[q] == 1);
    for (int k = 1; k < size; k++) {
        int32_t v = -1, from = -1;
        EXPECT_OK(recv_any(comm, &v, 1, 7, 1, &from));
        CHECK(v == 700 + from);
    }
    for (int k = 1; k < size; k++) {
        int32_t v = -1, from = -1;
        EXPECT_OK(recv_any(comm, &v, 1, 3, 0, &from));
        CHECK(v == 300 + from);
    }
    int32_t two[2], from = -1;
    EXPECT_RC(recv_any(comm, two, 2, 9, 0, &from), TC_ERR_INVALID_USAGE, "rank 1");
    CHECK(strstr(tc_last_error(), "3 int32") != NULL && strstr(tc_last_error(), "2 int32") != NULL);
    /* A receive naming its peer reports that peer. */
    for (int q = 1; q < size; q++) {
        int32_t v = 0, peer = -1;
        tc_work_t *w = NULL;
        tc_op_options_t o = TC_OP_OPTIONS_INIT;
        o.async_op = 1;
        EXPECT_OK(tc_recv(comm, &v, 1, TC_INT32, q, &o, &w));
        EXPECT_OK(tc_work_wait(w, NULL));
        EXPECT_OK(tc_work_source(w, &peer));
        CHECK(peer == q && v == 42);
        tc_work_free(w);
    }
}

/* Argument checks that need two ranks: a receive not completed yet, a
   send's work, a batch entry, NULL. */
static void bad_uses(tc_comm_t *comm, int rank) {
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.async_op = 1;
    int32_t v = 0, r = -5;
    tc_work_t *w = NULL;
    if (rank == 0) {
        /* Posted before rank 1 sends (it sleeps first). */
        EXPECT_OK(tc_recv(comm, &v, 1, TC_INT32, TC_ANY_SOURCE, &o, &w));
        int32_t status = -1;
        EXPECT_OK(tc_work_status(w, &status));
        if (status == TC_WORK_NOT_STARTED || status == TC_WORK_IN_PROGRESS) {
            tc_result_t rc = tc_work_source(w, &r);
            CHECK(rc == TC_ERR_INVALID_USAGE && r == -5);
            CHECK(strstr(tc_last_error(), "has not started") != NULL ||
                  strstr(tc_last_error(), "is in progress") != NULL);
        }
        EXPECT_RC(tc_work_source(w, NULL), TC_ERR_NULL_ARGUMENT, "'rank'");
        EXPECT_OK(tc_work_wait(w, NULL));
        EXPECT_OK(tc_work_source(w, &r));
        CHECK(r == 1 && v == 11);
        tc_work_free(w);
    } else if (rank == 1) {
        struct timespec pause = {0, 300 * 1000 * 1000};
        nanosleep(&pause, NULL);
        v = 11;
        EXPECT_OK(tc_send(comm, &v, 1, TC_INT32, 0, &o, &w));
        EXPECT_OK(tc_work_wait(w, NULL));
        r = -5;
        EXPECT_RC(tc_work_source(w, &r), TC_ERR_INVALID_USAGE, "not a receive");
        CHECK(r == -5);
        tc_work_free(w);
    }
    EXPECT_RC(tc_work_source(NULL, &r), TC_ERR_NULL_ARGUMENT, "'work'");
    /* A send to TC_ANY_SOURCE names the argument. */
    EXPECT_RC(tc_send(comm, &v, 1, TC_INT32, TC_ANY_SOURCE, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'peer'");
    /* A batch does not take it (every rank's batch is refused alike). */
    tc_batch_t *b = NULL;
    EXPECT_OK(tc_batch_begin(comm, &b));
    EXPECT_OK(tc_batch_recv(b, &v, 1, TC_INT32, TC_ANY_SOURCE));
    EXPECT_RC(tc_batch_issue(b, NULL, NULL), TC_ERR_UNSUPPORTED, "batch[0].peer");
    tc_batch_free(b);
}

static int rank_main(const char *path, int rank, int size) {
    tc_store_t *store = NULL;
    EXPECT_OK(tc_store_file_new(path, size, &store));
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = "any-source";
    o.rank = rank;
    o.world_size = size;
    o.store = store;
    o.abort_on_error = 0;
    tc_comm_t *comm = NULL;
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &comm));
    if (comm == NULL) return 1;
    exchanges(comm, rank, size);
    bad_uses(comm, rank);
    EXPECT_OK(tc_barrier(comm, NULL, NULL));
    /* The comm remembers rank 0's failed (mismatched) receive. */
    if (rank == 0) {
        EXPECT_RC(tc_comm_finalize(comm), TC_ERR_INVALID_USAGE, "does not match");
    } else {
        EXPECT_OK(tc_comm_finalize(comm));
    }
    tc_comm_destroy(comm);
    tc_store_free(store);
    return capi_failures ? 1 : 0;
}

static void job(int size) {
    char path[32];
    capi_run_ranks("test_any_source", size, rank_main, path);
}

/* A comm of one rank refuses it: no other rank could ever send. */
static void one_rank(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *comm = capi_one_rank_comm("any-source-1", store);
    if (comm != NULL) {
        int32_t v = 0;
        tc_work_t *w = (tc_work_t *)&v;
        EXPECT_RC(tc_recv(comm, &v, 1, TC_INT32, TC_ANY_SOURCE, NULL, &w), TC_ERR_INVALID_USAGE, "TC_ANY_SOURCE");
        CHECK(w == (tc_work_t *)&v);
        tc_comm_destroy(comm);
    }
    tc_store_free(store);
    unlink(path);
}

int main(void) {
    one_rank();
    if (getenv("TC_UNDER_VALGRIND") != NULL) {
        fprintf(stderr, "test_any_source: multi-rank job SKIPPED under valgrind (see test_parity.c)\n");
        CAPI_DONE("test_any_source");
    }
    for (int size = 2; size <= 4; size++) job(size);
    CAPI_DONE("test_any_source");
}
