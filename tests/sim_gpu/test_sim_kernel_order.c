/* Two comms on one device used in different orders on two ranks, on the
   simulated driver and NCCL (TC_SIM_NCCL_MAX_KERNELS=1, its default: NCCL
   does not promise that kernels of two comms are resident together, and
   on hardware this order can deadlock). First both ranks all-reduce on A
   then B (same order: completes); then rank 0 issues A then B and rank 1
   B then A, each on its own stream with a 3 s timeout: each rank's first
   kernel holds the device while waiting for the peer's kernel of the same
   comm, which waits for the device. The library must turn this into
   errors at the timeout (not a hang): both ranks are held until then, and
   whatever fails fails as a timeout (a rank may complete once the other's
   comm was aborted). Prints "N passed, N failed" on
   rank 0. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include "scenario.h"

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CUstream s[2];
    CU(cuStreamCreate(&s[0], CU_STREAM_NON_BLOCKING));
    CU(cuStreamCreate(&s[1], CU_STREAM_NON_BLOCKING));
    tc_comm_t *c[2] = {scenario_comm("sim_order_a"), scenario_comm("sim_order_b")};
    int R, N;
    tc_comm_get_rank(c[0], &R);
    tc_comm_get_size(c[0], &N);
    if (N != 2) { fprintf(stderr, "run with 2 ranks\n"); return 1; }
    void *d[2] = {dalloc(4096), dalloc(4096)};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.async_op = 1;
    o.timeout_ms = 3000;
    tc_work_t *w[2] = {NULL, NULL};
    tc_result_t rc[2];
    for (int k = 0; k < 2; k++) {
        o.stream = s[k];
        rc[k] = tc_all_reduce(c[k], d[k], 1024, TC_FLOAT32, sum, &o, &w[k]);
    }
    for (int k = 0; k < 2; k++) {
        if (rc[k] == TC_SUCCESS) rc[k] = tc_work_wait_blocking(w[k]);
        tc_work_free(w[k]);
    }
    expect(rc[0] == TC_SUCCESS && rc[1] == TC_SUCCESS, "two comms used in the same order on both ranks");

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 2; i++) {
        int k = R == 0 ? i : 1 - i;
        o.stream = s[k];
        w[k] = NULL;
        rc[k] = tc_all_reduce(c[k], d[k], 1024, TC_FLOAT32, sum, &o, &w[k]);
        /* the first kernel reaches the device before the second is issued */
        struct timespec pause = {0, 200000000};
        nanosleep(&pause, NULL);
    }
    for (int k = 0; k < 2; k++) {
        if (rc[k] == TC_SUCCESS) rc[k] = tc_work_wait_blocking(w[k]);
        tc_work_free(w[k]);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("rank %d: opposite orders ended with %s / %s after %.1f s\n", R, tc_result_string(rc[0]), tc_result_string(rc[1]), secs);
    /* the deadlock holds both ranks until a timeout fires somewhere; the
       rank whose comm was not aborted may then complete both operations */
    expect(secs > 2.5, "opposite orders deadlock until the 3 s timeout (a device runs one NCCL kernel at a time)");
    for (int k = 0; k < 2; k++)
        expect(rc[k] == TC_SUCCESS || rc[k] == TC_ERR_TIMEOUT || rc[k] == TC_ERR_ABORTED || rc[k] == TC_ERR_REMOTE,
               "the deadlock ends as a timeout");
    expect(secs < 40, "within 40 s");
    for (int k = 0; k < 2; k++) {
        tc_comm_destroy(c[k]);
        dfree(d[k]);
        CU(cuStreamDestroy(s[k]));
    }
    printf("rank %d: %d passed, %d failed\n", R, passed, failed);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
