/* The gradient reducer on device memory: on an nccl comm (buckets in device
   memory from the comm's allocator, copies on the reducer's stream,
   TC_HOOK_ALLREDUCE as PREMUL_SUM, finalize and finalize_async), and on a
   gloo comm given CUDA gradients (host buckets, copies on the stream).
   A mixed gradient list (float32, float16, bfloat16, empty ones) written on
   a non-default stream just before it is marked, marked in reverse order
   over several iterations, every element checked against a host reference;
   values are small integers so that every dtype and world size 1, 2, 4
   gives exact results. Also: gradient_as_bucket_view, TC_HOOK_NOOP, and a
   gradient never marked (every rank fails, nothing written back).
   The compressing hooks (TC_HOOK_FP16_COMPRESS, TC_HOOK_BF16_COMPRESS; on
   nccl through the library's PTX kernels) get fractions of many magnitudes,
   so that every cast and the division round (float16 subnormals included),
   and every element is checked against a reference computed here the way
   torch's fp16_compress_hook / bf16_compress_hook do it (cast to half
   precision, divide by the world size in it, sum in it, cast back): exactly
   on 1 and 2 ranks and on the simulated NCCL (which sums in rank order);
   with more ranks on real NCCL within the rounding another summation order
   allows. */
#include "gpu_util.h"

enum { NG = 40 };
static size_t counts[NG];
static tc_dtype_t dtypes[NG];
static int R, N, passed, failed, skipped;
static CUstream stream;

static void report(const char *what, int ok) {
    ok ? passed++ : failed++;
    if (!ok) fprintf(stderr, "rank %d: FAIL %s (last error: %s)\n", R, what, tc_last_error());
}

static void make_list(void) {
    const tc_dtype_t kinds[3] = {TC_FLOAT32, TC_FLOAT16, TC_BFLOAT16};
    for (int g = 0; g < NG; g++) {
        counts[g] = g % 9 == 4 ? 0 : (size_t)(1 + (g * 797) % 3000);
        dtypes[g] = kinds[(g / 3) % 3];
    }
}

/* Values for the compressing hooks instead of the small integers. */
static int fractional;

/* A fraction in [0.5, 1.5) times 2^-27 .. 2^12, either sign: sums of up to
   4 stay far below float16's largest value, and the smallest ones fall
   below float16's subnormals. */
static double fraction(int r, int g, size_t i, int it) {
    uint32_t h = (uint32_t)g * 2654435761u ^ (uint32_t)i * 40503u ^ (uint32_t)it * 9973u ^ (uint32_t)r * 7919u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    double v = ldexp(0.5 + (double)(h & 0xffffff) / 0x1000000, (int)((h >> 24) % 40) - 27);
    return (h >> 7) & 1 ? -v : v;
}

/* Rank r's value of element i of gradient g in iteration it: a small integer
   (or a fraction, see above). */
static double value(int r, int g, size_t i, int it) {
    if (fractional) return fraction(r, g, i, it);
    return (double)((r + 1) * ((int)((g * 7 + i + it) % 13) - 6));
}

/* Host copy of rank r's gradient g (in its dtype). */
static void host_grad(unsigned char *h, int r, int g, int it) {
    for (size_t i = 0; i < counts[g]; i++) put(dtypes[g], h, i, value(r, g, i, it));
}

static void write_grads(void **d, unsigned char **h, int it) {
    for (int g = 0; g < NG; g++) {
        host_grad(h[g], R, g, it);
        if (counts[g]) CU(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)d[g], h[g], counts[g] * dt_size(dtypes[g]), stream));
    }
}

/* Every element of every gradient: the mean over ranks (reduced), or this
   rank's own value (not reduced). */
static int check_grads(void **d, unsigned char **h, int it, int reduced, const char *label) {
    for (int g = 0; g < NG; g++) {
        d2h(h[g], d[g], counts[g] * dt_size(dtypes[g]));
        for (size_t i = 0; i < counts[g]; i++) {
            double want = 0;
            if (reduced)
                for (int r = 0; r < N; r++) want += value(r, g, i, it) / N;
            else
                want = value(R, g, i, it);
            double got = get(dtypes[g], h[g], i);
            if (got != want) {
                fprintf(stderr, "rank %d: %s: grad %d (%s) element %zu is %g, expected %g\n", R, label, g,
                        dt_name(dtypes[g]), i, got, want);
                return 0;
            }
        }
    }
    return 1;
}

static tc_reducer_t *new_reducer(tc_comm_t *comm, void **d, int as_view) {
    tc_reducer_options_t ro = TC_REDUCER_OPTIONS_INIT;
    ro.bucket_cap_bytes = 16 << 10;
    ro.first_bucket_bytes = 4 << 10;
    ro.gradient_as_bucket_view = as_view;
    ro.stream = (void *)stream;
    tc_reducer_t *r = NULL;
    tc_result_t rc = tc_reducer_new(comm, as_view ? NULL : d, counts, dtypes, NG, &ro, &r);
    report("tc_reducer_new", rc == TC_SUCCESS);
    if (rc != TC_SUCCESS) return NULL;
    if (as_view)
        for (int g = 0; g < NG; g++) report("tc_reducer_get_grad", tc_reducer_get_grad(r, g, &d[g]) == TC_SUCCESS);
    return r;
}

