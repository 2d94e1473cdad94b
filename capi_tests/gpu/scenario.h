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

#endif
