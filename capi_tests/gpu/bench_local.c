/* Benchmark of tc_local_broadcast and tc_local_reduce_add: for each device
   count 1..N (N: every visible device, or argv[1]), path (NCCL, copies) and
   size, the median over interleaved rounds of
   - issue: host microseconds for the call to return (what a caller's thread
     pays per call; the device work is asynchronous),
   - device: microseconds from an event before to an event after the call
     on member 0's stream, and the bandwidth bytes / device time (algorithm
     bandwidth, as nccl-tests prints algbw).
   On the simulated driver only the issue column means something (the
   simulated device runs on host threads). Usage:
     bench_local [max_devices] [max_bytes]   (defaults: all, 64 MiB) */
#include "gpu_util.h"
#include <time.h>

#define MAXD 8
#define ROUNDS 15

static int nd;
static CUcontext ctx[MAXD];

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

struct cfg {
    int n, op, nccl; /* op 0: broadcast, 1: reduce_add */
    tc_local_t *g;
    void *src[MAXD], *dst[MAXD];
    CUevent start, stop;
};

static void *dev_alloc(int d, size_t bytes) {
    CU(cuCtxPushCurrent(ctx[d]));
    CUdeviceptr p;
    CU(cuMemAlloc(&p, bytes ? bytes : 1));
    CU(cuMemsetD8(p, 0, bytes ? bytes : 1));
    CU(cuCtxSynchronize());
    CUcontext c;
    CU(cuCtxPopCurrent(&c));
    return (void *)(uintptr_t)p;
}

/* One timed call: (issue us, device us). */
static void one(struct cfg *c, size_t count, double *issue, double *device) {
    CU(cuEventRecord(c->start, NULL));
    double t0 = now_us();
    tc_result_t rc = c->op == 0 ? tc_local_broadcast(c->g, c->src[0], 0, c->dst, count, TC_FLOAT32, NULL)
                                : tc_local_reduce_add(c->g, (const void *const *)c->src, count, TC_FLOAT32, c->dst[0], 0, NULL);
    double t1 = now_us();
    if (rc != TC_SUCCESS) { fprintf(stderr, "bench_local: %s\n", tc_last_error()); exit(1); }
    CU(cuEventRecord(c->stop, NULL));
    for (int d = 0; d < c->n; d++) {
        CU(cuCtxPushCurrent(ctx[d]));
        CU(cuCtxSynchronize());
        CUcontext x;
        CU(cuCtxPopCurrent(&x));
    }
    float ms = 0;
    CU(cuEventElapsedTime(&ms, c->start, c->stop));
    *issue = t1 - t0, *device = ms * 1e3;
}

int main(int argc, char **argv) {
    gpu_setup();
    CU(cuDeviceGetCount(&nd));
    if (nd > MAXD) nd = MAXD;
    int maxd = argc > 1 ? atoi(argv[1]) : nd;
    size_t max_bytes = argc > 2 ? (size_t)atoll(argv[2]) : (size_t)64 << 20;
    if (maxd < 1 || maxd > nd) maxd = nd;
    for (int d = 0; d < nd; d++) {
        CUdevice dev;
        CU(cuDeviceGet(&dev, d));
        CU(cuDevicePrimaryCtxRetain(&ctx[d], dev));
    }
    CU(cuCtxSetCurrent(ctx[0]));
    printf("# tc_local on %d device(s); median of %d interleaved rounds; float32\n", nd, ROUNDS);
    printf("%-10s %4s %-7s %12s %12s %12s %10s\n", "op", "devs", "path", "bytes", "issue_us", "device_us", "algbw_GB/s");
    for (int n = 1; n <= maxd; n++)
        for (size_t bytes = 4; bytes <= max_bytes; bytes *= 64) {
            size_t count = bytes / 4;
            struct cfg cs[4];
            for (int k = 0; k < 4; k++) {
                struct cfg *c = &cs[k];
                c->n = n, c->op = k / 2, c->nccl = k % 2 == 0;
                tc_device_t devs[MAXD];
                for (int d = 0; d < n; d++) devs[d] = (tc_device_t){TC_DEVICE_CUDA, d};
                tc_local_options_t o = TC_LOCAL_OPTIONS_INIT;
                o.use_nccl = c->nccl ? TC_UNSET : 0;
                if (tc_local_new(devs, (size_t)n, &o, &c->g) != TC_SUCCESS) { fprintf(stderr, "%s\n", tc_last_error()); return 1; }
                for (int d = 0; d < n; d++) c->src[d] = dev_alloc(d, bytes), c->dst[d] = dev_alloc(d, bytes);
                CU(cuEventCreate(&c->start, CU_EVENT_DEFAULT));
                CU(cuEventCreate(&c->stop, CU_EVENT_DEFAULT));
                double a, b;
                one(c, count, &a, &b); /* warm-up: makes the NCCL comms */
            }
            double issue[4][ROUNDS], device[4][ROUNDS];
            for (int r = 0; r < ROUNDS; r++)
                for (int k = 0; k < 4; k++) one(&cs[k], count, &issue[k][r], &device[k][r]);
            for (int k = 0; k < 4; k++) {
                struct cfg *c = &cs[k];
                double iu = median(issue[k], ROUNDS), du = median(device[k], ROUNDS);
                printf("%-10s %4d %-7s %12zu %12.1f %12.1f %10.2f\n", c->op ? "reduce_add" : "broadcast", n, c->nccl ? "nccl" : "copies",
                       bytes, iu, du, du > 0 ? (double)bytes / du / 1e3 : 0.0);
                tc_local_free(c->g);
                for (int d = 0; d < n; d++) {
                    CU(cuCtxPushCurrent(ctx[d]));
                    CU(cuMemFree((CUdeviceptr)(uintptr_t)c->src[d]));
                    CU(cuMemFree((CUdeviceptr)(uintptr_t)c->dst[d]));
                    CUcontext x;
                    CU(cuCtxPopCurrent(&x));
                }
                CU(cuEventDestroy(c->start));
                CU(cuEventDestroy(c->stop));
            }
        }
    return 0;
}
