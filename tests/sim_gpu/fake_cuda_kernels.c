/* TEST DOUBLE: modules and kernel launches of the simulated CUDA driver
   (linked with fake_cuda.c into libcuda.so.1). Written for this project; it
   is not NVIDIA's driver and does not compile PTX. What it models:
   - cuModuleLoadData takes PTX text only: after comments, `.version X.Y`
     (6.0 to 9.0; else CUDA_ERROR_UNSUPPORTED_PTX_VERSION), `.target sm_NN`
     (at most sm_90, the simulated device's compute capability 9.0; else
     CUDA_ERROR_NO_BINARY_FOR_GPU) and `.address_size 64`, else
     CUDA_ERROR_INVALID_IMAGE. Every `.entry` must be a kernel this file
     emulates, with exactly the parameter types it expects, else
     CUDA_ERROR_INVALID_PTX; a module belongs to the device of the context
     current at its load;
   - cuModuleGetFunction finds only entries of that module
     (CUDA_ERROR_NOT_FOUND); a function of an unloaded module is an invalid
     handle;
   - cuLaunchKernel needs the module's context current and a stream of its
     device, 1-D grids and blocks (these kernels index x only) of legal
     sizes, kernelParams (no `extra`) holding exactly the kernel's parameter
     count, counted by the NULL entry that libtorchcomm puts after the last
     one (the real driver reads only as many as the kernel has); the
     arguments are copied at the launch and the kernel runs on the stream,
     in its order (recorded when it captures), as a host emulation over
     device memory: a pointer that is not device memory of the needed size,
     or overlapping source and destination, is a device fault.
   The emulations are written from IEEE 754 rules, independently of the
   library's Rust conversions (value-based rounding with frexp/ldexp/rint,
   ties to even), so the tests compare two implementations:
     tc_cast_<a>_<b>(u64 src, u64 dst, u64 n): dst[i] = (b) src[i]
     tc_div_<t>(u64 buf, u64 n, f32 divisor):  buf[i] = (t)((float)buf[i] / divisor)
   with NaNs as the PTX documents them (to float16: sign | 0x7e00; to
   bfloat16: (bits >> 16) | 0x40; to float32: payload kept, made quiet; a
   NaN input of tc_div_* keeps its sign). */
#define _GNU_SOURCE
#include "sim_gpu.h"
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAGIC_MODULE 0x4d4f444cu
#define MAGIC_FUNC 0x46554e43u

enum elem { E_F32, E_F16, E_BF16 };
static const size_t elem_size[] = {4, 2, 2};

struct kdef {
    const char *name, *sig; /* parameter types, comma-separated */
    int divide;
    enum elem from, to;
};
static const struct kdef kdefs[] = {
    {"tc_cast_f32_f16", "u64,u64,u64", 0, E_F32, E_F16},
    {"tc_cast_f32_bf16", "u64,u64,u64", 0, E_F32, E_BF16},
    {"tc_cast_f16_f32", "u64,u64,u64", 0, E_F16, E_F32},
    {"tc_cast_bf16_f32", "u64,u64,u64", 0, E_BF16, E_F32},
    {"tc_cast_f16_bf16", "u64,u64,u64", 0, E_F16, E_BF16},
    {"tc_cast_bf16_f16", "u64,u64,u64", 0, E_BF16, E_F16},
    {"tc_div_f16", "u64,u64,f32", 1, E_F16, E_F16},
    {"tc_div_bf16", "u64,u64,f32", 1, E_BF16, E_BF16},
};
#define NKDEFS (sizeof kdefs / sizeof kdefs[0])
#define MAX_ENTRIES 16

struct CUfunc_st {
    unsigned magic;
    struct CUmod_st *mod;
    const struct kdef *k;
};
struct CUmod_st {
    unsigned magic;
    int dead, device, n;
    struct CUfunc_st fns[MAX_ENTRIES];
    struct CUmod_st *next_all; /* unloaded modules stay listed: a late use is reported */
};
static pthread_mutex_t M = PTHREAD_MUTEX_INITIALIZER;
static struct CUmod_st *modules;

