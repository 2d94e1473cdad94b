/* tc_broadcast_coalesced on device memory: on an nccl comm (packing and
   unpacking as device copies, one broadcast per bucket, stream-ordered), and
   on a gloo comm given CUDA buffers (host staging on the caller's stream).
   A mixed list (float32, float16, int64, uint8, empty buffers, a buffer
   larger than buffer_bytes), written on a non-default stream just before the
   call; every byte of every buffer is checked against root's pattern, for
   two roots, async_op 0 and 1 and two bucket sizes; a list that differs
   between ranks fails every rank and writes nothing. */
#include "gpu_util.h"

enum { NBUF = 9 };
static const size_t COUNTS[NBUF] = {1000, 37, 0, 300, 5000, 13, 1, 7, 0};
static const tc_dtype_t DTYPES[NBUF] = {TC_FLOAT32, TC_FLOAT16, TC_FLOAT32, TC_INT64, TC_FLOAT32,
                                        TC_UINT8,   TC_FLOAT16, TC_FLOAT32, TC_INT64};
static int R, N, passed, failed, skipped;
static CUstream stream;

static void report(const char *what, int ok) {
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "rank %d: FAIL %s: %s\n", R, what, tc_last_error());
}

static unsigned char pattern(int rank, int buf, size_t k) {
    return (unsigned char)(rank * 31 + buf * 7 + (int)(k * 13) + (int)(k >> 8));
}

/* Writes `rank`'s pattern into the buffers on `stream` (no wait: the call
   must order itself after it). */
static void fill(void **d, unsigned char **h, int rank) {
    for (int i = 0; i < NBUF; i++) {
        size_t b = COUNTS[i] * dt_size(DTYPES[i]);
        for (size_t k = 0; k < b; k++) h[i][k] = pattern(rank, i, k);
        if (b) CU(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d[i], h[i], b, stream));
    }
}

/* Every byte of every buffer holds `rank`'s pattern. */
static int holds(void **d, unsigned char **h, int rank, const char *label) {
    int ok = 1;
    for (int i = 0; i < NBUF; i++) {
        size_t b = COUNTS[i] * dt_size(DTYPES[i]);
        d2h(h[i], d[i], b);
        for (size_t k = 0; k < b; k++)
            if (h[i][k] != pattern(rank, i, k)) {
                fprintf(stderr, "rank %d: %s: bufs[%d] byte %zu is %u, expected %u (rank %d's)\n", R, label, i, k,
                        h[i][k], pattern(rank, i, k), rank);
                ok = 0;
                break;
            }
    }
    return ok;
}

static void run_backend(tc_comm_t *comm, const char *backend, void **d, unsigned char **h) {
    char label[160];
    const size_t limits[2] = {4096, 1 << 20};
    for (int root_i = 0; root_i < 2; root_i++) {
        int root = root_i == 0 ? 0 : N - 1;
        for (int async = 0; async < 2; async++)
            for (int li = 0; li < 2; li++) {
                snprintf(label, sizeof label, "%s: root %d, async_op %d, buffer_bytes %zu", backend, root, async,
                         limits[li]);
                fill(d, h, R);
                tc_op_options_t oo = TC_OP_OPTIONS_INIT;
                oo.stream = (void *)stream;
                oo.async_op = async;
                tc_work_t *w = NULL;
                tc_result_t rc = tc_broadcast_coalesced(comm, d, COUNTS, DTYPES, NBUF, limits[li], root, &oo, &w);
                int ok = rc == TC_SUCCESS;
                if (ok && w) ok = tc_work_wait(w, (void *)stream) == TC_SUCCESS;
                CU(cuStreamSynchronize(stream));
                if (w) tc_work_free(w);
                report(label, ok && holds(d, h, root, label));
            }
    }
    /* A list that differs (rank N-1 passes another count for bufs[3]):
       every rank fails and no buffer is written. */
    if (N > 1) {
        size_t counts[NBUF];
        memcpy(counts, COUNTS, sizeof counts);
        if (R == N - 1) counts[3] = 299;
        fill(d, h, R);
        CU(cuStreamSynchronize(stream));
        tc_op_options_t oo = TC_OP_OPTIONS_INIT;
        oo.stream = (void *)stream;
        tc_result_t rc = tc_broadcast_coalesced(comm, d, counts, DTYPES, NBUF, 4096, 0, &oo, NULL);
        snprintf(label, sizeof label, "%s: a differing list fails every rank, naming entry 3", backend);
        report(label, rc == TC_ERR_INVALID_USAGE && strstr(tc_last_error(), "entry 3") != NULL);
        CU(cuStreamSynchronize(stream));
        snprintf(label, sizeof label, "%s: a differing list writes nothing", backend);
        report(label, holds(d, h, R, label));
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    void *d[NBUF];
    unsigned char *h[NBUF];
    for (int i = 0; i < NBUF; i++) {
        size_t b = COUNTS[i] * dt_size(DTYPES[i]);
        d[i] = dalloc(b);
        h[i] = malloc(b ? b : 1);
    }
    tc_result_t rc;
    tc_device_t cuda_dev = {TC_DEVICE_CUDA, -1};
    tc_comm_t *comm = test_comm_new("nccl", cuda_dev, "gpu-coalesced-nccl", &rc);
    if (!comm) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    run_backend(comm, "nccl", d, h);
    report("nccl: finalize", tc_comm_finalize(comm) == TC_SUCCESS);
    tc_comm_destroy(comm);

    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    comm = test_comm_new("gloo", cpu, "gpu-coalesced-gloo", &rc);
    if (rc == TC_ERR_UNAVAILABLE) {
        printf("rank %d: SKIP gloo with CUDA buffers: %s\n", R, tc_last_error());
        skipped++;
    } else if (rc != TC_SUCCESS) {
        report("tc_comm_new(gloo)", 0);
    } else {
        run_backend(comm, "gloo with CUDA buffers", d, h);
        report("gloo: finalize", tc_comm_finalize(comm) == TC_SUCCESS);
        tc_comm_destroy(comm);
    }
    for (int i = 0; i < NBUF; i++) {
        dfree(d[i]);
        free(h[i]);
    }
    CU(cuStreamDestroy(stream));
    printf("rank %d: %d passed, %d failed, %d skipped\n", R, passed, failed, skipped);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
