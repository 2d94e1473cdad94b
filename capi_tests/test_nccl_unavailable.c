/* The nccl backend through the C API on a machine without a usable GPU
   stack: tc_comm_new("nccl", ...) answers TC_ERR_UNAVAILABLE with a message
   naming what was looked for, leaves *comm untouched, and the process goes
   on (no panic, no abort). Argument errors still come first. On a machine
   with a driver, a GPU and NCCL the comm is created and torn down instead. */
#include "capi_util.h"
#include <unistd.h>

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);

    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = "nccl_unavailable";
    o.rank = 0;
    o.world_size = 1;
    o.store = store;
    o.abort_on_error = 0;
    o.timeout_ms = 5000;

    /* A negative index other than -1 is the caller's mistake, whatever is installed. */
    tc_comm_t *comm = (tc_comm_t *)&o; /* sentinel: must stay untouched on failure */
    tc_device_t bad = {TC_DEVICE_CUDA, -2};
    EXPECT_RC(tc_comm_new("nccl", bad, &o, &comm), TC_ERR_INVALID_ARGUMENT, "device.index");
    CHECK(comm == (tc_comm_t *)&o);

    tc_device_t gpu = {TC_DEVICE_CUDA, -1};
    tc_result_t rc = tc_comm_new("nccl", gpu, &o, &comm);
    if (rc == TC_SUCCESS) {
        printf("test_nccl_unavailable: a GPU stack is present; comm created (nothing unavailable to test)\n");
        EXPECT_OK(tc_comm_finalize(comm));
        tc_comm_destroy(comm);
    } else {
        EXPECT_RC(rc, TC_ERR_UNAVAILABLE, "nccl backend is unavailable");
        CHECK(comm == (tc_comm_t *)&o);
        const char *msg = tc_last_error();
        CHECK(strstr(msg, "libcuda") != NULL || strstr(msg, "libnccl") != NULL);
        printf("test_nccl_unavailable: %s\n", msg);
        /* Asking again gives the same answer (the outcome of loading is kept). */
        EXPECT_RC(tc_comm_new("nccl", gpu, &o, &comm), TC_ERR_UNAVAILABLE, "unavailable");
    }

    /* The host backend still works in the same process. */
    tc_comm_t *host = NULL;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    o.name = "host_after_nccl";
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &host));
    if (host) {
        float x[2] = {1, 2};
        tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
        EXPECT_OK(tc_all_reduce(host, x, 2, TC_FLOAT32, sum, NULL, NULL));
        CHECK(x[0] == 1 && x[1] == 2);
        EXPECT_OK(tc_comm_finalize(host));
        tc_comm_destroy(host);
    }
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_nccl_unavailable");
}
