/* The nccl backend through the C API with a real libnccl (the
   nvidia-nccl-cu13 wheel's, named by TORCHCOMM_NCCL_LIBRARY) on a machine
   without a usable GPU: tc_comm_new("nccl", ...) answers TC_ERR_UNAVAILABLE,
   leaves *comm untouched, and its message names the NCCL version that was
   loaded (the version of the nccl.h shipped beside it), the library's path
   and the CUDA-side problem; the process goes on. On a machine with a
   driver and a GPU the comm is created and torn down instead.

   Built by `make nccl-real-test` against include/torchcomm.h and the wheel's
   nccl.h (for NCCL_MAJOR/MINOR/PATCH only; CUDA headers stubbed by
   tests/nccl_abi/cuda_stub); not part of capi_tests/ because it needs the
   wheel. */
#include "capi_util.h"
#include <nccl.h>

int main(void) {
    const char *lib = getenv("TORCHCOMM_NCCL_LIBRARY");
    if (lib == NULL || lib[0] == '\0') {
        fprintf(stderr, "test_nccl_real: set TORCHCOMM_NCCL_LIBRARY to the wheel's libnccl.so.2\n");
        return 2;
    }
    char version[64];
    snprintf(version, sizeof version, "NCCL %d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);

    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = "nccl_real";
    o.rank = 0;
    o.world_size = 1;
    o.store = store;
    o.abort_on_error = 0;
    o.timeout_ms = 5000;

    tc_comm_t *comm = (tc_comm_t *)&o; /* sentinel: must stay untouched on failure */
    tc_device_t gpu = {TC_DEVICE_CUDA, -1};
    tc_result_t rc = tc_comm_new("nccl", gpu, &o, &comm);
    if (rc == TC_SUCCESS) {
        printf("test_nccl_real: a GPU and driver are present; comm created with %s\n", version);
        EXPECT_OK(tc_comm_finalize(comm));
        tc_comm_destroy(comm);
    } else {
        EXPECT_RC(rc, TC_ERR_UNAVAILABLE, "nccl backend is unavailable");
        CHECK(comm == (tc_comm_t *)&o);
        const char *msg = tc_last_error();
        printf("test_nccl_real: %s: %s\n", tc_result_string(rc), msg);
        CHECK(strstr(msg, version) != NULL);           /* the NCCL found, by version */
        CHECK(strstr(msg, lib) != NULL);               /* ... and by path */
        CHECK(strstr(msg, "CUDA") != NULL || strstr(msg, "libcuda") != NULL); /* what is missing */
        CHECK(strstr(msg, "NCCL was not found") == NULL);
        /* The outcome of loading is kept: the same answer again. */
        EXPECT_RC(tc_comm_new("nccl", gpu, &o, &comm), TC_ERR_UNAVAILABLE, version);
        CHECK(comm == (tc_comm_t *)&o);
    }
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_nccl_real");
}