static CUresult refuse(CUresult r, const char *fn, const char *why, const char *what) {
    fprintf(stderr, "[sim-cuda] %s: %s%s%s\n", fn, why, what ? ": " : "", what ? what : "");
    return r;
}

/* ---- conversions (IEEE 754, round to nearest even) ---------------------- */

static float bits_f(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint32_t f_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}
/* |a| rounded to `sig` significant bits, with no step finer than 2^min_q. */
static double round_sig(double a, int sig, int min_q) {
    int e;
    frexp(a, &e);
    int q = e - sig < min_q ? min_q : e - sig;
    return ldexp(rint(ldexp(a, -q)), q);
}
static uint16_t to_f16(uint32_t x) {
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    if ((x & 0x7fffffffu) > 0x7f800000u) return sign | 0x7e00;
    double v = round_sig(fabs((double)bits_f(x)), 11, -24);
    if (v > 65504) return sign | 0x7c00;
    if (v < 0x1p-14) return sign | (uint16_t)ldexp(v, 24);
    int e;
    double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)(ldexp(m, 11) - 1024);
}
static uint16_t to_bf16(uint32_t x) {
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    double v = round_sig(fabs((double)bits_f(x)), 8, -133);
    if (v >= 0x1p128) return sign | 0x7f80;
    if (v < 0x1p-126) return sign | (uint16_t)ldexp(v, 133);
    int e;
    double m = frexp(v, &e);
    return sign | (uint16_t)((e + 126) << 7) | (uint16_t)(ldexp(m, 8) - 128);
}
static uint32_t from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    int e = (h >> 10) & 31, f = h & 1023;
    if (e == 31 && f) return sign | 0x7fc00000u | ((uint32_t)f << 13); /* NaN: payload kept, made quiet */
    if (e == 31) return sign | 0x7f800000u;
    double v = e ? ldexp(1024 + f, e - 25) : ldexp(f, -24);
    return sign | f_bits((float)v);
}
static uint32_t load(enum elem t, const char *p, size_t i) {
    uint32_t x = 0;
    uint16_t h;
    if (t == E_F32) memcpy(&x, p + 4 * i, 4);
    else {
        memcpy(&h, p + 2 * i, 2);
        x = t == E_F16 ? from_f16(h) : (uint32_t)h << 16 | ((h & 0x7fff) > 0x7f80 ? 0x400000u : 0);
    }
    return x;
}
static void store(enum elem t, char *p, size_t i, uint32_t x) {
    uint16_t h;
    if (t == E_F32) memcpy(p + 4 * i, &x, 4);
    else {
        h = t == E_F16 ? to_f16(x) : to_bf16(x);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* ---- launches ------------------------------------------------------------ */

struct launch {
    const struct kdef *k;
    uint64_t a, b, n;
    float divisor;
};

static void run_kernel(void *p) {
    struct launch *l = p;
    const struct kdef *k = l->k;
    size_t n = (size_t)l->n;
    char *src = simcu_device_view((void *)(uintptr_t)l->a, n * elem_size[k->from]);
    char *dst = k->divide ? src : simcu_device_view((void *)(uintptr_t)l->b, n * elem_size[k->to]);
    if (!src || !dst) {
        simcu_fault("kernel %s over %zu elements: %p or %p is not device memory of that size", k->name, n,
                    (void *)(uintptr_t)l->a, (void *)(uintptr_t)l->b);
        return;
    }
    if (!k->divide && src < dst + n * elem_size[k->to] && dst < src + n * elem_size[k->from]) {
        simcu_fault("kernel %s: source and destination overlap (threads would race)", k->name);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t x = load(k->from, src, i);
        if (k->divide) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            int nan = k->from == E_F16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
            x = f_bits(bits_f(x) / l->divisor);
            if (nan) {
                h = k->from == E_F16 ? (uint16_t)((h & 0x8000) | 0x7e00) : (uint16_t)(h | 0x40);
                memcpy(dst + 2 * i, &h, 2);
                continue;
            }
        }
        store(k->to, dst, i, x);
    }
}

/* Under M. */
static struct CUfunc_st *func_of(CUfunction f) {
    for (struct CUmod_st *m = modules; m; m = m->next_all)
        for (int i = 0; i < m->n; i++)
            if (&m->fns[i] == f) return m->dead ? NULL : f;
    return NULL;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shared, CUstream h, void **params, void **extra) {
    CUcontext ctx;
    CUresult r = cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&M);
    struct CUfunc_st *fn = func_of(f);
    int device = fn ? fn->mod->device : -1;
    pthread_mutex_unlock(&M);
    if (!fn) return refuse(CUDA_ERROR_INVALID_HANDLE, __func__, "not a function of a loaded module", NULL);
    const struct kdef *k = fn->k;
    if (!ctx || simcu_current_device() != device)
        return refuse(CUDA_ERROR_INVALID_CONTEXT, __func__, "the module's context is not current", k->name);
    int sd = simcu_stream_device(h);
    if (sd >= 0 && sd != device) return refuse(CUDA_ERROR_INVALID_HANDLE, __func__, "a stream of another device", k->name);
    if (!gx || !gy || !gz || !bx || !by || !bz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 || bx > 1024 ||
        (unsigned long)bx * by * bz > 1024 || shared > 48 * 1024)
        return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "illegal grid, block or shared memory size", k->name);
    if (gy != 1 || gz != 1 || by != 1 || bz != 1)
        return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "the kernel is 1-D (a y or z size would repeat its work)",
                      k->name);
    if (extra || !params)
        return refuse(CUDA_ERROR_INVALID_VALUE, __func__, "arguments must come in kernelParams (no extra)", k->name);
    int want = 1;
    for (const char *c = k->sig; *c; c++) want += *c == ',';
    int got = 0;
    while (got <= want && params[got]) got++;
    if (got != want) {
        fprintf(stderr, "[sim-cuda] cuLaunchKernel: %s takes %d parameters, kernelParams holds %d%s\n", k->name, want,
                got, got > want ? " or more" : "");
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct launch *l = calloc(1, sizeof *l);
    l->k = k;
    memcpy(&l->a, params[0], 8);
    if (k->divide) {
        memcpy(&l->n, params[1], 8);
        memcpy(&l->divisor, params[2], 4);
    } else {
        memcpy(&l->b, params[1], 8);
        memcpy(&l->n, params[2], 8);
    }
    return simcu_launch(h, run_kernel, l, free);
}

