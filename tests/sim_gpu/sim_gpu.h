/* TEST DOUBLE: the private interface between our simulated CUDA driver
   (fake_cuda.c) and our simulated NCCL (fake_nccl.c). Not part of any real
   API: the real NCCL reaches the GPU through the CUDA runtime. */
#ifndef TC_SIM_GPU_H
#define TC_SIM_GPU_H
#include "cuda.h"

typedef void (*simcu_kernel_fn)(void *arg);

/* Enqueues a "kernel" on stream s (recorded instead when s is capturing).
   `release(arg)` runs once the work ran (or, for captured work, when the
   last graph holding it is destroyed). */
CUresult simcu_launch(CUstream s, simcu_kernel_fn fn, void *arg, void (*release)(void *));
/* The host-usable view of [addr, addr + bytes) as a kernel sees it: device
   memory (its backing store) or pinned/registered host memory; NULL for
   anything else (plain host memory, freed or out-of-range addresses). */
void *simcu_device_view(const void *addr, size_t bytes);
/* 0: unknown to the driver; CU_MEMORYTYPE_HOST or CU_MEMORYTYPE_DEVICE. */
int simcu_memory_kind(const void *addr);
/* Device memory with an owner tag (1: ncclMemAlloc); cuMemFree refuses
   tagged memory and simcu_free refuses memory of another tag. */
CUresult simcu_alloc(void **p, size_t bytes, int tag);
CUresult simcu_free(void *p, int tag);
/* NCCL's own buffers of a connection (tag SIM_TAG_CONN) on `device`,
   allocated on the calling thread and subject to its capture interaction
   mode as cuMemAlloc is: refused, invalidating the capture it disturbs,
   while a capture the thread's mode protects is running.
   simcu_conn_free releases one (with its comm) without waiting. */
#define SIM_TAG_CONN 2
CUresult simcu_conn_alloc(void **p, size_t bytes, int device);
void simcu_conn_free(void *p);
int simcu_stream_valid(CUstream s);
/* The device ordinal of device memory at addr (-1: not device memory), and
   of a stream (-1: the legacy stream or not a stream). */
int simcu_pointer_device(const void *addr);
int simcu_stream_device(CUstream s);
/* +1: a non-blocking NCCL call on stream s answered ncclInProgress; -1:
   its comm reported success (or was aborted). While held, any use of the
   stream is refused with CUDA_ERROR_ILLEGAL_STATE and a message. */
void simcu_stream_hold(CUstream s, int delta);
/* The device of the calling thread's current context, or -1. */
int simcu_current_device(void);
/* A fault of device code: the context's sticky error becomes
   CUDA_ERROR_ILLEGAL_ADDRESS and the message is printed. */
void simcu_fault(const char *fmt, ...);
#endif
