/* tc_local_*: one process driving every visible CUDA device (and the CPU),
   torch.cuda.comm's broadcast, broadcast_coalesced, scatter, gather,
   reduce_add and reduce_add_coalesced. Every element of every output is
   checked, and the guard bytes after each output must stay untouched.
   Adapts to the device count (1 on a one-GPU machine: groups of that device
   plus the CPU; the simulation runs it with TC_SIM_DEVICES=2, 3, 4).
   Environment: TORCHCOMM_DEBUG=INFO makes the test check which path ran
   (the library logs it); TC_LOCAL_NCCL=1 / 0 says whether NCCL is expected
   to serve distinct-device groups (unset: not checked). */
#include "gpu_util.h"
#include <stdint.h>

#define MAXD 8
#define GUARD 64 /* bytes after every output that no call may write */
#define FILL 0xEE

static int nd;                 /* visible devices (capped at MAXD) */
static CUcontext ctx[MAXD];
static int log_checks;         /* TORCHCOMM_DEBUG=INFO: path lines visible */
static int expect_nccl = -1;   /* TC_LOCAL_NCCL */

/* ---- memory ------------------------------------------------------------ */

static void push(int d) { CU(cuCtxPushCurrent(ctx[d])); }
static void pop(void) { CUcontext c; CU(cuCtxPopCurrent(&c)); }

/* A buffer of `bytes` + GUARD filled with FILL: on device d, or host (d < 0). */
static void *buf_on(int d, size_t bytes) {
    size_t total = bytes + GUARD;
    if (d < 0) {
        void *p = malloc(total);
        memset(p, FILL, total);
        return p;
    }
    push(d);
    CUdeviceptr p;
    CU(cuMemAlloc(&p, total));
    CU(cuMemsetD8(p, FILL, total));
    CU(cuCtxSynchronize());
    pop();
    return (void *)(uintptr_t)p;
}
static void buf_free(int d, void *p) {
    if (d < 0) { free(p); return; }
    push(d);
    CU(cuMemFree((CUdeviceptr)(uintptr_t)p));
    pop();
}
/* Copies host data into a buffer (device: synchronously). */
static void put_bytes(int d, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (d < 0) { memcpy(dst, src, bytes); return; }
    push(d);
    CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes));
    CU(cuCtxSynchronize());
    pop();
}
/* Waits for every device, then reads `bytes` + GUARD of a buffer. */
static void sync_all(void) {
    for (int d = 0; d < nd; d++) { push(d); CU(cuCtxSynchronize()); pop(); }
}
static unsigned char *read_back(int d, const void *p, size_t bytes) {
    unsigned char *h = malloc(bytes + GUARD);
    if (d < 0) { memcpy(h, p, bytes + GUARD); return h; }
    push(d);
    CU(cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)p, bytes + GUARD));
    pop();
    return h;
}
static int guard_intact(const unsigned char *h, size_t bytes) {
    for (size_t i = 0; i < GUARD; i++) if (h[bytes + i] != FILL) return 0;
    return 1;
}
static int untouched(int d, const void *p, size_t bytes) {
    unsigned char *h = read_back(d, p, bytes);
    int ok = 1;
    for (size_t i = 0; i < bytes + GUARD; i++) if (h[i] != FILL) { ok = 0; break; }
    free(h);
    return ok;
}

/* Value of element i of the input of "owner" k (small integers: exact in
   every dtype, also summed over 8 devices). */
static double val(size_t i, int k) { return (double)((i * 7 + (size_t)k * 3) % 11) + (k % 2); }
static void fill_values(tc_dtype_t t, void *host, size_t n, int k) {
    for (size_t i = 0; i < n; i++) put(t, host, i, val(i, k));
}
/* Checks `n` elements equal val(first + i, k) (or the sum over ks when
   nk > 1) and the guard; reports the first mismatch. */
