/* Helpers of the GPU tests: CUDA driver calls checked, device buffers,
   dtype conversion for host references. Built on the GPU machine by
   `make gpu-test` (needs cuda.h and libcuda). */
#ifndef GPU_UTIL_H
#define GPU_UTIL_H

#include "capi_util.h" /* first: it sets _POSIX_C_SOURCE */
#include <cuda.h>
#include <math.h>
#include <stdint.h>

#define CU(call)                                                                   \
    do {                                                                           \
        CUresult r_ = (call);                                                      \
        if (r_ != CUDA_SUCCESS) {                                                  \
            const char *n_ = NULL;                                                 \
            cuGetErrorName(r_, &n_);                                               \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,   \
                    n_ ? n_ : "?");                                                \
            exit(2);                                                               \
        }                                                                          \
    } while (0)

static inline int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* Makes the primary context of local rank % device count current (the same
   device the library picks for index -1). */
static CUcontext gpu_setup(void) {
    CU(cuInit(0));
    int n = 0;
    CU(cuDeviceGetCount(&n));
    int local = env_int("LOCAL_RANK", 0);
    CUdevice dev;
    CU(cuDeviceGet(&dev, local % n));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    return ctx;
}

/* A comm (abort_on_error off, so a failure is a result the test can
   report), or NULL after printing why; the result goes to *rc. */
static inline tc_comm_t *test_comm_new(const char *backend, tc_device_t dev, const char *name,
                                       tc_result_t *rc) {
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.abort_on_error = 0;
    co.name = name;
    tc_comm_t *comm = NULL;
    *rc = tc_comm_new(backend, dev, &co, &comm);
    if (*rc != TC_SUCCESS) {
        fprintf(stderr, "tc_comm_new(%s): %s: %s\n", backend, tc_result_string(*rc), tc_last_error());
        return NULL;
    }
    return comm;
}

/* The synchronous copy and memset functions run on the legacy stream,
   which a CU_STREAM_NON_BLOCKING stream (the tests' and the library's) does
   not wait for; and cuMemsetD8, or cuMemcpyHtoD from pageable memory, may
   return before the device has the data. So each helper waits for the legacy
   stream before the data is used on another stream. */
static inline void dmemset(void *p, unsigned char v, size_t bytes) {
    CU(cuMemsetD8((CUdeviceptr)(uintptr_t)p, v, bytes));
    CU(cuStreamSynchronize(NULL));
}
static inline void *dalloc(size_t bytes) {
    CUdeviceptr p;
    CU(cuMemAlloc(&p, bytes ? bytes : 1));
    dmemset((void *)(uintptr_t)p, 0, bytes ? bytes : 1);
    return (void *)(uintptr_t)p;
}
static inline void dfree(void *p) { CU(cuMemFree((CUdeviceptr)(uintptr_t)p)); }
static inline void h2d(void *d, const void *h, size_t bytes) {
    if (bytes) {
        CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)d, h, bytes));
        CU(cuStreamSynchronize(NULL));
    }
}
static inline void d2h(void *h, const void *d, size_t bytes) {
    if (bytes) CU(cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)d, bytes));
}

/* ---- dtypes ------------------------------------------------------------ */

static inline size_t dt_size(tc_dtype_t t) {
    switch (t) {
    case TC_FLOAT64: case TC_INT64: case TC_UINT64: return 8;
    case TC_FLOAT32: case TC_INT32: case TC_UINT32: return 4;
    case TC_FLOAT16: case TC_BFLOAT16: return 2;
    default: return 1;
    }
}
static inline const char *dt_name(tc_dtype_t t) {
    static const char *n[] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool", "u32", "u64", "f8e4m3", "f8e5m2"};
    return (t >= 0 && t <= 12) ? n[t] : "?";
}
static inline int dt_float(tc_dtype_t t) { return t == TC_FLOAT32 || t == TC_FLOAT64 || t == TC_FLOAT16 || t == TC_BFLOAT16; }

static inline uint16_t f_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffff;
    if (e <= 0) return (uint16_t)sign; /* tests use values that never underflow */
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
    if ((m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}
static inline float half_to_f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0) x = sign; /* zero (no subnormals in tests) */
    else if (e == 31) x = sign | 0x7f800000 | (m << 13);
    else x = sign | ((e - 15 + 127) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline uint16_t f_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
static inline float bf16_to_f(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* fp8: e4m3 (bias 7, no infinities, 0x7f/0xff NaN) and e5m2 (bias 15). */
static inline double fp8_to_d(uint8_t v, int e4m3) {
    int mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 15 : 31;
    int e = (v & 0x7f) >> mb, m = v & ((1 << mb) - 1);
    double x;
    if (e == emax && (!e4m3 || m == (1 << mb) - 1)) x = (!e4m3 && m == 0) ? INFINITY : NAN;
    else if (e == 0) x = ldexp(m, 1 - bias - mb);
    else x = ldexp(m + (1 << mb), e - bias - mb);
    return (v & 0x80) ? -x : x;
}
/* The nearest fp8 value (tests put small integers, which fp8 holds). */
static inline uint8_t d_to_fp8(double v, int e4m3) {
    uint8_t best = 0;
    for (int c = 0; c < 256; c++) {
        double x = fp8_to_d((uint8_t)c, e4m3);
        if (isfinite(x) && fabs(x - v) < fabs(fp8_to_d(best, e4m3) - v)) best = (uint8_t)c;
    }
    return best;
}
static inline int dt_fp8(tc_dtype_t t) { return t == TC_FLOAT8_E4M3 || t == TC_FLOAT8_E5M2; }

static inline void put(tc_dtype_t t, void *buf, size_t i, double v) {
    char *p = (char *)buf + i * dt_size(t);
    switch (t) {
    case TC_FLOAT32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case TC_FLOAT64: memcpy(p, &v, 8); break;
    case TC_FLOAT16: { uint16_t x = f_to_half((float)v); memcpy(p, &x, 2); break; }
    case TC_BFLOAT16: { uint16_t x = f_to_bf16((float)v); memcpy(p, &x, 2); break; }
    case TC_INT8: *(int8_t *)p = (int8_t)v; break;
    case TC_UINT8: *(uint8_t *)p = (uint8_t)v; break;
    case TC_BOOL: *(uint8_t *)p = v != 0; break;
    case TC_INT32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case TC_INT64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case TC_UINT32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case TC_UINT64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case TC_FLOAT8_E4M3: case TC_FLOAT8_E5M2: *(uint8_t *)p = d_to_fp8(v, t == TC_FLOAT8_E4M3); break;
    default: break;
    }
}
static inline double get(tc_dtype_t t, const void *buf, size_t i) {
    const char *p = (const char *)buf + i * dt_size(t);
    switch (t) {
    case TC_FLOAT32: { float x; memcpy(&x, p, 4); return x; }
    case TC_FLOAT64: { double x; memcpy(&x, p, 8); return x; }
    case TC_FLOAT16: { uint16_t x; memcpy(&x, p, 2); return half_to_f(x); }
    case TC_BFLOAT16: { uint16_t x; memcpy(&x, p, 2); return bf16_to_f(x); }
    case TC_INT8: return *(const int8_t *)p;
    case TC_UINT8: case TC_BOOL: return *(const uint8_t *)p;
    case TC_INT32: { int32_t x; memcpy(&x, p, 4); return x; }
    case TC_INT64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case TC_UINT32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case TC_UINT64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    case TC_FLOAT8_E4M3: case TC_FLOAT8_E5M2: return fp8_to_d(*(const uint8_t *)p, t == TC_FLOAT8_E4M3);
    default: return NAN;
    }
}
/* Relative tolerance of a dtype's rounding (0 for integers). */
static inline double dt_tol(tc_dtype_t t) {
    switch (t) {
    case TC_FLOAT16: return 2e-3;
    case TC_BFLOAT16: return 1.6e-2;
    case TC_FLOAT32: return 1e-6;
    case TC_FLOAT64: return 1e-12;
    /* 3 and 2 mantissa bits, rounded at every step of a reduction (a
       product of four ranks rounds three times) */
    case TC_FLOAT8_E4M3: return 0.2;
    case TC_FLOAT8_E5M2: return 0.45;
    default: return 0;
    }
}
static inline int close_enough(tc_dtype_t t, double got, double want) {
    return fabs(got - want) <= dt_tol(t) * fmax(1.0, fabs(want));
}

#endif
