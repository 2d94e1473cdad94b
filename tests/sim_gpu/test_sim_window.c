/* Windows on the nccl backend, simulated driver and NCCL: tc_window_new on an
   nccl comm answers TC_ERR_UNSUPPORTED naming the loaded NCCL's version, the
   version the host RMA API needs (2.29.0) and the calls it lacks, and writes
   nothing to *window; the comm stays usable (an all_reduce after it works).
   TC_SIM_EXPECT_NCCL is the version string the loaded simulated NCCL reports.
   Prints "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include "scenario.h"

static int has(const char *needle) { return strstr(tc_last_error(), needle) != NULL; }

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *version = getenv("TC_SIM_EXPECT_NCCL");
    if (version == NULL) { fprintf(stderr, "set TC_SIM_EXPECT_NCCL\n"); return 1; }
    gpu_setup();
    tc_comm_t *comm = scenario_comm("sim_window");
    tc_window_t *win = (tc_window_t *)&win;
    tc_result_t rc = tc_window_new(comm, &win);
    printf("tc_window_new on nccl: %s: %s\n", tc_result_string(rc), tc_last_error());
    expect(rc == TC_ERR_UNSUPPORTED, "tc_window_new on nccl is TC_ERR_UNSUPPORTED");
    expect(has(version), "the message names the loaded NCCL's version");
    expect(has("2.29.0") && has("ncclPutSignal"), "the message names the version and calls needed");
    expect(has("tc_window_new") && has("nccl comm 'sim_window'"), "the message names the call and the comm");
    expect(win == (tc_window_t *)&win, "*window untouched on failure");
    void *d = dalloc(1024);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    expect(tc_all_reduce(comm, d, 256, TC_FLOAT32, sum, NULL, NULL) == TC_SUCCESS, "the comm still works");
    expect(tc_comm_finalize(comm) == TC_SUCCESS, "finalize");
    tc_comm_destroy(comm);
    dfree(d);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