static int check_values(const char *what, int d, const void *p, tc_dtype_t t, size_t n, size_t first, const int *ks, int nk) {
    unsigned char *h = read_back(d, p, n * dt_size(t));
    int ok = guard_intact(h, n * dt_size(t));
    if (!ok) fprintf(stderr, "%s: guard bytes after %zu elements were written\n", what, n);
    for (size_t i = 0; i < n && ok; i++) {
        double want = 0;
        for (int j = 0; j < nk; j++) want += val(first + i, ks[j]);
        if (t == TC_BOOL) want = want != 0;
        double got = get(t, h, i);
        if (!close_enough(t, got, want)) {
            fprintf(stderr, "%s: element %zu is %g, expected %g (%s)\n", what, i, got, want, dt_name(t));
            ok = 0;
        }
    }
    free(h);
    return ok;
}

/* ---- which path ran (the library's INFO log on stderr) ------------------- */

static char logbuf[1 << 16];
static int saved_fd = -1;
static FILE *cap;
static void capture_begin(void) {
    fflush(stderr);
    cap = tmpfile();
    saved_fd = dup(2);
    dup2(fileno(cap), 2);
}
static const char *capture_end(void) {
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    rewind(cap);
    size_t n = fread(logbuf, 1, sizeof logbuf - 1, cap);
    logbuf[n] = 0;
    fclose(cap);
    return logbuf;
}
/* Runs `call`, expects success, and, where the log is visible, that the
   path named `path` ("NCCL path" or "copies path") ran. */
