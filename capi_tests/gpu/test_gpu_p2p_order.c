/* Ungrouped point-to-point in opposite orders, two ranks: each rank sends
   32 MiB to the other and only then receives. A send that large cannot
   complete before its receiver arrives (it is beyond what NCCL's connection
   buffers hold), so with real NCCL, as with the simulated one, both sends
   wait for receives that are queued behind them: a deadlock, which the
   library must turn into an error at the operations' 3 s timeout (the comm
   is then aborted: later calls fail, finalize reports it). The exchange is
   made once as a batch first: NCCL connects a pair of ranks on their first
   exchange, on the calling thread, and a first exchange in opposite orders
   deadlocks there, inside ncclRecv, where no timeout can reach it (seen on
   an H200 with NCCL 2.28.9: both ranks in recvConnect, their proxies in
   accept; docs/gpu-testing.md). Then a fresh comm does the same exchange
   as one batch (grouped), which completes. Prints "N passed, N failed" on
   rank 0. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>
#include "scenario.h"

#define BYTES (32u << 20)

static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_t *comm = scenario_comm("gpu_p2p_order");
    int R, N;
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    if (N != 2) { fprintf(stderr, "run with 2 ranks\n"); return 1; }
    void *out = dalloc(BYTES), *in = dalloc(BYTES);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    o.async_op = 1;
    o.timeout_ms = 3000;
    tc_work_t *ws = NULL, *wr = NULL;
    tc_batch_t *connect = NULL;
    tc_result_t rc = tc_batch_begin(comm, &connect);
    if (rc == TC_SUCCESS) rc = tc_batch_send(connect, out, BYTES, TC_UINT8, 1 - R);
    if (rc == TC_SUCCESS) rc = tc_batch_recv(connect, in, BYTES, TC_UINT8, 1 - R);
    if (rc == TC_SUCCESS) rc = tc_batch_issue(connect, &o, &ws);
    if (rc == TC_SUCCESS) rc = tc_work_wait_blocking(ws);
    tc_work_free(ws);
    ws = NULL;
    tc_batch_free(connect);
    expect(rc == TC_SUCCESS, "a first exchange as a batch (connects the pair)");
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tc_result_t rs = tc_send(comm, out, BYTES, TC_UINT8, 1 - R, &o, &ws);
    tc_result_t rr = tc_recv(comm, in, BYTES, TC_UINT8, 1 - R, &o, &wr);
    expect(rs == TC_SUCCESS && rr == TC_SUCCESS, "issue of send, then receive");
    rs = rs == TC_SUCCESS ? tc_work_wait_blocking(ws) : rs;
    rr = rr == TC_SUCCESS ? tc_work_wait_blocking(wr) : rr;
    double secs = since(&t0);
    printf("rank %d: send then receive ended with %s / %s after %.1f s: %s\n", R, tc_result_string(rs), tc_result_string(rr), secs,
           tc_last_error());
    expect(rs != TC_SUCCESS, "the send does not complete (its receiver waits behind the peer's send)");
    expect(rs == TC_ERR_TIMEOUT || rs == TC_ERR_ABORTED, "the deadlock ends as a timeout");
    expect(secs < 30, "within 30 s");
    tc_work_free(ws);
    tc_work_free(wr);
    o.async_op = 0;
    expect(tc_send(comm, out, 16, TC_UINT8, 1 - R, &o, NULL) == TC_ERR_ABORTED, "the comm is aborted afterwards");
    expect(tc_comm_finalize(comm) != TC_SUCCESS, "finalize reports the failure");
    tc_comm_destroy(comm);

    /* the same exchange as one batch: NCCL runs a group's sends and
       receives together, so it completes */
    comm = scenario_comm("gpu_p2p_order_batch");
    tc_batch_t *b = NULL;
    rc = tc_batch_begin(comm, &b);
    if (rc == TC_SUCCESS) rc = tc_batch_send(b, out, BYTES, TC_UINT8, 1 - R);
    if (rc == TC_SUCCESS) rc = tc_batch_recv(b, in, BYTES, TC_UINT8, 1 - R);
    if (rc == TC_SUCCESS) rc = tc_batch_issue(b, &o, NULL);
    CU(cuStreamSynchronize(stream));
    tc_batch_free(b);
    expect(rc == TC_SUCCESS, "the same exchange as a batch completes");
    expect(tc_comm_finalize(comm) == TC_SUCCESS, "finalize after the batch");
    tc_comm_destroy(comm);
    dfree(out);
    dfree(in);
    CU(cuStreamDestroy(stream));
    printf("rank %d: %d passed, %d failed\n", R, passed, failed);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