/* One iteration: write, mark in reverse order, finalize (async or not). */
static int iteration(tc_reducer_t *r, void **d, unsigned char **h, int it, int async) {
    write_grads(d, h, it);
    int ok = 1;
    for (int g = NG - 1; g >= 0; g--) ok &= tc_reducer_mark_ready(r, g) == TC_SUCCESS;
    if (async) {
        tc_work_t *w = NULL;
        ok &= tc_reducer_finalize_async(r, &w) == TC_SUCCESS;
        if (w) {
            ok &= tc_work_wait(w, (void *)stream) == TC_SUCCESS;
            tc_work_free(w);
        }
    } else {
        ok &= tc_reducer_finalize(r) == TC_SUCCESS;
    }
    CU(cuStreamSynchronize(stream));
    return ok;
}

/* ---- the compressing hooks, checked the torch way ---------------------- */

/* x rounded to a binary format with `bits` significant bits, smallest step
   2^min_q and largest finite value `max` (ties to even). */
static double round_fmt(double x, int bits, int min_q, double max) {
    if (x == 0 || isnan(x) || isinf(x)) return x;
    int e;
    frexp(fabs(x), &e);
    int q = e - bits < min_q ? min_q : e - bits;
    double r = ldexp(rint(ldexp(fabs(x), -q)), q);
    return copysign(r > max ? INFINITY : r, x);
}
static int fmt_bits(tc_dtype_t t) { return t == TC_FLOAT16 ? 11 : t == TC_BFLOAT16 ? 8 : 24; }
static int fmt_min_q(tc_dtype_t t) { return t == TC_FLOAT16 ? -24 : t == TC_BFLOAT16 ? -133 : -149; }
static double to_dtype(tc_dtype_t t, double x) {
    if (t == TC_FLOAT32) return (double)(float)x;
    return round_fmt(x, fmt_bits(t), fmt_min_q(t), t == TC_FLOAT16 ? 65504.0 : 0x1.fep127);
}
/* One unit in the last place of dtype t at magnitude x. */
static double ulp(tc_dtype_t t, double x) {
    int e;
    frexp(x, &e);
    return ldexp(1, e - fmt_bits(t) < fmt_min_q(t) ? fmt_min_q(t) : e - fmt_bits(t));
}
/* Element i of a buffer of dtype t, exactly (float16 subnormals included). */
static double exact_get(tc_dtype_t t, const unsigned char *p, size_t i) {
    if (t == TC_FLOAT32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t b;
    memcpy(&b, p + 2 * i, 2);
    if (t == TC_BFLOAT16) return bf16_to_f(b);
    int e = (b >> 10) & 31, m = b & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return b & 0x8000 ? -v : v;
}

/* Element i of gradient g after a compressing hook, the torch way: every
   rank's value (as stored in the gradient's dtype) cast to `half`, divided
   by the world size in it (a float32 division rounded once), summed in it
   in rank order (each step rounded), cast back into the gradient's dtype.
   *tol: how much another summation order may change the result. */
static double reference(tc_dtype_t half, int g, size_t i, int it, double *tol) {
    unsigned char tmp[8];
    double acc = 0, big = 0;
    for (int r = 0; r < N; r++) {
        put(dtypes[g], tmp, 0, value(r, g, i, it));
        double x = to_dtype(half, exact_get(dtypes[g], tmp, 0));
        double q = to_dtype(half, (double)((float)x / (float)N));
        acc = r == 0 ? q : to_dtype(half, (double)((float)acc + (float)q));
        big = fmax(big, fmax(fabs(q), fabs(acc)));
    }
    double want = to_dtype(dtypes[g], acc);
    *tol = N * ulp(half, big) + ulp(dtypes[g], fabs(want));
    return want;
}

static int check_compressed(void **d, unsigned char **h, int it, tc_dtype_t half, int exact, const char *label) {
    for (int g = 0; g < NG; g++) {
        d2h(h[g], d[g], counts[g] * dt_size(dtypes[g]));
        for (size_t i = 0; i < counts[g]; i++) {
            double tol, want = reference(half, g, i, it, &tol), got = exact_get(dtypes[g], h[g], i);
            if (exact ? got != want : !(fabs(got - want) <= tol)) {
                fprintf(stderr, "rank %d: %s: grad %d (%s) element %zu is %a, expected %a%s\n", R, label, g,
                        dt_name(dtypes[g]), i, got, want, exact ? "" : " (beyond the summation order's rounding)");
                return 0;
            }
        }
    }
    return 1;
}

/* Both compressing hooks, two iterations each (finalize, finalize_async). */
static void compress_hooks(tc_reducer_t *r, void **d, unsigned char **h, const char *backend, int nccl, int as_view) {
    const char *sim = getenv("TC_GPU_SIMULATION");
    int exact = N <= 2 || (nccl && sim && strcmp(sim, "1") == 0);
    char label[240];
    fractional = 1;
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "TC_HOOK_BF16_COMPRESS" : "TC_HOOK_FP16_COMPRESS";
        tc_dtype_t half = k ? TC_BFLOAT16 : TC_FLOAT16;
        tc_result_t rc = tc_reducer_set_builtin_hook(r, k ? TC_HOOK_BF16_COMPRESS : TC_HOOK_FP16_COMPRESS);
        snprintf(label, sizeof label, "%s: set %s", backend, name);
        report(label, rc == TC_SUCCESS);
        if (rc != TC_SUCCESS) continue;
        for (int it = 20 + 10 * k; it < 22 + 10 * k; it++) {
            snprintf(label, sizeof label, "%s: %s, as_view %d, iteration %d (%s), every element %s", backend, name,
                     as_view, it, it % 2 ? "finalize_async" : "finalize",
                     exact ? "exactly as torch" : "as torch within the summation order's rounding");
            int ok = iteration(r, d, h, it, it % 2);
            report(label, ok && check_compressed(d, h, it, half, exact, label));
        }
    }
    fractional = 0;
    report("set TC_HOOK_ALLREDUCE again", tc_reducer_set_builtin_hook(r, TC_HOOK_ALLREDUCE) == TC_SUCCESS);
}

