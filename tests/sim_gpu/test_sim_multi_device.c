/* Several devices in one process, on the simulated driver and NCCL only
   (TC_SIM_DEVICES=N, N >= 2; a test of the simulation that the
   multi-device work builds on). Checks, calling the simulated libcuda and
   libnccl directly (no library of ours): N devices and their primary
   contexts; device memory reports the device it was allocated on; NCCL's
   ncclCommInitAll makes one rank per device; grouped per-device
   ncclCommInitRank (one thread, one group) does the same, while a comm is
   unusable before its group ended; an all-reduce over every device's comm
   in one group sums correctly; a buffer or stream of another device than
   the comm's is refused; the same device twice in ncclCommInitAll is
   "Duplicate GPU detected"; an ungrouped init of one rank of several in a
   thread that owns them all cannot complete (the init timeout ends it).
   Prints "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda.h"

/* The part of nccl.h this test uses (the simulation has no header). */
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };
enum { ncclFloat32 = 7, ncclSum = 0 };
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
int ncclCommCount(ncclComm_t comm, int *count);
int ncclCommUserRank(ncclComm_t comm, int *rank);
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t comm, CUstream st);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclCommDestroy(ncclComm_t comm);

#define MAXD 8
static int passed, failed;
static void expect(int ok, const char *what) {
    if (ok) passed++;
    else { failed++; fprintf(stderr, "FAIL %s\n", what); }
}
#define CK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { fprintf(stderr, "%s: %d\n", #call, (int)r_); exit(2); } } while (0)

static CUcontext ctx[MAXD];
static CUstream stream[MAXD];
static CUdeviceptr buf[MAXD];
static int n;

/* An all-reduce of N floats over the comms, one group; each device holds
   its ordinal + 1; every element must end as N(N+1)/2. */
