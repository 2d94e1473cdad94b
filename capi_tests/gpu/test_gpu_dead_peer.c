/* A peer process that dies, two ranks of the nccl backend. Rank 1 leaves
   after a first all_reduce without cleaning anything up (_exit); rank 0's
   next all_reduce (per-operation timeout 20 s) must then fail rather than
   hang: with a remote error (TC_ERR_REMOTE: NCCL noticed the closed
   connection and set its asynchronous error) or with the timeout
   (TC_ERR_TIMEOUT, or TC_ERR_ABORTED once the watchdog aborted the comm),
   whichever comes first on this machine. The comm must then be broken
   (later calls fail) and finalize must report it. Prints "N passed, N
   failed" on rank 0. On the simulated NCCL the remote error is expected
   (TC_GPU_DEAD_PEER_REMOTE=1 demands it). */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>
#include "scenario.h"

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_t *comm = scenario_comm("gpu_dead_peer");
    int R, N;
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    if (N != 2) { fprintf(stderr, "run with 2 ranks\n"); return 1; }
    void *d = dalloc(4096);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    tc_result_t rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
    CU(cuStreamSynchronize(stream));
    expect(rc == TC_SUCCESS, "warm-up all_reduce");
    if (R == 1) _exit(0); /* gone, as a crashed process */

    o.async_op = 1;
    o.timeout_ms = 20000;
    tc_work_t *w = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, &w);
    expect(rc == TC_SUCCESS || rc == TC_ERR_REMOTE, "issue of the all_reduce whose peer is gone");
    if (rc == TC_SUCCESS) rc = tc_work_wait_blocking(w);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("rank 0: the all_reduce whose peer is gone ended with %s after %.1f s: %s\n", tc_result_string(rc), secs, tc_last_error());
    if (env_int("TC_GPU_DEAD_PEER_REMOTE", 0))
        expect(rc == TC_ERR_REMOTE && secs < 15, "TC_ERR_REMOTE before the 20 s timeout");
    else
        expect(rc == TC_ERR_REMOTE || rc == TC_ERR_TIMEOUT || rc == TC_ERR_ABORTED, "a remote error or the timeout, not a hang");
    expect(secs < 45, "ended within 45 s");
    tc_work_free(w);
    expect(tc_comm_get_async_error(comm) != TC_SUCCESS, "comm reports the failure");
    o.async_op = 0;
    rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
    expect(rc == TC_ERR_ABORTED || rc == TC_ERR_REMOTE, "later operations fail");
    expect(tc_comm_finalize(comm) != TC_SUCCESS, "finalize reports the failure");
    tc_comm_destroy(comm);
    dfree(d);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
