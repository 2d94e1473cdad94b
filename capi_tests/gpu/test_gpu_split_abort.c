/* tc_comm_abort during a blocking split that cannot complete, two ranks:
   rank 1 never calls the split, so rank 0's ncclCommSplit (a blocking
   parent: the call itself waits for every rank) hangs inside NCCL; another
   thread of rank 0 aborts the parent after 2 s, which NCCL allows in order
   to unblock such a call. The split must then fail (not hang, not make a
   comm) and the parent must stay aborted. A guard thread ends the process
   with a failed result line if the split is still blocked 60 s later.
   Rank 1 waits until rank 0 is done, then aborts its own comm. Prints "N
   passed, N failed" on rank 0. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include "scenario.h"

static tc_comm_t *comm;
static volatile int split_done;

static void *aborter(void *arg) {
    (void)arg;
    sleep(2);
    expect(tc_comm_abort(comm) == TC_SUCCESS, "tc_comm_abort from another thread during the split");
    for (int i = 0; i < 60 && !split_done; i++) sleep(1);
    if (!split_done) {
        fprintf(stderr, "FAIL the split was still blocked 60 s after tc_comm_abort\n");
        printf("%d passed, %d failed\n", passed, failed + 1);
        fflush(stdout);
        _exit(1);
    }
    return NULL;
}

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    comm = scenario_comm("gpu_split_abort");
    int R, N;
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    if (N != 2) { fprintf(stderr, "run with 2 ranks\n"); return 1; }
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    void *d = dalloc(4096);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    tc_result_t rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
    CU(cuStreamSynchronize(stream));
    expect(rc == TC_SUCCESS, "warm-up all_reduce");
    if (R == 0) {
        pthread_t t;
        pthread_create(&t, NULL, aborter, NULL);
        int ranks[2] = {0, 1};
        tc_comm_t *child = NULL;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = tc_comm_split(comm, ranks, 2, "gpu_split_abort_child", NULL, &child);
        double secs = since(&t0);
        split_done = 1;
        printf("rank 0: the split ended with %s after %.1f s: %s\n", tc_result_string(rc), secs, tc_last_error());
        expect(rc != TC_SUCCESS && child == NULL, "the split fails");
        expect(secs >= 1.5, "the split waited for the missing rank until the abort");
        pthread_join(t, NULL);
        rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
        expect(rc == TC_ERR_ABORTED, "the parent stays aborted");
    } else {
        sleep(8);
        expect(tc_comm_abort(comm) == TC_SUCCESS, "rank 1 aborts its own comm");
    }
    tc_comm_destroy(comm);
    dfree(d);
    CU(cuStreamDestroy(stream));
    printf("rank %d: %d passed, %d failed\n", R, passed, failed);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
