/* TORCHCOMM_NAN_CHECK=1 with CUDA memory, on the simulated driver and NCCL
   (run by `make sim-gpu-test` on 2 and 3 ranks; the environment variable is
   set by the caller): the nccl backend's inputs are copied to the host and
   checked there (after the operation's stream is synchronized), and the
   verdict is shared through device memory. A NaN on one rank fails the
   collective on every rank (TC_ERR_INVALID_ARGUMENT naming op, rank and
   element there, TC_ERR_REMOTE elsewhere) with no rank's data changed;
   clean f32/f16/bf16 data passes; post hooks of a device operation run once
   it is enqueued (completed = 0), and get the failure of a refused one.
   The same with CUDA buffers on a gloo comm (host staging). Prints
   "N passed, M failed" on every rank. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include "scenario.h"

typedef struct {
    int calls, last_status, last_completed;
} post_log_t;

static void post_hook(const tc_op_info_t *info, void *user_data) {
    post_log_t *log = user_data;
    log->calls++;
    log->last_status = info->status;
    log->last_completed = info->completed;
}

static int mentions(const char *needle) { return strstr(tc_last_error(), needle) != NULL; }

/* An all_reduce of 8 elements of `dt` (value rank + 1) with a NaN at
   element `index` on rank `bad` (-1: none); checks the outcome. */
static void nan_case(tc_comm_t *comm, CUstream stream, tc_dtype_t dt, int bad, int index, int R) {
    void *d = dalloc(8 * 8);
    unsigned char h[64];
    for (int i = 0; i < 8; i++) put(dt, h, (size_t)i, (double)(R + 1));
    if (R == bad) {
        uint16_t half_nan = dt == TC_FLOAT16 ? 0x7e00 : 0x7fc0;
        if (dt == TC_FLOAT32) ((float *)h)[index] = (float)NAN;
        else memcpy(h + 2 * index, &half_nan, 2);
    }
    h2d(d, h, 8 * dt_size(dt));
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    tc_result_t rc = tc_all_reduce(comm, d, 8, dt, (tc_reduce_op_t)TC_REDUCE_OP(TC_SUM), &o, NULL);
    CU(cuStreamSynchronize(stream));
    d2h(h, d, 8 * dt_size(dt));
    char what[128], rank_text[32], index_text[32];
    snprintf(rank_text, sizeof rank_text, "rank %d", bad);
    snprintf(index_text, sizeof index_text, "element %d", index);
    if (bad < 0) {
        snprintf(what, sizeof what, "clean %s all_reduce passes and sums", dt_name(dt));
        int N;
        tc_comm_get_size(comm, &N);
        expect(rc == TC_SUCCESS && get(dt, h, 7) == (double)(N * (N + 1) / 2), what);
        dfree(d);
        return;
    }
    tc_result_t want = R == bad ? TC_ERR_INVALID_ARGUMENT : TC_ERR_REMOTE;
    snprintf(what, sizeof what, "%s NaN at element %d on rank %d: %s naming op, rank and element", dt_name(dt), index, bad,
             tc_result_string(want));
    expect(rc == want && mentions("all_reduce") && mentions(rank_text) && mentions(index_text), what);
    snprintf(what, sizeof what, "%s NaN case: no rank's data changed", dt_name(dt));
    size_t other = index == 7 ? 6 : 7; /* an element that is not the NaN */
    expect(get(dt, h, 0) == (double)(R + 1) && get(dt, h, other) == (double)(R + 1), what);
    dfree(d);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_t *comm = scenario_comm("sim_nan_check");
    int R, N;
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    post_log_t log = {0, -1, -1};
    expect(tc_comm_add_post_hook(comm, post_hook, &log, NULL) == TC_SUCCESS, "add a post hook");

    nan_case(comm, stream, TC_FLOAT32, -1, 0, R);
    expect(log.calls == 1 && log.last_status == TC_SUCCESS && log.last_completed == 0,
           "post hook of an enqueued device operation: success, completed = 0");
    nan_case(comm, stream, TC_FLOAT32, N - 1, 5, R);
    expect(log.calls == 2 && log.last_status == (R == N - 1 ? TC_ERR_INVALID_ARGUMENT : TC_ERR_REMOTE) &&
               log.last_completed == 1,
           "post hook of the refused operation gets its failure");
    nan_case(comm, stream, TC_BFLOAT16, 0, 2, R);
    nan_case(comm, stream, TC_FLOAT16, -1, 0, R);
    nan_case(comm, stream, TC_FLOAT16, N - 1, 7, R);
    nan_case(comm, stream, TC_FLOAT32, -1, 0, R); /* still usable */
    expect(tc_comm_finalize(comm) == TC_SUCCESS, "finalize after refused operations");
    tc_comm_destroy(comm);

    /* CUDA buffers on a gloo comm: checked through the same host copy. */
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "sim_nan_check_gloo";
    co.abort_on_error = 0;
    co.timeout_ms = 60000;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_comm_t *gloo = NULL;
    expect(tc_comm_new("gloo", cpu, &co, &gloo) == TC_SUCCESS, "gloo comm");
    if (gloo) {
        nan_case(gloo, stream, TC_FLOAT32, -1, 0, R);
        nan_case(gloo, stream, TC_FLOAT32, 1, 4, R);
        expect(tc_comm_finalize(gloo) == TC_SUCCESS, "gloo finalize");
        tc_comm_destroy(gloo);
    }
    CU(cuStreamDestroy(stream));
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
