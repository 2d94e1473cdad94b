/* A non-blocking comm of the simulated NCCL, called directly (a test of the
   simulation): after a call answered ncclInProgress, until
   ncclCommGetAsyncError reported ncclSuccess, another call on the comm is
   refused (ncclInvalidArgument, as NCCL's ncclCommEnsureReady) and any use
   of the call's stream is refused by the simulated driver (NCCL may not
   have enqueued the work yet); after success both work.
   Prints "N passed, N failed". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "cuda.h"

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { /* the leading fields of ncclConfig_t, all the simulation reads */
    size_t size;
    unsigned int magic, version;
    int blocking;
} config_head;
enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInProgress = 7, ncclFloat32 = 7, ncclSum = 0 };
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config);
int ncclCommGetAsyncError(ncclComm_t comm, int *state);
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t comm, CUstream st);
int ncclCommDestroy(ncclComm_t comm);

static int passed, failed;
static void expect(int ok, const char *what) {
    if (ok) passed++;
    else { failed++; fprintf(stderr, "FAIL %s\n", what); }
}
#define CK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { fprintf(stderr, "%s: %d\n", #call, (int)r_); exit(2); } } while (0)

static int settle(ncclComm_t c) {
    int st = ncclInProgress;
    for (int i = 0; i < 1000 && st == ncclInProgress; i++)
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return -1;
    return st;
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent ev;
    CK(cuEventCreate(&ev, 0));
    CUdeviceptr b;
    CK(cuMemAlloc(&b, 64));
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    config_head cfg = {sizeof cfg, 0xcafebeefu, 22809, 0};
    ncclComm_t c = NULL;
    int r = ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
    expect((r == ncclSuccess || r == ncclInProgress) && settle(c) == ncclSuccess, "non-blocking init");
    void *p = (void *)(uintptr_t)b;
    expect(ncclAllReduce(p, p, 4, ncclFloat32, ncclSum, c, s) == ncclInProgress, "a non-blocking all-reduce answers ncclInProgress");
    expect(ncclAllReduce(p, p, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument, "the comm is refused before it reported success");
    expect(cuEventRecord(ev, s) == CUDA_ERROR_ILLEGAL_STATE, "its stream is refused before the comm reported success");
    expect(cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_STATE, "... for synchronization too");
    expect(settle(c) == ncclSuccess, "the comm reports success");
    expect(cuEventRecord(ev, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS, "then the stream is usable");
    expect(ncclAllReduce(p, p, 4, ncclFloat32, ncclSum, c, s) == ncclInProgress && settle(c) == ncclSuccess, "and the comm");
    ncclCommDestroy(c);
    CK(cuStreamSynchronize(s));
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
