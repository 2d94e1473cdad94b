/* CUDA buffers on the host backend: a "gloo" comm given device pointers
   stages them through pinned host memory in the caller's stream order.
   Checks all_reduce (in place), all_gather_single and reduce_scatter_single
   on device memory, with data written on a non-default stream just before the
   call (the staging must wait for it), and a host buffer alongside. */
#include "gpu_util.h"

int main(void) {
    gpu_setup();
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "gpu-gloo-staging";
    co.abort_on_error = 0;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_comm_t *comm = NULL;
    tc_result_t rc = tc_comm_new("gloo", cpu, &co, &comm);
    if (rc != TC_SUCCESS) {
        fprintf(stderr, "tc_comm_new: %s\n", tc_last_error());
        return 1;
    }
    int rank, size;
    EXPECT_OK(tc_comm_get_rank(comm, &rank));
    EXPECT_OK(tc_comm_get_size(comm, &size));
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_op_options_t oo = TC_OP_OPTIONS_INIT;
    oo.stream = (void *)stream;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    enum { N = 1 << 16 };
    float *host = malloc(N * (size_t)size * sizeof *host);
    int passed = 0, failed = 0;

    /* all_reduce in place on device memory written asynchronously on `stream` */
    float *d = dalloc(N * sizeof(float));
    for (int i = 0; i < N; i++) host[i] = (float)(rank + 1) + (float)(i % 7);
    CU(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d, host, N * sizeof(float), stream));
    EXPECT_OK(tc_all_reduce(comm, d, N, TC_FLOAT32, sum, &oo, NULL));
    CU(cuStreamSynchronize(stream));
    d2h(host, d, N * sizeof(float));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= host[i] == (float)(size * (size + 1) / 2) + (float)(size * (i % 7));
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "rank %d: all_reduce on device memory: wrong result\n", rank);

    /* all_gather_single: device output, host input */
    float *dout = dalloc(N * (size_t)size * sizeof(float));
    float *hin = malloc(N * sizeof *hin);
    for (int i = 0; i < N; i++) hin[i] = (float)(rank * 1000 + i % 100);
    EXPECT_OK(tc_all_gather_single(comm, dout, hin, N, TC_FLOAT32, &oo, NULL));
    CU(cuStreamSynchronize(stream));
    d2h(host, dout, N * (size_t)size * sizeof(float));
    ok = 1;
    for (int r = 0; r < size; r++)
        for (int i = 0; i < N; i++) ok &= host[(size_t)r * N + i] == (float)(r * 1000 + i % 100);
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "rank %d: all_gather_single to device memory: wrong result\n", rank);

    /* reduce_scatter_single: device input and output */
    for (int i = 0; i < N * size; i++) host[i] = (float)(i / N + 1);
    h2d(dout, host, N * (size_t)size * sizeof(float));
    EXPECT_OK(tc_reduce_scatter_single(comm, d, dout, N, TC_FLOAT32, sum, &oo, NULL));
    CU(cuStreamSynchronize(stream));
    d2h(host, d, N * sizeof(float));
    ok = 1;
    for (int i = 0; i < N; i++) ok &= host[i] == (float)(size * (rank + 1));
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "rank %d: reduce_scatter_single on device memory: wrong result\n", rank);

    /* under CUDA graph capture a staged (host) collective is refused, and the
       caller's capture stays valid */
    CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    tc_result_t crc = tc_all_reduce(comm, d, N, TC_FLOAT32, sum, &oo, NULL);
    CUgraph graph = NULL;
    CUresult end = cuStreamEndCapture(stream, &graph);
    ok = crc == TC_ERR_UNSUPPORTED && end == CUDA_SUCCESS;
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "rank %d: staged all_reduce under capture: %s (%s), end capture %d\n", rank, tc_result_string(crc), tc_last_error(), (int)end);
    if (graph) CU(cuGraphDestroy(graph));

    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    dfree(d);
    dfree(dout);
    free(host);
    free(hin);
    CU(cuStreamDestroy(stream));
    failed += capi_failures;
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