#define EXPECT_PATH(call, path)                                                                  \
    do {                                                                                         \
        capture_begin();                                                                         \
        tc_result_t rc_ = (call);                                                                \
        const char *log_ = capture_end();                                                        \
        if (rc_ != TC_SUCCESS) {                                                                 \
            fprintf(stderr, "%s:%d: %s failed: %s\n%s", __FILE__, __LINE__, #call, tc_last_error(), log_); \
            capi_failures++;                                                                     \
        } else if (log_checks && (path) && !strstr(log_, (path))) {                              \
            fprintf(stderr, "%s:%d: %s: expected \"%s\" in the log, got:\n%s", __FILE__, __LINE__, #call, \
                    (const char *)(path), log_);                                                 \
            capi_failures++;                                                                     \
        }                                                                                        \
    } while (0)

/* The path a group of distinct CUDA devices takes: NCCL when expected. */
static const char *distinct_path(int nccl_on) {
    if (!nccl_on) return "copies path";
    return expect_nccl == 1 ? "NCCL path" : expect_nccl == 0 ? "copies path" : NULL;
}

static tc_local_t *group(const int *devs, int n, int use_nccl) {
    tc_device_t list[MAXD + 1];
    for (int i = 0; i < n; i++) list[i] = (tc_device_t){devs[i] < 0 ? TC_DEVICE_CPU : TC_DEVICE_CUDA, devs[i] < 0 ? 0 : devs[i]};
    tc_local_options_t o = TC_LOCAL_OPTIONS_INIT;
    o.use_nccl = use_nccl;
    tc_local_t *g = NULL;
    EXPECT_OK(tc_local_new(list, (size_t)n, &o, &g));
    return g;
}

static const tc_dtype_t DTYPES[] = {TC_FLOAT32, TC_INT64, TC_FLOAT16, TC_BFLOAT16, TC_INT32, TC_BOOL, TC_UINT8, TC_FLOAT64};
#define NDT (sizeof DTYPES / sizeof DTYPES[0])

/* ---- broadcast ------------------------------------------------------------ */

/* Broadcast from each member of `devs` (-1: CPU), in place at the root or
   into a separate buffer, with the given streams. */
static void broadcast_case(const int *devs, int n, int use_nccl, const char *path, CUstream *streams) {
    tc_local_t *g = group(devs, n, use_nccl);
    if (!g) return;
    for (int root = 0; root < n; root++)
        for (size_t k = 0; k < NDT; k++) {
            tc_dtype_t t = DTYPES[k];
            size_t count = 1000 + (size_t)root * 7 + k, bytes = count * dt_size(t);
            int in_place = (root + (int)k) % 2;
            void *host = malloc(bytes), *src = buf_on(devs[root], bytes), *dsts[MAXD + 1];
            fill_values(t, host, count, root + 1);
            put_bytes(devs[root], src, host, bytes);
            for (int i = 0; i < n; i++) dsts[i] = i == root && in_place ? src : buf_on(devs[i], bytes);
            EXPECT_PATH(tc_local_broadcast(g, src, (size_t)root, dsts, count, t, (void *const *)streams), path);
            sync_all();
            int ks[1] = {root + 1};
            char what[96];
            for (int i = 0; i < n; i++) {
                snprintf(what, sizeof what, "broadcast n=%d root=%d dst %d", n, root, i);
                CHECK(check_values(what, devs[i], dsts[i], t, count, 0, ks, 1));
            }
            snprintf(what, sizeof what, "broadcast n=%d root=%d source", n, root);
            CHECK(check_values(what, devs[root], src, t, count, 0, ks, 1));
            for (int i = 0; i < n; i++) if (dsts[i] != src) buf_free(devs[i], dsts[i]);
            buf_free(devs[root], src);
            free(host);
        }
    tc_local_free(g);
}

/* ---- reduce_add ------------------------------------------------------------ */

static void reduce_case(const int *devs, int n, int use_nccl, const char *path, CUstream *streams) {
    tc_local_t *g = group(devs, n, use_nccl);
    if (!g) return;
    for (int root = 0; root < n; root++)
        for (size_t k = 0; k < NDT; k++) {
            tc_dtype_t t = DTYPES[k];
            size_t count = 777 + (size_t)root * 5 + k, bytes = count * dt_size(t);
            int in_place = (root + (int)k) % 2, ks[MAXD + 1];
            void *host = malloc(bytes), *srcs[MAXD + 1];
            for (int i = 0; i < n; i++) {
                ks[i] = i + 1;
                srcs[i] = buf_on(devs[i], bytes);
                fill_values(t, host, count, i + 1);
                put_bytes(devs[i], srcs[i], host, bytes);
            }
            void *dst = in_place ? srcs[root] : buf_on(devs[root], bytes);
            EXPECT_PATH(tc_local_reduce_add(g, (const void *const *)srcs, count, t, dst, (size_t)root, (void *const *)streams), path);
            sync_all();
            char what[96];
            snprintf(what, sizeof what, "reduce_add n=%d root=%d%s", n, root, in_place ? " in place" : "");
            CHECK(check_values(what, devs[root], dst, t, count, 0, ks, n));
            for (int i = 0; i < n; i++) {
                if (srcs[i] == dst) continue;
                snprintf(what, sizeof what, "reduce_add n=%d root=%d source %d", n, root, i);
                CHECK(check_values(what, devs[i], srcs[i], t, count, 0, &ks[i], 1));
            }
            if (!in_place) buf_free(devs[root], dst);
            for (int i = 0; i < n; i++) buf_free(devs[i], srcs[i]);
            free(host);
        }
    tc_local_free(g);
}

/* ---- stream order: writes still queued on the members' streams ------------ */

/* A source is stale when the call is issued and gets its final data only
   from the last of `times` copies still queued on its member's stream (the
   ones before write junk, so the stream stays busy with wrong data while
   the others are idle): the operation must see the final data, and its
   result must be complete on the destinations' streams. */
static void rewrite_queued(int d, void *dst, const void *final, const void *junk, size_t bytes, CUstream s, int times) {
    push(d);
    for (int r = 0; r < times; r++) {
        const void *from = r == times - 1 ? final : junk;
        CU(cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)from, bytes, s));
    }
    pop();
}
static void order_case(const int *devs, int n, int use_nccl, const char *path, CUstream *own) {
    tc_local_t *g = group(devs, n, use_nccl);
    if (!g) return;
    size_t count = 4096, bytes = count * 4;
    void *host = malloc(bytes), *srcs[MAXD + 1], *fresh[MAXD + 1], *dsts[MAXD + 1];
    int ks[MAXD + 1];
    for (int i = 0; i < n; i++) {
        srcs[i] = buf_on(devs[i], bytes), fresh[i] = buf_on(devs[i], bytes), dsts[i] = buf_on(devs[i], bytes);
        fill_values(TC_FLOAT32, host, count, 50 + i);
        put_bytes(devs[i], srcs[i], host, bytes);
        fill_values(TC_FLOAT32, host, count, 60 + i);
        put_bytes(devs[i], fresh[i], host, bytes);
        ks[i] = 60 + i;
    }
    /* broadcast: only the root's stream is busy */
    rewrite_queued(devs[0], srcs[0], fresh[0], dsts[0], bytes, own[0], 8);
    EXPECT_PATH(tc_local_broadcast(g, srcs[0], 0, dsts, count, TC_FLOAT32, (void *const *)own), path);
    for (int i = 0; i < n; i++) { push(devs[i]); CU(cuStreamSynchronize(own[i])); pop(); }
    char what[96];
    for (int i = 0; i < n; i++) {
        snprintf(what, sizeof what, "stream order: broadcast output %d", i);
        CHECK(check_values(what, devs[i], dsts[i], TC_FLOAT32, count, 0, &ks[0], 1));
    }
    /* reduce_add into the last member: every stream but the root's is busy */
    void *sum = buf_on(devs[n - 1], bytes); /* (allocating synchronizes: before the rewrites) */
    for (int i = 0; i < n; i++) rewrite_queued(devs[i], srcs[i], fresh[i], sum, bytes, own[i], i == n - 1 ? 1 : 8);
    EXPECT_PATH(tc_local_reduce_add(g, (const void *const *)srcs, count, TC_FLOAT32, sum, (size_t)(n - 1), (void *const *)own), path);
    push(devs[n - 1]);
    CU(cuStreamSynchronize(own[n - 1]));
    pop();
    CHECK(check_values("stream order: reduce_add output", devs[n - 1], sum, TC_FLOAT32, count, 0, ks, n));
    sync_all();
    buf_free(devs[n - 1], sum);
    for (int i = 0; i < n; i++) buf_free(devs[i], srcs[i]), buf_free(devs[i], fresh[i]), buf_free(devs[i], dsts[i]);
    free(host);
    tc_local_free(g);
}

