/* TEST DOUBLE, part of the simulated NCCL (linked into libnccl.so.2 with
   fake_nccl.c): ncclCommInitAll, which makes one comm per device of this
   process. As NCCL documents it, it is ncclCommInitRank for every device of
   the list under one unique id; here each rank is initialized on a thread of
   its own with the device's primary context current, so the comms join one
   job (fake_nccl.c's rendezvous) and a group of calls over them (one call
   per comm between ncclGroupStart and ncclGroupEnd) moves data between the
   devices of this one process. Checks as NCCL makes them: ndev positive,
   device ordinals valid, no device twice ("Duplicate GPU detected"). */
#define _GNU_SOURCE
#include "sim_gpu.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))
typedef int ncclResult_t;
typedef struct ncclComm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };

ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);

struct init_job {
    ncclComm_t *out;
    int ndev, rank, device;
    ncclUniqueId id;
    ncclResult_t result;
};

static void *init_one(void *p) {
    struct init_job *j = p;
    CUcontext ctx = NULL;
    if (cuDevicePrimaryCtxRetain(&ctx, j->device) != CUDA_SUCCESS || cuCtxPushCurrent(ctx) != CUDA_SUCCESS) {
        j->result = ncclUnhandledCudaError;
        return NULL;
    }
    j->result = ncclCommInitRank(j->out, j->ndev, j->id, j->rank);
    cuCtxPopCurrent(&ctx);
    cuDevicePrimaryCtxRelease(j->device);
    return NULL;
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    if (!comms || ndev < 1) {
        fprintf(stderr, "[sim-nccl] ncclCommInitAll: comms is NULL or ndev %d is not positive\n", ndev);
        return ncclInvalidArgument;
    }
    int count = 0;
    if (cuDeviceGetCount(&count) != CUDA_SUCCESS) return ncclUnhandledCudaError;
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= count) {
            fprintf(stderr, "[sim-nccl] ncclCommInitAll: device %d is outside [0, %d)\n", d, count);
            return ncclInvalidArgument;
        }
        for (int k = 0; k < i; k++)
            if ((devlist ? devlist[k] : k) == d) {
                fprintf(stderr, "[sim-nccl] ncclCommInitAll: Duplicate GPU detected: device %d twice\n", d);
                return ncclInvalidUsage;
            }
    }
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return r;
    struct init_job *jobs = calloc((size_t)ndev, sizeof *jobs);
    pthread_t *threads = calloc((size_t)ndev, sizeof *threads);
    for (int i = 0; i < ndev; i++) {
        comms[i] = NULL;
        jobs[i] = (struct init_job){&comms[i], ndev, i, devlist ? devlist[i] : i, id, ncclSuccess};
        pthread_create(&threads[i], NULL, init_one, &jobs[i]);
    }
    for (int i = 0; i < ndev; i++) {
        pthread_join(threads[i], NULL);
        if (jobs[i].result != ncclSuccess && r == ncclSuccess) r = jobs[i].result;
    }
    if (r != ncclSuccess)
        for (int i = 0; i < ndev; i++)
            if (comms[i]) ncclCommDestroy(comms[i]), comms[i] = NULL;
    free(jobs);
    free(threads);
    return r;
}
