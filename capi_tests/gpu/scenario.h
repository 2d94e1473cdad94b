/* Helpers of the small nccl scenario tests (timeout and abort, a peer that
   exits, ...): pass/fail counters and a comm with abort-on-error off. */
#ifndef GPU_SCENARIO_H
#define GPU_SCENARIO_H

#include "gpu_util.h"

static int passed, failed;

static inline void expect(int ok, const char *what) {
    if (ok) passed++;
    else { failed++; fprintf(stderr, "FAIL %s (%s)\n", what, tc_last_error()); }
}

/* A nccl comm named `name` on device -1 (local rank % devices), failing calls
   rather than the process, with a 60 s timeout; on failure prints the result
   line and exits. */
static inline tc_comm_t *scenario_comm(const char *name) {
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = name;
    co.abort_on_error = 0;
    co.timeout_ms = 60000;
    tc_device_t dev = {TC_DEVICE_CUDA, -1};
    tc_comm_t *comm = NULL;
    if (tc_comm_new("nccl", dev, &co, &comm) != TC_SUCCESS) {
        fprintf(stderr, "tc_comm_new: %s\n", tc_last_error());
        printf("0 passed, 1 failed\n");
        exit(1);
    }
    return comm;
}

/* The sum of every rank's `v` over `comm`: 64 float32 on the device at
   `d`, all-reduced (SUM) on `o->stream` and read back (-1: the call
   failed; -2: the elements differ). */
static inline double scenario_all_reduce_of(tc_comm_t *comm, void *d, float v, tc_op_options_t *o) {
    float h[64], back[64];
    for (int i = 0; i < 64; i++) h[i] = v;
    h2d(d, h, sizeof h);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    if (tc_all_reduce(comm, d, 64, TC_FLOAT32, sum, o, NULL) != TC_SUCCESS) return -1;
    CU(cuStreamSynchronize(o->stream));
    d2h(back, d, sizeof back);
    for (int i = 1; i < 64; i++)
        if (back[i] != back[0]) return -2;
    return back[0];
}

/* The two-rank all_reduce scenarios (a peer that dies, a refused call): a
   comm of exactly two ranks (exits otherwise), a device buffer of 1024
   float32, the sum, and options on a stream of their own. */
typedef struct {
    tc_comm_t *comm;
    int rank;
    void *buf;
    tc_reduce_op_t sum;
    tc_op_options_t opts;
} pair_scenario_t;

/* Line-buffered output, the device, the pair named `name`, and a warm-up
   all_reduce (a check of its own). */
static inline pair_scenario_t pair_scenario_start(const char *name) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    pair_scenario_t s;
    s.comm = scenario_comm(name);
    int n;
    tc_comm_get_rank(s.comm, &s.rank);
    tc_comm_get_size(s.comm, &n);
    if (n != 2) { fprintf(stderr, "run with 2 ranks\n"); exit(1); }
    s.buf = dalloc(4096);
    s.sum = (tc_reduce_op_t)TC_REDUCE_OP(TC_SUM);
    s.opts = (tc_op_options_t)TC_OP_OPTIONS_INIT;
    s.opts.stream = stream;
    tc_result_t rc = tc_all_reduce(s.comm, s.buf, 1024, TC_FLOAT32, s.sum, &s.opts, NULL);
    CU(cuStreamSynchronize(stream));
    expect(rc == TC_SUCCESS, "warm-up all_reduce");
    return s;
}

/* After the peer is lost: the comm says so, later operations fail and so
   does finalize. */
static inline void pair_scenario_expect_broken(pair_scenario_t *s) {
    expect(tc_comm_get_async_error(s->comm) != TC_SUCCESS, "comm reports the failure");
    s->opts.async_op = 0;
    tc_result_t rc = tc_all_reduce(s->comm, s->buf, 1024, TC_FLOAT32, s->sum, &s->opts, NULL);
    expect(rc == TC_ERR_ABORTED || rc == TC_ERR_REMOTE, "later operations fail");
    expect(tc_comm_finalize(s->comm) != TC_SUCCESS, "finalize reports the failure");
}

/* Frees the pair, prints the result line and gives main's exit status. */
static inline int pair_scenario_end(pair_scenario_t *s) {
    tc_comm_destroy(s->comm);
    dfree(s->buf);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

#endif