/* ---- coalesced forms --------------------------------------------------------- */

#define NT 6
static const tc_dtype_t CDT[NT] = {TC_FLOAT32, TC_INT64, TC_FLOAT32, TC_FLOAT16, TC_FLOAT32, TC_INT32};
static const size_t CCOUNT[NT] = {33, 10, 0, 301, 5, 64};

static void coalesced_case(const int *devs, int n, int use_nccl, const char *path) {
    tc_local_t *g = group(devs, n, use_nccl);
    if (!g) return;
    const void *srcs[NT], *rsrcs[MAXD * NT];
    void *dsts[MAXD * NT], *rdsts[NT];
    size_t counts[NT];
    tc_dtype_t dts[NT];
    for (int t = 0; t < NT; t++) {
        counts[t] = CCOUNT[t], dts[t] = CDT[t];
        size_t bytes = counts[t] * dt_size(dts[t]);
        void *host = malloc(bytes + 1);
        fill_values(dts[t], host, counts[t], 10 + t);
        void *s = buf_on(devs[0], bytes);
        put_bytes(devs[0], s, host, bytes);
        srcs[t] = s;
        for (int d = 0; d < n; d++) {
            dsts[d * NT + t] = d == 0 && t % 2 ? s : buf_on(devs[d], bytes);
            void *r = buf_on(devs[d], bytes);
            fill_values(dts[t], host, counts[t], d + 2 * t);
            put_bytes(devs[d], r, host, bytes);
            rsrcs[d * NT + t] = r;
        }
        rdsts[t] = t % 3 == 0 ? (void *)rsrcs[(n - 1) * NT + t] : buf_on(devs[n - 1], bytes);
        free(host);
    }
    /* 64-byte buckets: several buckets per dtype */
    EXPECT_PATH(tc_local_broadcast_coalesced(g, srcs, counts, dts, NT, 64, dsts, NULL), path);
    EXPECT_PATH(tc_local_reduce_add_coalesced(g, rsrcs, counts, dts, NT, 0, rdsts, (size_t)(n - 1), NULL), path);
    sync_all();
    for (int t = 0; t < NT; t++) {
        char what[96];
        int k = 10 + t, ks[MAXD];
        for (int d = 0; d < n; d++) {
            snprintf(what, sizeof what, "broadcast_coalesced n=%d buffer %d on member %d", n, t, d);
            CHECK(check_values(what, devs[d], dsts[d * NT + t], dts[t], counts[t], 0, &k, 1));
            ks[d] = d + 2 * t;
        }
        snprintf(what, sizeof what, "reduce_add_coalesced n=%d buffer %d", n, t);
        CHECK(check_values(what, devs[n - 1], rdsts[t], dts[t], counts[t], 0, ks, n));
    }
    for (int t = 0; t < NT; t++) {
        if (rdsts[t] != rsrcs[(n - 1) * NT + t]) buf_free(devs[n - 1], rdsts[t]);
        for (int d = 0; d < n; d++) {
            if (dsts[d * NT + t] != srcs[t]) buf_free(devs[d], dsts[d * NT + t]);
            buf_free(devs[d], (void *)rsrcs[d * NT + t]);
        }
        buf_free(devs[0], (void *)srcs[t]);
    }
    tc_local_free(g);
}

