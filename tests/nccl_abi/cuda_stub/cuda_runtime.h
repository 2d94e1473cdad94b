/* Stand-in for the CUDA toolkit's cuda_runtime.h, just enough for nccl.h to
   compile on a machine without CUDA (the ABI check only needs sizes, offsets
   and constants). The real cudaStream_t/cudaEvent_t are pointers too. */
#ifndef TC_CUDA_RUNTIME_STUB_H
#define TC_CUDA_RUNTIME_STUB_H
#define CUDART_VERSION 13000
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif
