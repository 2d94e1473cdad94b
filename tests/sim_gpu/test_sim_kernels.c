/* The simulated driver's modules and launches (fake_cuda_kernels.c) on the
   library's own PTX (src/cuda/kernels.ptx, path in argv[1]): what it
   refuses (not PTX, a target above the device, a kernel it cannot emulate,
   a parameter list that differs, an unknown name, a wrong parameter count,
   `extra`, a 2-D launch, a function of an unloaded module, memory that is
   not the device's) and what the emulated kernels compute on values whose
   IEEE 754 results are known (ties to even, subnormals, overflow, NaNs). */
#include "cuda.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
static void check(const char *what, int ok) {
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "FAIL %s\n", what);
}
#define CU(x)                                                                     \
    do {                                                                          \
        CUresult r_ = (x);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                 \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, (int)r_); \
            exit(2);                                                              \
        }                                                                         \
    } while (0)

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    return s;
}

/* `ptx` with the first `from` replaced by `to`. */
static char *edit(const char *ptx, const char *from, const char *to) {
    const char *at = strstr(ptx, from);
    char *s = calloc(1, strlen(ptx) + strlen(to) + 1);
    if (!at) return strcpy(s, ptx);
    memcpy(s, ptx, (size_t)(at - ptx));
    strcat(s, to);
    strcat(s, at + strlen(from));
    return s;
}

static CUresult load(const char *text) {
    CUmodule m = NULL;
    CUresult r = cuModuleLoadData(&m, text);
    if (r == CUDA_SUCCESS) cuModuleUnload(m);
    return r;
}

static void refusals(const char *ptx) {
    check("not PTX: CUDA_ERROR_INVALID_IMAGE", load("\x7f" "ELF not ptx") == CUDA_ERROR_INVALID_IMAGE);
    char *s = edit(ptx, ".target sm_52", ".target sm_100");
    check("a target above sm_90: CUDA_ERROR_NO_BINARY_FOR_GPU", load(s) == CUDA_ERROR_NO_BINARY_FOR_GPU);
    free(s);
    s = edit(ptx, ".version 7.0", ".version 9.9");
    check("PTX ISA 9.9: CUDA_ERROR_UNSUPPORTED_PTX_VERSION", load(s) == CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
    free(s);
    s = edit(ptx, ".address_size 64", ".address_size 32");
    check("32-bit addresses: CUDA_ERROR_INVALID_IMAGE", load(s) == CUDA_ERROR_INVALID_IMAGE);
    free(s);
    s = edit(ptx, ".entry tc_div_f16(", ".entry tc_div_f64(");
    check("a kernel with no emulation: CUDA_ERROR_INVALID_PTX", load(s) == CUDA_ERROR_INVALID_PTX);
    free(s);
    s = edit(ptx, ".param .f32 tc_div_f16_divisor", ".param .f64 tc_div_f16_divisor");
    check("a parameter type that differs: CUDA_ERROR_INVALID_PTX", load(s) == CUDA_ERROR_INVALID_PTX);
    free(s);
    s = edit(ptx, "\t.param .u64 tc_cast_f32_f16_n\n", "\t.param .u64 tc_cast_f32_f16_n,\n\t.param .u64 x\n");
    check("an extra parameter: CUDA_ERROR_INVALID_PTX", load(s) == CUDA_ERROR_INVALID_PTX);
    free(s);
}

static CUdeviceptr dev_copy(const void *h, size_t bytes) {
    CUdeviceptr d;
    CU(cuMemAlloc(&d, bytes));
    CU(cuMemcpyHtoD(d, h, bytes));
    /* from pageable memory the copy may return before the device has the
       data, and the legacy stream is not ordered with a non-blocking one */
    CU(cuStreamSynchronize(NULL));
    return d;
}

/* Runs kernel `name` of m over n elements of `in` (in place for tc_div_*),
   compares the result with `want`. */
static void run(CUmodule m, CUstream s, const char *name, const void *in, size_t in_size, const uint16_t *want, size_t n,
                float divisor) {
    CUfunction f;
    CU(cuModuleGetFunction(&f, m, name));
    CUdeviceptr src = dev_copy(in, n * in_size), dst = src;
    uint64_t a = src, b, count = n;
    void *cast_args[] = {&a, &b, &count, NULL}, *div_args[] = {&a, &count, &divisor, NULL};
    int div = strncmp(name, "tc_div", 6) == 0;
    if (!div) CU(cuMemAlloc(&dst, n * 2));
    b = dst;
    CU(cuLaunchKernel(f, 1, 1, 1, 4, 1, 1, 0, s, div ? div_args : cast_args, NULL));
    uint16_t got[32];
    CU(cuStreamSynchronize(s));
    CU(cuMemcpyDtoH(got, dst, n * 2));
    for (size_t i = 0; i < n; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s element %zu: 0x%04x, expected 0x%04x", name, i, got[i], want[i]);
        check(what, got[i] == want[i]);
    }
    CU(cuMemFree(src));
    if (!div) CU(cuMemFree(dst));
}

static float fbits(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static void values(CUmodule m, CUstream s) {
    const float f32_in[] = {1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65519.0f, 65520.0f, 0x1p-24f,
                            0x1p-25f, 3 * 0x1p-25f, -0.0f, fbits(0xffc00001u), fbits(0xff800000u), 0x1p-14f - 0x1p-26f};
    const uint16_t to_f16[] = {0x3c00, 0x3c00, 0x3c02, 0x7bff, 0x7bff, 0x7c00, 0x0001,
                               0x0000, 0x0002, 0x8000, 0xfe00, 0xfc00, 0x0400};
    run(m, s, "tc_cast_f32_f16", f32_in, 4, to_f16, 13, 0);
    const float bf_in[] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, fbits(0x7fa00000u), fbits(0x7f7fffffu), -0x1p-134f};
    const uint16_t to_bf16[] = {0x3f80, 0x3f80, 0x3f82, 0x7fe0, 0x7f80, 0x8000};
    run(m, s, "tc_cast_f32_bf16", bf_in, 4, to_bf16, 6, 0);
    /* 1/3 = 0x3555; 3 * 2^-24 / 2 and 2^-24 / 2: ties to even in the subnormals;
       -NaN keeps its sign; 65504 / 3 */
    const uint16_t h_in[] = {0x3c00, 0x0003, 0x0001, 0xfe01, 0x7bff};
    const uint16_t h_div3[] = {0x3555, 0x0001, 0x0000, 0xfe00, 0x7555};
    const uint16_t h_div2[] = {0x3800, 0x0002, 0x0000, 0xfe00, 0x77ff};
    run(m, s, "tc_div_f16", h_in, 2, h_div3, 5, 3);
    run(m, s, "tc_div_f16", h_in, 2, h_div2, 5, 2);
    /* bfloat16 1/3 = 0x3eab; a NaN input keeps its bits | 0x40 */
    const uint16_t b_in[] = {0x3f80, 0xff81, 0x4040};
    const uint16_t b_div3[] = {0x3eab, 0xffc1, 0x3f80};
    run(m, s, "tc_div_bf16", b_in, 2, b_div3, 3, 3);
    /* float16 -> bfloat16: 1 + 2^-10 rounds to even, 65504 up to 65536 */
    const uint16_t hb_in[] = {0x3c01, 0x7bff, 0x0001};
    const uint16_t hb_want[] = {0x3f80, 0x4780, 0x3380};
    run(m, s, "tc_cast_f16_bf16", hb_in, 2, hb_want, 3, 0);
}

static void launch_refusals(CUmodule m, CUstream s) {
    CUfunction f;
    check("an unknown name: CUDA_ERROR_NOT_FOUND", cuModuleGetFunction(&f, m, "tc_cast_f64_f16") == CUDA_ERROR_NOT_FOUND);
    CU(cuModuleGetFunction(&f, m, "tc_cast_f32_f16"));
    CUdeviceptr d;
    CU(cuMemAlloc(&d, 64));
    uint64_t a = d, b = d + 32, n = 4, x = 0;
    void *two[] = {&a, &b, NULL}, *four[] = {&a, &b, &n, &x, NULL}, *three[] = {&a, &b, &n, NULL};
    check("two parameters of three: CUDA_ERROR_INVALID_VALUE",
          cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, two, NULL) == CUDA_ERROR_INVALID_VALUE);
    check("four parameters of three: CUDA_ERROR_INVALID_VALUE",
          cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, four, NULL) == CUDA_ERROR_INVALID_VALUE);
    check("arguments in extra: CUDA_ERROR_INVALID_VALUE",
          cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, three, (void **)three) == CUDA_ERROR_INVALID_VALUE);
    check("a 2-D grid: CUDA_ERROR_INVALID_VALUE",
          cuLaunchKernel(f, 1, 2, 1, 32, 1, 1, 0, s, three, NULL) == CUDA_ERROR_INVALID_VALUE);
    check("2048 threads a block: CUDA_ERROR_INVALID_VALUE",
          cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, s, three, NULL) == CUDA_ERROR_INVALID_VALUE);
    check("a legal launch", cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, three, NULL) == CUDA_SUCCESS);
    CU(cuStreamSynchronize(s));
    CUmodule m2;
    CU(cuModuleLoadData(&m2, "// a module\n.version 8.0 .target sm_90 .address_size 64\n"
                             ".visible .entry tc_div_bf16(.param .u64 p, .param .u64 q, .param .f32 r) { ret; }\n"));
    CUfunction g;
    CU(cuModuleGetFunction(&g, m2, "tc_div_bf16"));
    check("only the module's own entries", cuModuleGetFunction(&f, m2, "tc_cast_f32_f16") == CUDA_ERROR_NOT_FOUND);
    CU(cuModuleUnload(m2));
    float dv = 2;
    void *dargs[] = {&a, &n, &dv, NULL};
    check("a function of an unloaded module: CUDA_ERROR_INVALID_HANDLE",
          cuLaunchKernel(g, 1, 1, 1, 32, 1, 1, 0, s, dargs, NULL) == CUDA_ERROR_INVALID_HANDLE);
    check("a second unload: CUDA_ERROR_INVALID_HANDLE", cuModuleUnload(m2) == CUDA_ERROR_INVALID_HANDLE);
    CU(cuMemFree(d));
    /* Last: memory past the allocation is a device fault (sticky). */
    CU(cuMemAlloc(&d, 8));
    a = d, b = d + 4, n = 1000;
    CU(cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, s, three, NULL));
    check("a kernel past the end of its buffers: CUDA_ERROR_ILLEGAL_ADDRESS",
          cuStreamSynchronize(s) == CUDA_ERROR_ILLEGAL_ADDRESS);
}

int main(int argc, char **argv) {
    char *ptx = argc > 1 ? read_file(argv[1]) : NULL;
    if (!ptx) {
        fprintf(stderr, "usage: %s path/to/kernels.ptx\n", argv[0]);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    CU(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CU(cuDeviceGet(&dev, 0));
    CUmodule m;
    check("no current context: CUDA_ERROR_INVALID_CONTEXT", cuModuleLoadData(&m, ptx) == CUDA_ERROR_INVALID_CONTEXT);
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    refusals(ptx);
    CU(cuModuleLoadData(&m, ptx));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    values(m, s);
    launch_refusals(m, s);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