/* ---- scatter (torch.chunk's rule, explicit counts) and gather ------------- */

/* torch.arange(count).chunk(n) element counts, from torch itself (missing
   chunks as 0), for n = 1..4. */
static const struct { int n; size_t count, chunks[5]; } TORCH_CHUNK[] = {
    {1, 0, {0}}, {1, 7, {7}},
    {2, 0, {0, 0}}, {2, 1, {1, 0}}, {2, 3, {2, 1}}, {2, 13, {7, 6}},
    {3, 0, {0, 0, 0}}, {3, 1, {1, 0, 0}}, {3, 4, {2, 2, 0}}, {3, 7, {3, 3, 1}}, {3, 10, {4, 4, 2}}, {3, 13, {5, 5, 3}},
    {4, 0, {0, 0, 0, 0}}, {4, 1, {1, 0, 0, 0}}, {4, 3, {1, 1, 1, 0}}, {4, 5, {2, 2, 1, 0}}, {4, 6, {2, 2, 2, 0}},
    {4, 9, {3, 3, 3, 0}}, {4, 10, {3, 3, 3, 1}}, {4, 13, {4, 4, 4, 1}},
    {5, 0, {0, 0, 0, 0, 0}}, {5, 1, {1, 0, 0, 0, 0}}, {5, 4, {1, 1, 1, 1, 0}}, {5, 7, {2, 2, 2, 1, 0}},
    {5, 13, {3, 3, 3, 3, 1}}, {5, 16, {4, 4, 4, 4, 0}},
};

/* Scatters from `src_dev` (-1: CPU) to the members `devs`, then gathers the
   pieces back into `dst_dev` (-1: CPU), checking both. chunks NULL: torch's
   rule, compared with `want`. */
static void scatter_gather_case(const int *devs, int n, int src_dev, int dst_dev, size_t count, const size_t *chunks, const size_t *want) {
    tc_local_t *g = group(devs, n, TC_UNSET);
    if (!g) return;
    tc_dtype_t t = TC_FLOAT32;
    size_t es = dt_size(t), bytes = count * es;
    void *host = malloc(bytes + 1), *src = buf_on(src_dev, bytes), *dsts[MAXD];
    fill_values(t, host, count, 5);
    put_bytes(src_dev, src, host, bytes);
    const size_t *c = chunks ? chunks : want;
    /* a 0-element output is not written: NULL with given counts, else a
       buffer that must stay untouched */
    for (int i = 0; i < n; i++) dsts[i] = chunks && !c[i] ? NULL : buf_on(devs[i], c[i] * es);
    tc_device_t sd = {src_dev < 0 ? TC_DEVICE_CPU : TC_DEVICE_CUDA, src_dev < 0 ? 0 : src_dev};
    EXPECT_PATH(tc_local_scatter(g, src, sd, count, t, chunks, dsts, NULL), "copies path");
    sync_all();
    size_t off = 0;
    int k = 5;
    char what[128];
    for (int i = 0; i < n; i++) {
        snprintf(what, sizeof what, "scatter of %zu over %d (%s) from %d, output %d", count, n, chunks ? "given counts" : "torch.chunk", src_dev, i);
        if (c[i] == 0) CHECK(!dsts[i] || untouched(devs[i], dsts[i], 0));
        else CHECK(check_values(what, devs[i], dsts[i], t, c[i], off, &k, 1));
        off += c[i];
    }
    void *out = buf_on(dst_dev, bytes);
    tc_device_t dd = {dst_dev < 0 ? TC_DEVICE_CPU : TC_DEVICE_CUDA, dst_dev < 0 ? 0 : dst_dev};
    EXPECT_PATH(tc_local_gather(g, (const void *const *)dsts, c, t, out, dd, NULL), "copies path");
    sync_all();
    snprintf(what, sizeof what, "gather of %zu from %d members into %d", count, n, dst_dev);
    CHECK(check_values(what, dst_dev, out, t, count, 0, &k, 1));
    buf_free(dst_dev, out);
    for (int i = 0; i < n; i++) if (dsts[i]) buf_free(devs[i], dsts[i]);
    buf_free(src_dev, src);
    free(host);
    tc_local_free(g);
}

