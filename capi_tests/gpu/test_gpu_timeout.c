/* Timeout and abort on the nccl backend, two ranks: rank 1 never joins an
   all_reduce, so rank 0's operation must time out (TC_ERR_TIMEOUT from
   tc_work_wait_blocking), the comm must then be aborted (later calls
   TC_ERR_ABORTED, tc_comm_get_async_error non-zero) and finalize must
   report the failure. Rank 1 aborts its own comm explicitly and checks that
   later calls fail. Prints "N passed, N failed" on rank 0. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>
#include "scenario.h"

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_t *comm = scenario_comm("gpu_timeout");
    tc_result_t rc;
    int R, N;
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    if (N != 2) { fprintf(stderr, "run with 2 ranks\n"); return 1; }
    void *d = dalloc(1 << 20);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    /* One successful operation first, so the connection exists. */
    rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
    CU(cuStreamSynchronize(stream));
    expect(rc == TC_SUCCESS, "warm-up all_reduce");

    if (R == 0) {
        o.async_op = 1;
        o.timeout_ms = 2000; /* per-op timeout, counted from the op's start on the device */
        tc_work_t *w = NULL;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, &w);
        expect(rc == TC_SUCCESS, "issue of the all_reduce that will time out");
        int st = -1;
        rc = tc_work_status(w, &st);
        expect(rc == TC_SUCCESS && (st == TC_WORK_NOT_STARTED || st == TC_WORK_IN_PROGRESS), "status while pending");
        rc = tc_work_wait_blocking(w);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("rank 0: wait_blocking returned %s after %.1f s: %s\n", tc_result_string(rc), secs, tc_last_error());
        expect(rc == TC_ERR_TIMEOUT || rc == TC_ERR_ABORTED, "wait_blocking fails with a timeout");
        expect(secs >= 1.5 && secs < 30, "timeout fired near its 2 s");
        rc = tc_work_status(w, &st);
        expect(rc == TC_SUCCESS && (st == TC_WORK_TIMED_OUT || st == TC_WORK_ERROR), "status timed out");
        tc_work_free(w);
        expect(tc_comm_get_async_error(comm) != TC_SUCCESS, "comm reports the failure");
        o.async_op = 0;
        rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
        expect(rc == TC_ERR_ABORTED, "later operations fail with TC_ERR_ABORTED");
        expect(tc_comm_finalize(comm) != TC_SUCCESS, "finalize reports the failure");
    } else {
        sleep(6); /* never join rank 0's second all_reduce */
        expect(tc_comm_abort(comm) == TC_SUCCESS, "explicit abort");
        rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
        expect(rc == TC_ERR_ABORTED, "operation after abort fails with TC_ERR_ABORTED");
    }
    tc_comm_destroy(comm);
    dfree(d);
    printf("rank %d: %d passed, %d failed\n", R, passed, failed);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
