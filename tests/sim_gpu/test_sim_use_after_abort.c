/* The simulated NCCL frees a comm in ncclCommAbort as NCCL does: any later
   use of the handle must end the process with a message (a use-after-free
   with real NCCL), not answer an error code a caller could get away with.
   Run by run-sim.sh, which expects this program to die by SIGABRT with
   "use-after-free" on stderr; reaching the end is a failure. */
#include <stdio.h>
#include "cuda.h"

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
int ncclCommCount(ncclComm_t comm, int *count);
int ncclCommAbort(ncclComm_t comm);

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 2;
    ncclUniqueId id;
    ncclComm_t c = NULL;
    int n = 0;
    if (ncclGetUniqueId(&id) || ncclCommInitRank(&c, 1, id, 0) || ncclCommCount(c, &n) || n != 1) return 2;
    if (ncclCommAbort(c)) return 2;
    ncclCommCount(c, &n); /* must not return */
    printf("0 passed, 1 failed (a use after ncclCommAbort returned)\n");
    return 1;
}