/* ---- errors: a clear code naming the argument, nothing written ------------ */

static void error_cases(const int *devs, int n) {
    tc_local_t *g = group(devs, n, TC_UNSET);
    if (!g) return;
    size_t count = 100, bytes = count * 4;
    void *src = buf_on(devs[0], bytes), *dsts[MAXD], *host = buf_on(-1, bytes);
    for (int i = 0; i < n; i++) dsts[i] = buf_on(devs[i], bytes);
    const void *srcs[MAXD];
    for (int i = 0; i < n; i++) srcs[i] = dsts[i];
    tc_device_t bad_dev[1] = {{TC_DEVICE_CUDA, nd}}, bad_type[1] = {{7, 0}};
    tc_local_t *out = NULL;
    EXPECT_RC(tc_local_new(bad_dev, 1, NULL, &out), TC_ERR_INVALID_ARGUMENT, "devices[0]");
    EXPECT_RC(tc_local_new(bad_type, 1, NULL, &out), TC_ERR_INVALID_ARGUMENT, "devices[0]");
    CHECK(out == NULL);
    EXPECT_RC(tc_local_broadcast(NULL, src, 0, dsts, count, TC_FLOAT32, NULL), TC_ERR_NULL_ARGUMENT, "'g'");
    EXPECT_RC(tc_local_broadcast(g, src, 0, NULL, count, TC_FLOAT32, NULL), TC_ERR_NULL_ARGUMENT, "'dsts'");
    EXPECT_RC(tc_local_broadcast(g, src, (size_t)n, dsts, count, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "src_index");
    EXPECT_RC(tc_local_broadcast(g, src, 0, dsts, (size_t)-1 / 2, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "count");
    EXPECT_RC(tc_local_broadcast(g, src, 0, dsts, count, 99, NULL), TC_ERR_INVALID_ARGUMENT, "'dt'");
    /* host memory where device memory of member 0 is expected */
    EXPECT_RC(tc_local_broadcast(g, host, 0, dsts, count, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "'src'");
    if (n > 1) { /* a buffer of device 0 given as member 1's */
        void *saved = dsts[1];
        dsts[1] = buf_on(devs[0], bytes);
        EXPECT_RC(tc_local_broadcast(g, src, 0, dsts, count, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "dsts[1]");
        buf_free(devs[0], dsts[1]);
        dsts[1] = saved;
    }
    /* a destination overlapping the source (not the in-place identity) */
    void *saved0 = dsts[0];
    dsts[0] = (char *)src + 4;
    EXPECT_RC(tc_local_broadcast(g, src, 0, dsts, count, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "overlap");
    dsts[0] = saved0;
    /* reduce_add: destination overlapping another source, index out of range */
    EXPECT_RC(tc_local_reduce_add(g, srcs, count, TC_FLOAT32, (char *)dsts[0] + 8, 0, NULL), TC_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT_RC(tc_local_reduce_add(g, srcs, count, TC_FLOAT32, src, (size_t)n, NULL), TC_ERR_INVALID_ARGUMENT, "dst_index");
    /* scatter: counts that do not add up; gather: overflowing counts */
    size_t chunks[MAXD], huge[MAXD];
    for (int i = 0; i < n; i++) chunks[i] = 1, huge[i] = (size_t)-1 / 2;
    EXPECT_RC(tc_local_scatter(g, src, (tc_device_t){TC_DEVICE_CUDA, devs[0]}, count, TC_FLOAT32, chunks, dsts, NULL),
              TC_ERR_INVALID_ARGUMENT, "chunk_counts");
    EXPECT_RC(tc_local_gather(g, srcs, huge, TC_FLOAT32, host, (tc_device_t){TC_DEVICE_CPU, 0}, NULL), TC_ERR_INVALID_ARGUMENT,
              "counts");
    EXPECT_RC(tc_local_gather(g, srcs, chunks, TC_FLOAT32, host, (tc_device_t){TC_DEVICE_CUDA, nd}, NULL),
              TC_ERR_INVALID_ARGUMENT, "dst_device");
    /* nothing was written anywhere */
    CHECK(untouched(devs[0], src, bytes));
    CHECK(untouched(-1, host, bytes));
    for (int i = 0; i < n; i++) CHECK(untouched(devs[i], dsts[i], bytes));
    tc_local_free(g);

    /* a CPU member: reduce_add refuses it; float8 on the copies path is unsupported */
    int with_cpu[2] = {devs[0], -1};
    g = group(with_cpu, 2, TC_UNSET);
    const void *mixed[2] = {src, host};
    EXPECT_RC(tc_local_reduce_add(g, mixed, count, TC_FLOAT32, src, 0, NULL), TC_ERR_INVALID_ARGUMENT, "CPU");
    tc_local_free(g);
    int twice[2] = {devs[0], devs[0]};
    g = group(twice, 2, TC_UNSET);
    const void *two[2] = {src, dsts[0]};
    EXPECT_RC(tc_local_reduce_add(g, two, count, TC_FLOAT8_E4M3, src, 0, NULL), TC_ERR_UNSUPPORTED, "float8");
    CHECK(untouched(devs[0], src, bytes) && untouched(devs[0], dsts[0], bytes));
    tc_local_free(g);
    for (int i = 0; i < n; i++) buf_free(devs[i], dsts[i]);
    buf_free(devs[0], src);
    buf_free(-1, host);
}

int main(void) {
    gpu_setup(); /* cuInit, and a current context for the helpers */
    CU(cuDeviceGetCount(&nd));
    if (nd > MAXD) nd = MAXD;
    for (int d = 0; d < nd; d++) {
        CUdevice dev;
        CU(cuDeviceGet(&dev, d));
        CU(cuDevicePrimaryCtxRetain(&ctx[d], dev));
    }
    CU(cuCtxSetCurrent(ctx[0]));
    const char *dbg = getenv("TORCHCOMM_DEBUG");
    log_checks = dbg && (strcmp(dbg, "INFO") == 0 || strcmp(dbg, "info") == 0);
    if (getenv("TC_LOCAL_NCCL")) expect_nccl = env_int("TC_LOCAL_NCCL", 0);
    printf("test_gpu_local: %d device(s); path checks %s; NCCL %s\n", nd, log_checks ? "on" : "off (TORCHCOMM_DEBUG is not INFO)",
           expect_nccl == 1 ? "expected" : expect_nccl == 0 ? "absent" : "not checked");

    int all[MAXD], pass = 0, failed = 0;
    for (int d = 0; d < nd; d++) all[d] = d;
    int before = capi_failures;
#define STEP(name, body)                                                          \
    do {                                                                          \
        before = capi_failures;                                                   \
        body;                                                                     \
        printf("%s: %s\n", capi_failures == before ? "ok  " : "FAIL", name);      \
        pass += capi_failures == before;                                          \
        failed += capi_failures != before;                                        \
    } while (0)

    /* distinct devices: NCCL (when present) and forced copies; legacy streams */
    STEP("broadcast, distinct devices, NCCL where present", broadcast_case(all, nd, TC_UNSET, distinct_path(1), NULL));
    STEP("broadcast, distinct devices, copies", broadcast_case(all, nd, 0, distinct_path(0), NULL));
    STEP("reduce_add, distinct devices, NCCL where present", reduce_case(all, nd, TC_UNSET, distinct_path(1), NULL));
    STEP("reduce_add, distinct devices, copies", reduce_case(all, nd, 0, distinct_path(0), NULL));

    /* mixed streams: a non-blocking stream on even devices, legacy on odd */
    CUstream streams[MAXD];
    for (int d = 0; d < nd; d++) {
        streams[d] = NULL;
        if (d % 2 == 0) { push(d); CU(cuStreamCreate(&streams[d], CU_STREAM_NON_BLOCKING)); pop(); }
    }
    STEP("broadcast, mixed streams", broadcast_case(all, nd, TC_UNSET, distinct_path(1), streams));
    STEP("reduce_add, mixed streams, copies", reduce_case(all, nd, 0, "copies path", streams));
    STEP("reduce_add, mixed streams", reduce_case(all, nd, TC_UNSET, distinct_path(1), streams));

    /* own non-blocking streams everywhere (device 0 twice: two streams) */
    CUstream own[MAXD + 1];
    int own_devs[MAXD + 1];
    for (int i = 0; i <= nd; i++) {
        own_devs[i] = i < nd ? i : 0;
        push(own_devs[i]);
        CU(cuStreamCreate(&own[i], CU_STREAM_NON_BLOCKING));
        pop();
    }
    STEP("stream order, distinct devices, NCCL where present", order_case(own_devs, nd, TC_UNSET, distinct_path(1), own));
    STEP("stream order, distinct devices, copies", order_case(own_devs, nd, 0, "copies path", own));
    STEP("stream order, device 0 twice (two streams of one device)", order_case(own_devs, nd + 1, TC_UNSET, "copies path", own));

    /* a device twice, and the CPU as a member: the copies path */
    int twice[MAXD + 1], with_cpu[MAXD + 1];
    for (int d = 0; d < nd; d++) twice[d] = d, with_cpu[d] = d;
    twice[nd] = 0, with_cpu[nd] = -1;
    STEP("broadcast, a device twice", broadcast_case(twice, nd + 1, TC_UNSET, "copies path", NULL));
    STEP("reduce_add, a device twice", reduce_case(twice, nd + 1, TC_UNSET, "copies path", NULL));
    STEP("broadcast with the CPU as a member (from and to it)", broadcast_case(with_cpu, nd + 1, TC_UNSET, "copies path", NULL));

    STEP("broadcast_coalesced + reduce_add_coalesced, NCCL where present", coalesced_case(all, nd, TC_UNSET, distinct_path(1)));
    STEP("broadcast_coalesced + reduce_add_coalesced, copies", coalesced_case(all, nd, 0, "copies path"));

    /* scatter with torch.chunk's rule (the table's cases for this count) */
    STEP("scatter torch.chunk cases, CPU source, gather to the CPU", {
        for (size_t i = 0; i < sizeof TORCH_CHUNK / sizeof TORCH_CHUNK[0]; i++)
            if (TORCH_CHUNK[i].n == nd) scatter_gather_case(all, nd, -1, -1, TORCH_CHUNK[i].count, NULL, TORCH_CHUNK[i].chunks);
    });
    STEP("scatter/gather with the CPU in the group (torch.chunk over n+1)", {
        for (size_t i = 0; i < sizeof TORCH_CHUNK / sizeof TORCH_CHUNK[0]; i++)
            if (TORCH_CHUNK[i].n == nd + 1) scatter_gather_case(with_cpu, nd + 1, 0, 0, TORCH_CHUNK[i].count, NULL, TORCH_CHUNK[i].chunks);
    });
    size_t uneven[MAXD + 1], total = 0;
    for (int d = 0; d <= nd; d++) uneven[d] = d == 1 ? 0 : (size_t)(3 + 50 * d), total += uneven[d];
    STEP("scatter uneven counts (one 0) from device 0, gather to the last device", scatter_gather_case(all, nd, 0, nd - 1, total - uneven[nd], uneven, NULL));
    if (nd >= 2) {
        /* a source and a destination outside the group: the last device */
        size_t outside[MAXD];
        for (int d = 0; d < nd - 1; d++) outside[d] = d == 0 ? 1001 - 10 * (size_t)(nd - 2) : 10;
        STEP("scatter from / gather to a device outside the group", scatter_gather_case(all, nd - 1, nd - 1, nd - 1, 1001, outside, NULL));
    }
    STEP("errors: named, nothing written", error_cases(all, nd));

    for (int d = 0; d < nd; d++) if (streams[d]) { push(d); CU(cuStreamDestroy(streams[d])); pop(); }
    for (int i = 0; i <= nd; i++) { push(own_devs[i]); CU(cuStreamDestroy(own[i])); pop(); }
    printf("%d passed, %d failed\n", pass, failed);
    CAPI_DONE("test_gpu_local");
}
