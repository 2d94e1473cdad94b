/* Timeout and abort of the nccl backend at world size 1, on the simulated
   driver and NCCL only (a test double scenario: the fake NCCL's
   TC_SIM_NCCL_HANG_CALL makes one collective wait like one whose peer never
   arrives). What the GPU suite's two-rank test_gpu_timeout checks on rank 0:
   a per-op timeout counted from the start on the device fires
   (TC_ERR_TIMEOUT from tc_work_wait_blocking, work status timed out), the
   comm is aborted (async error set, later calls TC_ERR_ABORTED, finalize
   reports it), and the hung kernel is released by the abort. Then a second
   comm is aborted explicitly while its collective hangs. Run with
   TC_SIM_NCCL_HANG_CALL=2,3 (the second and third collectives hang). */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include "scenario.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_t *comm = scenario_comm("sim_timeout");
    void *d = dalloc(4096);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    tc_result_t rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL); /* collective 1 */
    CU(cuStreamSynchronize(stream));
    expect(rc == TC_SUCCESS, "warm-up all_reduce");

    o.async_op = 1;
    o.timeout_ms = 500;
    tc_work_t *w = NULL;
    double t0 = now_s();
    rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, &w); /* collective 2: hangs */
    expect(rc == TC_SUCCESS, "issue of the all_reduce that will time out");
    int st = -1, done = -1;
    expect(tc_work_is_completed(w, &done) == TC_SUCCESS && done == 0, "not completed while its kernel hangs");
    expect(tc_work_status(w, &st) == TC_SUCCESS && (st == TC_WORK_NOT_STARTED || st == TC_WORK_IN_PROGRESS), "status while pending");
    rc = tc_work_wait_blocking(w);
    double secs = now_s() - t0;
    printf("wait_blocking returned %s after %.2f s: %s\n", tc_result_string(rc), secs, tc_last_error());
    expect(rc == TC_ERR_TIMEOUT || rc == TC_ERR_ABORTED, "wait_blocking fails with a timeout");
    expect(secs >= 0.45 && secs < 10, "timeout fired near its 0.5 s");
    expect(tc_work_status(w, &st) == TC_SUCCESS && (st == TC_WORK_TIMED_OUT || st == TC_WORK_ERROR), "status timed out");
    tc_work_free(w);
    expect(tc_comm_get_async_error(comm) != TC_SUCCESS, "comm reports the failure");
    o.async_op = 0;
    o.timeout_ms = 0;
    rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
    expect(rc == TC_ERR_ABORTED, "later operations fail with TC_ERR_ABORTED");
    expect(tc_comm_finalize(comm) != TC_SUCCESS, "finalize reports the failure");
    tc_comm_destroy(comm);
    /* the aborted comm's kernel no longer holds the stream */
    t0 = now_s();
    CU(cuStreamSynchronize(stream));
    expect(now_s() - t0 < 5, "the hung kernel ended with the abort");

    /* explicit abort while a collective is in flight; destroy returns */
    comm = scenario_comm("sim_timeout_abort");
    o.async_op = 1;
    w = NULL;
    rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, &w); /* collective 3: hangs */
    expect(rc == TC_SUCCESS, "issue before an explicit abort");
    expect(tc_work_is_completed(w, &done) == TC_SUCCESS && done == 0, "in flight before the abort");
    expect(tc_comm_abort(comm) == TC_SUCCESS, "explicit abort");
    rc = tc_work_wait_blocking(w);
    expect(rc == TC_ERR_ABORTED, "work of an aborted comm fails with TC_ERR_ABORTED");
    tc_work_free(w);
    rc = tc_all_reduce(comm, d, 1024, TC_FLOAT32, sum, &o, NULL);
    expect(rc == TC_ERR_ABORTED, "operation after abort fails with TC_ERR_ABORTED");
    tc_comm_destroy(comm);
    CU(cuStreamSynchronize(stream));
    dfree(d);
    CU(cuStreamDestroy(stream));
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
