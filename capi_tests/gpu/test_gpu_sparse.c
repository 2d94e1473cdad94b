/* tc_sparse_all_reduce with CUDA memory: on an nccl comm (metadata, then
   indices and values all-gathered through device memory, coalesced on the
   host, the result's indices and values in device memory from the comm's
   allocator) and on a gloo comm given device arrays (staged to the host on
   the caller's stream, the result in device memory). Inputs written on a
   non-default stream just before the call; very uneven nnz, duplicates
   inside a rank, unsorted indices, a 2-D dense part, float32 and int64
   values, async_op 0 and 1, and nnz 0 on every rank. Every element of the
   result is checked against a dense host reference. */
#include "gpu_util.h"

enum { ROWS = 64, COLS = 3 };
static int R, N, passed, failed, skipped;
static CUstream stream;

static void report(const char *what, int ok) {
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "rank %d: FAIL %s (last error: %s)\n", R, what, tc_last_error());
}

static size_t nnz_of(int r, int empty) { return empty ? 0 : r == 0 ? 300 : (size_t)(3 * r + 1); }
static int64_t index_of(int r, size_t j) { return (int64_t)((j * 7 + (size_t)r * 5) % (r % 2 ? 20 : ROWS)); }
static double value_of(int r, size_t j, int c) { return (double)((r + 1) * (int)(j % 11 + 1) + c); }

static int is_device_memory(const void *p) {
    unsigned int t = 0;
    return cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS &&
           t == CU_MEMORYTYPE_DEVICE;
}

/* One call; checks every element of the result against the dense sum. */
static void run_case(tc_comm_t *comm, const char *backend, int nccl, tc_dtype_t dtype, int async, int empty) {
    char label[200];
    snprintf(label, sizeof label, "%s: %s, async_op %d%s", backend, dt_name(dtype), async, empty ? ", nnz 0 everywhere" : "");
    size_t nnz = nnz_of(R, empty), es = dt_size(dtype);
    int64_t *hidx = malloc((nnz ? nnz : 1) * sizeof *hidx);
    unsigned char *hval = malloc((nnz ? nnz : 1) * COLS * es);
    for (size_t j = 0; j < nnz; j++) {
        hidx[j] = index_of(R, j);
        for (int c = 0; c < COLS; c++) put(dtype, hval, j * COLS + (size_t)c, value_of(R, j, c));
    }
    void *didx = dalloc(nnz * sizeof *hidx), *dval = dalloc(nnz * COLS * es);
    if (nnz) {
        CU(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)didx, hidx, nnz * sizeof *hidx, stream));
        CU(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dval, hval, nnz * COLS * es, stream));
    }
    const int64_t shape[2] = {ROWS, COLS};
    tc_sparse_coo_t in = {1, 1, shape, nnz, didx, dval, dtype}, out;
    memset(&out, 0, sizeof out);
    tc_op_options_t oo = TC_OP_OPTIONS_INIT;
    oo.stream = (void *)stream;
    oo.async_op = async;
    tc_work_t *w = NULL;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    int ok = tc_sparse_all_reduce(comm, &in, sum, &out, &oo, &w) == TC_SUCCESS;
    if (ok && w) ok = tc_work_wait_blocking(w) == TC_SUCCESS;
    if (w) tc_work_free(w);
    /* the dense reference */
    double ref[ROWS][COLS] = {{0}};
    int present[ROWS] = {0};
    for (int r = 0; r < N; r++)
        for (size_t j = 0; j < nnz_of(r, empty); j++) {
            present[index_of(r, j)] = 1;
            for (int c = 0; c < COLS; c++) ref[index_of(r, j)][c] += value_of(r, j, c);
        }
    size_t want_nnz = 0;
    for (int i = 0; i < ROWS; i++) want_nnz += (size_t)present[i];
    if (ok) {
        ok = out.nnz == want_nnz && out.sparse_dim == 1 && out.dense_dim == 1 && out.shape[0] == ROWS &&
             out.indices != NULL && out.values != NULL && is_device_memory(out.indices) && is_device_memory(out.values);
        if (!ok) fprintf(stderr, "rank %d: %s: nnz %zu (want %zu) or placement wrong\n", R, label, out.nnz, want_nnz);
    }
    if (ok && want_nnz) {
        int64_t *gidx = malloc(want_nnz * sizeof *gidx);
        unsigned char *gval = malloc(want_nnz * COLS * es);
        d2h(gidx, out.indices, want_nnz * sizeof *gidx);
        d2h(gval, out.values, want_nnz * COLS * es);
        size_t k = 0;
        for (int i = 0; i < ROWS && ok; i++) {
            if (!present[i]) continue;
            if (gidx[k] != i) {
                fprintf(stderr, "rank %d: %s: entry %zu has index %lld, expected %d\n", R, label, k, (long long)gidx[k], i);
                ok = 0;
            }
            for (int c = 0; c < COLS && ok; c++)
                if (get(dtype, gval, k * COLS + (size_t)c) != ref[i][c]) {
                    fprintf(stderr, "rank %d: %s: row %d col %d is %g, expected %g\n", R, label, i, c,
                            get(dtype, gval, k * COLS + (size_t)c), ref[i][c]);
                    ok = 0;
                }
            k++;
        }
        free(gidx);
        free(gval);
    }
    report(label, ok);
    if (out.shape && nccl) {
        /* nccl: the comm's allocator */
        report("tc_mem_free of the result's indices", tc_mem_free(comm, (void *)out.indices) == TC_SUCCESS);
        report("tc_mem_free of the result's values", tc_mem_free(comm, (void *)out.values) == TC_SUCCESS);
    } else if (out.shape) {
        /* gloo: cuMemAlloc on the input's device */
        CU(cuMemFree((CUdeviceptr)(uintptr_t)out.indices));
        CU(cuMemFree((CUdeviceptr)(uintptr_t)out.values));
    }
    if (out.shape) tc_free((void *)out.shape);
    dfree(didx);
    dfree(dval);
    free(hidx);
    free(hval);
}

static void run_backend(tc_comm_t *comm, const char *backend, int nccl) {
    const tc_dtype_t dtypes[2] = {TC_FLOAT32, TC_INT64};
    for (int d = 0; d < 2; d++)
        for (int async = 0; async < 2; async++) run_case(comm, backend, nccl, dtypes[d], async, 0);
    run_case(comm, backend, nccl, TC_FLOAT32, 0, 1);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_result_t rc;
    tc_device_t cuda_dev = {TC_DEVICE_CUDA, -1};
    tc_comm_t *comm = test_comm_new("nccl", cuda_dev, "gpu-sparse-nccl", &rc);
    if (!comm) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    run_backend(comm, "nccl", 1);
    report("nccl: finalize", tc_comm_finalize(comm) == TC_SUCCESS);
    tc_comm_destroy(comm);

    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    comm = test_comm_new("gloo", cpu, "gpu-sparse-gloo", &rc);
    if (rc == TC_ERR_UNAVAILABLE) {
        printf("rank %d: SKIP gloo with CUDA arrays: %s\n", R, tc_last_error());
        skipped++;
    } else if (rc != TC_SUCCESS) {
        report("tc_comm_new(gloo)", 0);
    } else {
        run_backend(comm, "gloo with CUDA arrays", 0);
        report("gloo: finalize", tc_comm_finalize(comm) == TC_SUCCESS);
        tc_comm_destroy(comm);
    }
    CU(cuStreamDestroy(stream));
    printf("rank %d: %d passed, %d failed, %d skipped\n", R, passed, failed, skipped);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
