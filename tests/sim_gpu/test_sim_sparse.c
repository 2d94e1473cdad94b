/* tc_sparse_all_reduce and CUDA memory, on the simulated driver and NCCL
   (one rank): CUDA staging for sparse tensors is not implemented, so device
   arrays on a gloo comm and any call on an nccl comm answer
   TC_ERR_UNSUPPORTED with a message, leaving the output untouched; host
   arrays on the gloo comm (with the driver loaded) still work. Prints
   "N passed, N failed". */
#include "scenario.h"

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    const int64_t shape[2] = {8, 2};
    const int64_t idx[3] = {5, 1, 5};
    const float vals[6] = {1, 2, 3, 4, 5, 6};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_sparse_coo_t out, untouched;
    memset(&untouched, 0x5a, sizeof untouched);

    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "sim_sparse_gloo";
    co.abort_on_error = 0;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_comm_t *gloo = NULL;
    expect(tc_comm_new("gloo", cpu, &co, &gloo) == TC_SUCCESS, "gloo comm");
    void *d_vals = dalloc(sizeof vals);
    void *d_idx = dalloc(sizeof idx);
    h2d(d_vals, vals, sizeof vals);
    h2d(d_idx, idx, sizeof idx);
    tc_sparse_coo_t on_device = {1, 1, shape, 3, idx, d_vals, TC_FLOAT32};
    out = untouched;
    expect(tc_sparse_all_reduce(gloo, &on_device, sum, &out, NULL, NULL) == TC_ERR_UNSUPPORTED &&
               strstr(tc_last_error(), "CUDA memory") != NULL,
           "device values on gloo: TC_ERR_UNSUPPORTED naming CUDA memory");
    on_device.values = vals;
    on_device.indices = d_idx;
    expect(tc_sparse_all_reduce(gloo, &on_device, sum, &out, NULL, NULL) == TC_ERR_UNSUPPORTED,
           "device indices on gloo: TC_ERR_UNSUPPORTED");
    expect(memcmp(&out, &untouched, sizeof out) == 0, "output untouched");
    tc_sparse_coo_t host = {1, 1, shape, 3, idx, vals, TC_FLOAT32};
    expect(tc_sparse_all_reduce(gloo, &host, sum, &out, NULL, NULL) == TC_SUCCESS && out.nnz == 2 &&
               ((const float *)out.values)[2] == 6 && ((const float *)out.values)[3] == 8,
           "host arrays on gloo with the driver loaded");
    if (memcmp(&out, &untouched, sizeof out) != 0) {
        tc_free((void *)out.shape);
        tc_free((void *)out.indices);
        tc_free((void *)out.values);
    }
    expect(tc_comm_finalize(gloo) == TC_SUCCESS, "gloo finalize");
    tc_comm_destroy(gloo);

    tc_comm_t *nccl = scenario_comm("sim_sparse_nccl");
    out = untouched;
    expect(tc_sparse_all_reduce(nccl, &host, sum, &out, NULL, NULL) == TC_ERR_UNSUPPORTED &&
               strstr(tc_last_error(), "gloo backend only") != NULL,
           "nccl comm: TC_ERR_UNSUPPORTED naming the gloo backend");
    expect(memcmp(&out, &untouched, sizeof out) == 0, "output untouched on nccl");
    expect(tc_comm_finalize(nccl) == TC_SUCCESS, "nccl finalize");
    tc_comm_destroy(nccl);
    dfree(d_vals);
    dfree(d_idx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
