/* tc_sparse_all_reduce and CUDA memory, on the simulated driver and NCCL
   (one rank, so every result is the coalesced input): device arrays on a
   gloo comm are staged to the host (the result's indices and values in
   cuMemAlloc memory of the input's device), host arrays on gloo keep a host
   result, and an nccl comm gives its result in memory from the comm's
   allocator, whether the input is device or host memory. Inputs written on
   a non-default stream just before the call; a device index out of range is
   refused, naming it, with the output untouched. The multi-rank checks are
   the GPU suite's test_gpu_sparse.c. Prints "N passed, N failed". */
#include "scenario.h"

static CUstream stream;

static int device_memory(const void *p) {
    unsigned int t = 0;
    return cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS &&
           t == CU_MEMORYTYPE_DEVICE;
}

/* The coalesced form of {5: (1,2), 1: (3,4), 5: (5,6)}: {1: (3,4), 5: (6,8)}. */
static int coalesced(const tc_sparse_coo_t *out, int on_device) {
    int64_t idx[2] = {0};
    float v[4] = {0};
    if (out->nnz != 2 || out->shape[0] != 8 || out->shape[1] != 2) return 0;
    if (on_device != device_memory(out->values) || on_device != device_memory(out->indices)) return 0;
    if (on_device) {
        d2h(idx, out->indices, sizeof idx);
        d2h(v, out->values, sizeof v);
    } else {
        memcpy(idx, out->indices, sizeof idx);
        memcpy(v, out->values, sizeof v);
    }
    return idx[0] == 1 && idx[1] == 5 && v[0] == 3 && v[1] == 4 && v[2] == 6 && v[3] == 8;
}

static void release(tc_comm_t *comm, tc_sparse_coo_t *out, int how) { /* 0 host, 1 cuMemFree, 2 tc_mem_free */
    if (how == 0) {
        tc_free((void *)out->indices);
        tc_free((void *)out->values);
    } else if (how == 1) {
        CU(cuMemFree((CUdeviceptr)(uintptr_t)out->indices));
        CU(cuMemFree((CUdeviceptr)(uintptr_t)out->values));
    } else {
        expect(tc_mem_free(comm, (void *)out->indices) == TC_SUCCESS, "tc_mem_free(indices)");
        expect(tc_mem_free(comm, (void *)out->values) == TC_SUCCESS, "tc_mem_free(values)");
    }
    tc_free((void *)out->shape);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    const int64_t shape[2] = {8, 2};
    const int64_t idx[3] = {5, 1, 5}, bad_idx[3] = {5, 8, 1};
    const float vals[6] = {1, 2, 3, 4, 5, 6};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t oo = TC_OP_OPTIONS_INIT;
    oo.stream = (void *)stream;
    tc_sparse_coo_t out, untouched;
    memset(&untouched, 0x5a, sizeof untouched);
    void *d_vals = dalloc(sizeof vals), *d_idx = dalloc(sizeof idx), *d_bad = dalloc(sizeof bad_idx);
    void *d_shape = dalloc(sizeof shape);
    h2d(d_shape, shape, sizeof shape);
    h2d(d_bad, bad_idx, sizeof bad_idx);
    /* written on the stream just before each call: the staging must wait */
#define WRITE_INPUTS()                                                                       \
    do {                                                                                     \
        CU(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d_vals, vals, sizeof vals, stream));    \
        CU(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d_idx, idx, sizeof idx, stream));       \
    } while (0)

    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "sim_sparse_gloo";
    co.abort_on_error = 0;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_comm_t *gloo = NULL;
    expect(tc_comm_new("gloo", cpu, &co, &gloo) == TC_SUCCESS, "gloo comm");
    tc_sparse_coo_t in = {1, 1, shape, 3, d_idx, d_vals, TC_FLOAT32};
    WRITE_INPUTS();
    int ok = tc_sparse_all_reduce(gloo, &in, sum, &out, &oo, NULL) == TC_SUCCESS;
    expect(ok && coalesced(&out, 1), "gloo: device indices and values: coalesced result in device memory");
    if (ok) release(gloo, &out, 1);
    in.indices = idx;
    WRITE_INPUTS();
    ok = tc_sparse_all_reduce(gloo, &in, sum, &out, &oo, NULL) == TC_SUCCESS;
    expect(ok && coalesced(&out, 1), "gloo: device values, host indices");
    if (ok) release(gloo, &out, 1);
    in.indices = d_idx, in.values = vals, in.shape = d_shape;
    WRITE_INPUTS();
    ok = tc_sparse_all_reduce(gloo, &in, sum, &out, &oo, NULL) == TC_SUCCESS;
    expect(ok && coalesced(&out, 1), "gloo: device indices and shape, host values");
    if (ok) release(gloo, &out, 1);
    in.indices = d_bad, in.shape = shape;
    out = untouched;
    expect(tc_sparse_all_reduce(gloo, &in, sum, &out, &oo, NULL) == TC_ERR_INVALID_ARGUMENT &&
               strstr(tc_last_error(), "8") != NULL && memcmp(&out, &untouched, sizeof out) == 0,
           "gloo: a device index out of range is refused, output untouched");
    tc_sparse_coo_t host = {1, 1, shape, 3, idx, vals, TC_FLOAT32};
    ok = tc_sparse_all_reduce(gloo, &host, sum, &out, NULL, NULL) == TC_SUCCESS;
    expect(ok && coalesced(&out, 0), "gloo: host arrays keep a host result");
    if (ok) release(gloo, &out, 0);
    expect(tc_comm_finalize(gloo) == TC_SUCCESS, "gloo finalize");
    tc_comm_destroy(gloo);

    tc_comm_t *nccl = scenario_comm("sim_sparse_nccl");
    in = (tc_sparse_coo_t){1, 1, shape, 3, d_idx, d_vals, TC_FLOAT32};
    WRITE_INPUTS();
    ok = tc_sparse_all_reduce(nccl, &in, sum, &out, &oo, NULL) == TC_SUCCESS;
    expect(ok && coalesced(&out, 1), "nccl: device arrays: result in the comm's allocator's memory");
    if (ok) release(nccl, &out, 2);
    tc_work_t *w = NULL;
    oo.async_op = 1;
    ok = tc_sparse_all_reduce(nccl, &host, sum, &out, &oo, &w) == TC_SUCCESS && tc_work_wait_blocking(w) == TC_SUCCESS;
    expect(ok && coalesced(&out, 1), "nccl: host arrays, async_op 1: result in device memory");
    if (ok) release(nccl, &out, 2);
    tc_work_free(w);
    expect(tc_comm_finalize(nccl) == TC_SUCCESS, "nccl finalize");
    tc_comm_destroy(nccl);
    dfree(d_vals);
    dfree(d_idx);
    dfree(d_bad);
    dfree(d_shape);
    CU(cuStreamDestroy(stream));
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