/* ---- modules ------------------------------------------------------------- */

static const char *skip_space(const char *p) {
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') p++;
        } else if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            p = e ? e + 2 : p + strlen(p);
        } else {
            return p;
        }
    }
}

/* The header: .version, .target, .address_size, in this order. */
static CUresult check_header(const char **pp) {
    const char *p = skip_space(*pp);
    int major, minor, sm, n = 0;
    if (sscanf(p, ".version %d.%d%n", &major, &minor, &n) != 2 || !n)
        return refuse(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "not PTX text (no .version first)", NULL);
    if (major < 6 || major * 10 + minor > 90)
        return refuse(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "cuModuleLoadData", "PTX ISA version outside 6.0 .. 9.0",
                      NULL);
    p = skip_space(p + n);
    n = 0;
    if (sscanf(p, ".target sm_%d%n", &sm, &n) != 1 || !n)
        return refuse(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "no .target sm_NN after .version", NULL);
    if (sm > 90 || sm < 50)
        return refuse(CUDA_ERROR_NO_BINARY_FOR_GPU, "cuModuleLoadData", "target not runnable on compute capability 9.0",
                      NULL);
    p = skip_space(p + n);
    if (strncmp(p, ".address_size 64", 16) != 0)
        return refuse(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData", "no .address_size 64 after .target", NULL);
    *pp = p + 16;
    return CUDA_SUCCESS;
}

/* Parses one ".entry name(.param .T a, ...)" at p (just after ".entry"):
   the emulated kernel it names, with the parameter types it expects. */
static CUresult parse_entry(const char *p, const struct kdef **out) {
    char name[128], sig[128] = "", ty[16];
    int n = 0;
    if (sscanf(p, " %127[A-Za-z0-9_$]%n", name, &n) != 1)
        return refuse(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData", "an .entry without a name", NULL);
    p = skip_space(p + n);
    if (*p++ != '(') return refuse(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData", "no parameter list", name);
    for (;;) {
        p = skip_space(p);
        if (*p == ')') break;
        n = 0;
        if (sscanf(p, ".param .%15[a-z0-9] %*[A-Za-z0-9_$]%n", ty, &n) != 1 || !n)
            return refuse(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData", "a parameter that is not `.param .TYPE NAME`", name);
        if (strlen(sig) + strlen(ty) + 2 > sizeof sig)
            return refuse(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData", "too many parameters", name);
        if (*sig) strcat(sig, ",");
        strcat(sig, ty);
        p = skip_space(p + n);
        if (*p == ',') p++;
        else if (*p != ')') return refuse(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData", "bad parameter list", name);
    }
    for (size_t i = 0; i < NKDEFS; i++) {
        if (strcmp(kdefs[i].name, name) != 0) continue;
        if (strcmp(kdefs[i].sig, sig) != 0) {
            fprintf(stderr, "[sim-cuda] cuModuleLoadData: %s has parameters (%s), the emulation expects (%s)\n", name,
                    sig, kdefs[i].sig);
            return CUDA_ERROR_INVALID_PTX;
        }
        *out = &kdefs[i];
        return CUDA_SUCCESS;
    }
    return refuse(CUDA_ERROR_INVALID_PTX, "cuModuleLoadData", "a kernel the simulated driver cannot emulate", name);
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    CUcontext ctx;
    CUresult r = cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS) return r;
    if (!ctx) return refuse(CUDA_ERROR_INVALID_CONTEXT, __func__, "no current context", NULL);
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    const char *p = image;
    if ((r = check_header(&p)) != CUDA_SUCCESS) return r;
    struct CUmod_st *m = calloc(1, sizeof *m);
    m->magic = MAGIC_MODULE;
    m->device = simcu_current_device();
    int depth = 0;
    for (const char *c = p; *c; c++) depth += *c == '{' ? 1 : *c == '}' ? -1 : 0;
    if (depth != 0) r = refuse(CUDA_ERROR_INVALID_PTX, __func__, "unbalanced braces", NULL);
    for (const char *e = strstr(p, ".entry"); r == CUDA_SUCCESS && e; e = strstr(e + 6, ".entry")) {
        if (m->n == MAX_ENTRIES) r = refuse(CUDA_ERROR_INVALID_PTX, __func__, "too many entries", NULL);
        else if ((r = parse_entry(e + 6, &m->fns[m->n].k)) == CUDA_SUCCESS) {
            m->fns[m->n].magic = MAGIC_FUNC;
            m->fns[m->n++].mod = m;
        }
    }
    if (r == CUDA_SUCCESS && m->n == 0) r = refuse(CUDA_ERROR_INVALID_PTX, __func__, "no .entry", NULL);
    if (r != CUDA_SUCCESS) {
        free(m);
        return r;
    }
    pthread_mutex_lock(&M);
    m->next_all = modules;
    modules = m;
    pthread_mutex_unlock(&M);
    *module = m;
    return CUDA_SUCCESS;
}

/* Under M. */
static struct CUmod_st *module_of(CUmodule h) {
    for (struct CUmod_st *m = modules; m; m = m->next_all)
        if (m == h) return m->dead ? NULL : m;
    return NULL;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CUcontext ctx;
    CUresult r = cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS) return r;
    if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&M);
    struct CUmod_st *m = module_of(hmod);
    r = m ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; m && i < m->n; i++)
        if (strcmp(m->fns[i].k->name, name) == 0) {
            *hfunc = &m->fns[i];
            r = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&M);
    if (r != CUDA_SUCCESS) refuse(r, __func__, m ? "no such kernel in the module" : "not a loaded module", name);
    return r;
}

EXPORT CUresult cuModuleUnload(CUmodule hmod) {
    CUcontext ctx;
    CUresult r = cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&M);
    struct CUmod_st *m = module_of(hmod);
    if (m) m->dead = 1;
    pthread_mutex_unlock(&M);
    return m ? CUDA_SUCCESS : refuse(CUDA_ERROR_INVALID_HANDLE, __func__, "not a loaded module", NULL);
}