static int all_reduce_ok(ncclComm_t *comms) {
    float h[4];
    for (int d = 0; d < n; d++) {
        CK(cuCtxSetCurrent(ctx[d]));
        for (int i = 0; i < 4; i++) h[i] = (float)(d + 1);
        CK(cuMemcpyHtoD(buf[d], h, sizeof h));
        /* a copy from pageable memory may return before the device has
           it, and the non-blocking streams do not wait for the legacy one */
        CK(cuStreamSynchronize(NULL));
    }
    int r = ncclGroupStart();
    for (int d = 0; d < n; d++) {
        CK(cuCtxSetCurrent(ctx[d]));
        int x = ncclAllReduce((void *)(uintptr_t)buf[d], (void *)(uintptr_t)buf[d], 4, ncclFloat32, ncclSum, comms[d], stream[d]);
        if (x != ncclSuccess) r = x;
    }
    int e = ncclGroupEnd();
    int ok = r == ncclSuccess && e == ncclSuccess;
    for (int d = 0; d < n && ok; d++) {
        CK(cuCtxSetCurrent(ctx[d]));
        CK(cuStreamSynchronize(stream[d]));
        CK(cuMemcpyDtoH(h, buf[d], sizeof h));
        for (int i = 0; i < 4; i++) ok = ok && h[i] == (float)(n * (n + 1) / 2);
    }
    return ok;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    CK(cuInit(0));
    CK(cuDeviceGetCount(&n));
    if (n < 2 || n > MAXD) { fprintf(stderr, "run with TC_SIM_DEVICES=2..%d (got %d devices)\n", MAXD, n); printf("0 passed, 1 failed\n"); return 1; }
    for (int d = 0; d < n; d++) {
        CUdevice dev;
        CK(cuDeviceGet(&dev, d));
        CK(cuDevicePrimaryCtxRetain(&ctx[d], dev));
        CK(cuCtxSetCurrent(ctx[d]));
        CK(cuStreamCreate(&stream[d], CU_STREAM_NON_BLOCKING));
        CK(cuMemAlloc(&buf[d], 64));
        int ord = -1;
        CK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, buf[d]));
        expect(ord == d, "device memory reports the device it was allocated on");
    }
    CUdevice none;
    expect(cuDeviceGet(&none, n) == CUDA_ERROR_INVALID_DEVICE, "an ordinal past the device count is refused");

    ncclComm_t all[MAXD] = {0};
    expect(ncclCommInitAll(all, n, NULL) == ncclSuccess, "ncclCommInitAll over every device");
    int ranks_ok = 1;
    for (int d = 0; d < n; d++) {
        int c = -1, r = -1;
        ncclCommCount(all[d], &c);
        ncclCommUserRank(all[d], &r);
        ranks_ok = ranks_ok && c == n && r == d;
    }
    expect(ranks_ok, "ncclCommInitAll: rank d on device d, N ranks");
    expect(all_reduce_ok(all), "grouped all-reduce over the comms of ncclCommInitAll");
    CK(cuCtxSetCurrent(ctx[0]));
    expect(ncclAllReduce((void *)(uintptr_t)buf[1], (void *)(uintptr_t)buf[1], 4, ncclFloat32, ncclSum, all[0], stream[0]) ==
               ncclInvalidArgument, "a buffer of device 1 on the comm of device 0 is refused");
    expect(ncclAllReduce((void *)(uintptr_t)buf[0], (void *)(uintptr_t)buf[0], 4, ncclFloat32, ncclSum, all[0], stream[1]) != ncclSuccess,
           "a stream of device 1 on the comm of device 0 is refused");
    for (int d = 0; d < n; d++) ncclCommDestroy(all[d]);

    /* grouped per-device init: one thread, one group */
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t per[MAXD] = {0};
    int r = ncclGroupStart();
    for (int d = 0; d < n; d++) {
        CK(cuCtxSetCurrent(ctx[d]));
        int x = ncclCommInitRank(&per[d], n, id, d);
        if (x != ncclSuccess) r = x;
    }
    int e = ncclGroupEnd();
    expect(r == ncclSuccess && e == ncclSuccess, "grouped per-device ncclCommInitRank");
    expect(all_reduce_ok(per), "grouped all-reduce over the grouped-init comms");
    for (int d = 0; d < n; d++) ncclCommDestroy(per[d]);

    /* a comm used inside the group that creates it: refused, and the
       failed call fails the group (as any failed call in a group does) */
    ncclGetUniqueId(&id);
    ncclGroupStart();
    for (int d = 0; d < n; d++) {
        CK(cuCtxSetCurrent(ctx[d]));
        ncclCommInitRank(&per[d], n, id, d);
    }
    CK(cuCtxSetCurrent(ctx[0]));
    r = ncclAllReduce((void *)(uintptr_t)buf[0], (void *)(uintptr_t)buf[0], 4, ncclFloat32, ncclSum, per[0], stream[0]);
    e = ncclGroupEnd();
    expect(r == ncclInvalidUsage && e == ncclInvalidUsage, "a comm is not usable before the group that creates it ended");
    for (int d = 0; d < n; d++) ncclCommDestroy(per[d]);

    int twice[2] = {0, 0};
    ncclComm_t dup[2];
    expect(ncclCommInitAll(dup, 2, twice) == ncclInvalidUsage, "the same device twice: Duplicate GPU detected");

    /* ungrouped: rank 0 waits for rank 1, which this same thread would
       create next; NCCL hangs, the simulation gives up after its timeout */
    setenv("TC_SIM_NCCL_INIT_TIMEOUT_MS", "1500", 1);
    ncclGetUniqueId(&id);
    ncclComm_t lone = NULL;
    expect(ncclCommInitRank(&lone, n, id, 0) != ncclSuccess, "ungrouped init of one rank of several cannot complete");

    for (int d = 0; d < n; d++) {
        CK(cuCtxSetCurrent(ctx[d]));
        CK(cuMemFree(buf[d]));
        CK(cuStreamDestroy(stream[d]));
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
