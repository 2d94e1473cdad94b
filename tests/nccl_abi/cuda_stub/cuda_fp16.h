/* Empty stand-in for the CUDA toolkit header (see cuda_runtime.h here). */