static void run_backend(tc_comm_t *comm, const char *backend, int nccl, void **d, unsigned char **h) {
    char label[200];
    for (int as_view = 0; as_view < (nccl ? 2 : 1); as_view++) {
        tc_reducer_t *r = new_reducer(comm, d, as_view);
        if (!r) return;
        for (int it = 0; it < 4; it++) {
            snprintf(label, sizeof label, "%s: allreduce hook, as_view %d, iteration %d (%s)", backend, as_view, it,
                     it % 2 ? "finalize_async" : "finalize");
            int ok = iteration(r, d, h, it, it % 2);
            report(label, ok && check_grads(d, h, it, 1, label));
        }
        if (!as_view) {
            report("set TC_HOOK_NOOP", tc_reducer_set_builtin_hook(r, TC_HOOK_NOOP) == TC_SUCCESS);
            snprintf(label, sizeof label, "%s: noop hook leaves the gradients", backend);
            report(label, iteration(r, d, h, 7, 0) && check_grads(d, h, 7, 0, label));
            report("set TC_HOOK_ALLREDUCE", tc_reducer_set_builtin_hook(r, TC_HOOK_ALLREDUCE) == TC_SUCCESS);
            if (N > 1) {
                /* rank 0 never marks gradient 3: every rank fails, nothing written back */
                write_grads(d, h, 9);
                for (int g = NG - 1; g >= 0; g--)
                    if (!(R == 0 && g == 3)) tc_reducer_mark_ready(r, g);
                tc_result_t frc = tc_reducer_finalize(r);
                CU(cuStreamSynchronize(stream));
                snprintf(label, sizeof label, "%s: a gradient never marked fails every rank", backend);
                report(label, frc == TC_ERR_INVALID_USAGE && strstr(tc_last_error(), "rank 0: 3"));
                snprintf(label, sizeof label, "%s: ... and nothing is written back", backend);
                report(label, check_grads(d, h, 9, 0, label));
                snprintf(label, sizeof label, "%s: the next iteration works", backend);
                report(label, iteration(r, d, h, 10, 0) && check_grads(d, h, 10, 1, label));
            }
        }
        compress_hooks(r, d, h, backend, nccl, as_view);
        tc_reducer_free(r);
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    make_list();
    void *d[NG], *own[NG];
    unsigned char *h[NG];
    for (int g = 0; g < NG; g++) {
        size_t b = counts[g] * dt_size(dtypes[g]);
        own[g] = dalloc(b);
        h[g] = malloc(b ? b : 1);
    }
    tc_result_t rc;
    tc_device_t cuda_dev = {TC_DEVICE_CUDA, -1};
    tc_comm_t *comm = test_comm_new("nccl", cuda_dev, "gpu-reducer-nccl", &rc);
    if (!comm) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    memcpy(d, own, sizeof d);
    run_backend(comm, "nccl", 1, d, h);
    report("nccl: finalize", tc_comm_finalize(comm) == TC_SUCCESS);
    tc_comm_destroy(comm);

    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    comm = test_comm_new("gloo", cpu, "gpu-reducer-gloo", &rc);
    if (rc == TC_ERR_UNAVAILABLE) {
        printf("rank %d: SKIP gloo with CUDA gradients: %s\n", R, tc_last_error());
        skipped++;
    } else if (rc != TC_SUCCESS) {
        report("tc_comm_new(gloo)", 0);
    } else {
        memcpy(d, own, sizeof d);
        /* host buckets: gradient_as_bucket_view would make host gradients */
        run_backend(comm, "gloo with CUDA gradients", 0, d, h);
        report("gloo: finalize", tc_comm_finalize(comm) == TC_SUCCESS);
        tc_comm_destroy(comm);
    }
    for (int g = 0; g < NG; g++) {
        dfree(own[g]);
        free(h[g]);
    }
    CU(cuStreamDestroy(stream));
    printf("rank %d: %d passed, %d failed, %d skipped\n", R, passed, failed, skipped);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
