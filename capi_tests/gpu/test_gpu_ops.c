/* Every operation of the nccl backend on device memory, for every dtype and
   reduce op, in place and out of place, in three issue modes (sync on the
   caller's stream; async + tc_work_wait; async + tc_work_wait_blocking),
   checked element by element against a host reference computed from fresh
   pseudo-random inputs; then CUDA graph capture and replays, split, and work
   status. Runs as one rank or under tc-run with several ranks on one GPU
   (each with its own NCCL_HOSTID). Prints "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>
#include "gpu_util.h"

static tc_comm_t *comm;
static int R, N;
static CUstream stream;
static unsigned seed = 1;
static int passed, failed, skipped;

#define MAXR 16
static const size_t COUNT = 129;

/* Input of rank r at element i for this round: small values that every
   dtype holds exactly (1..3; 0/1 for bool). */
static double gen(tc_dtype_t t, int r, size_t i) {
    unsigned h = seed * 2654435761u ^ (unsigned)(r * 40503 + (int)i * 9176 + 7);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return t == TC_BOOL ? (double)(h & 1) : (double)(h % 3 + 1);
}

static void fill(tc_dtype_t t, void *h, int r, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++) put(t, h, i, gen(t, r, off + i));
}

/* Issue modes. */
enum { SYNC, ASYNC_WAIT, ASYNC_BLOCK, NMODES };
static const char *mode_name[] = {"sync", "async+wait", "async+wait_blocking"};

static tc_op_options_t opts_for(int mode) {
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.async_op = mode != SYNC;
    o.stream = stream;
    return o;
}

/* Completes an issued operation per `mode`; returns its result. The work
   comes by address: the order in which C evaluates arguments is unspecified,
   so a plain `w` argument could be read before the call that sets it. */
static tc_result_t finish(int mode, tc_result_t rc, tc_work_t **wp) {
    tc_work_t *w = *wp;
    if (rc == TC_SUCCESS && mode == ASYNC_WAIT) rc = tc_work_wait(w, stream);
    if (rc == TC_SUCCESS && mode == ASYNC_BLOCK) rc = tc_work_wait_blocking(w);
    if (rc == TC_SUCCESS && w) {
        int done = 0;
        if (mode == ASYNC_BLOCK) {
            CHECK(tc_work_is_completed(w, &done) == TC_SUCCESS && done == 1);
        }
    }
    tc_work_free(w);
    CU(cuStreamSynchronize(stream));
    return rc;
}

static void report(const char *what, tc_dtype_t t, const char *op, int mode, int ok) {
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "rank %d: FAIL %s dtype=%s op=%s mode=%s (%s)\n", R, what, dt_name(t), op, mode_name[mode], tc_last_error());
    }
}

/* Compares n elements of `got` with `want` (doubles). */
static int compare(tc_dtype_t t, const void *got, const double *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        double g = get(t, got, i);
        if (!close_enough(t, g, want[i])) {
            fprintf(stderr, "rank %d: %s: element %zu is %g, expected %g\n", R, what, i, g, want[i]);
            return 0;
        }
    }
    return 1;
}

/* ---- reductions -------------------------------------------------------- */

static const int red_kinds[] = {TC_SUM, TC_PRODUCT, TC_MIN, TC_MAX, TC_AVG, TC_PREMUL_SUM};
static const char *red_name[] = {"sum", "prod", "min", "max", "band", "bor", "bxor", "premul_sum", "avg"};
static const double PREMUL = 0.5;

static int red_supported(tc_dtype_t t, int k) {
    if (t == TC_BOOL && (k == TC_AVG || k == TC_PREMUL_SUM)) return 0;
    if (k == TC_PREMUL_SUM && !dt_float(t)) return 0;
    return 1;
}

static double reduce_ref(tc_dtype_t t, int k, size_t i, size_t off) {
    double acc = 0;
    for (int r = 0; r < N; r++) {
        double x = gen(t, r, off + i);
        if (t == TC_BOOL) {
            int b = x != 0;
            if (r == 0) acc = b;
            else if (k == TC_SUM || k == TC_MAX) acc = acc || b;
            else acc = acc && b;
            continue;
        }
        if (k == TC_PREMUL_SUM) x *= PREMUL;
        if (r == 0) { acc = x; continue; }
        switch (k) {
        case TC_PRODUCT: acc *= x; break;
        case TC_MIN: acc = fmin(acc, x); break;
        case TC_MAX: acc = fmax(acc, x); break;
        default: acc += x; break;
        }
    }
    if (k == TC_AVG) acc = dt_float(t) || dt_fp8(t) ? acc / N : trunc(acc / N);
    return acc;
}

static void test_reductions(tc_dtype_t t, int k, int mode) {
    size_t es = dt_size(t), n = COUNT;
    tc_reduce_op_t op = TC_REDUCE_OP(k);
    op.premul_factor = PREMUL;
    tc_op_options_t o = opts_for(mode);
    double *want = malloc(sizeof(double) * n * N);
    char *h = malloc(es * n * N);
    tc_work_t *w = NULL;

    /* all_reduce (in place) */
    void *d = dalloc(es * n);
    fill(t, h, R, 0, n);
    h2d(d, h, es * n);
    w = NULL;
    tc_result_t rc = finish(mode, tc_all_reduce(comm, d, n, t, op, &o, mode == SYNC ? NULL : &w), &w);
    d2h(h, d, es * n);
    for (size_t i = 0; i < n; i++) want[i] = reduce_ref(t, k, i, 0);
    report("all_reduce", t, red_name[k], mode, rc == TC_SUCCESS && compare(t, h, want, n, "all_reduce"));

    /* reduce to the last rank (in place) */
    fill(t, h, R, 0, n);
    h2d(d, h, es * n);
    w = NULL;
    rc = finish(mode, tc_reduce(comm, d, n, t, N - 1, op, &o, mode == SYNC ? NULL : &w), &w);
    d2h(h, d, es * n);
    report("reduce", t, red_name[k], mode, rc == TC_SUCCESS && (R != N - 1 || compare(t, h, want, n, "reduce")));
    dfree(d);

    /* reduce_scatter_single, out of place and in place */
    void *in = dalloc(es * n * N), *out = dalloc(es * n);
    for (int inplace = 0; inplace < 2; inplace++) {
        fill(t, h, R, 0, n * N);
        h2d(in, h, es * n * N);
        void *dst = inplace ? (char *)in + es * n * R : out;
        w = NULL;
        rc = finish(mode, tc_reduce_scatter_single(comm, dst, in, n, t, op, &o, mode == SYNC ? NULL : &w), &w);
        d2h(h, dst, es * n);
        for (size_t i = 0; i < n; i++) want[i] = reduce_ref(t, k, i, n * R);
        report(inplace ? "reduce_scatter_single(in place)" : "reduce_scatter_single", t, red_name[k], mode,
               rc == TC_SUCCESS && compare(t, h, want, n, "reduce_scatter_single"));
    }

    /* reduce_scatter (list of inputs) */
    fill(t, h, R, 0, n * N);
    h2d(in, h, es * n * N);
    const void *inputs[MAXR];
    for (int r = 0; r < N; r++) inputs[r] = (char *)in + es * n * r;
    w = NULL;
    rc = finish(mode, tc_reduce_scatter(comm, out, inputs, n, t, op, &o, mode == SYNC ? NULL : &w), &w);
    d2h(h, out, es * n);
    report("reduce_scatter", t, red_name[k], mode, rc == TC_SUCCESS && compare(t, h, want, n, "reduce_scatter"));
    /* reduce_scatter (list) in place: the output is this rank's input */
    fill(t, h, R, 0, n * N);
    h2d(in, h, es * n * N);
    w = NULL;
    rc = finish(mode, tc_reduce_scatter(comm, (void *)inputs[R], inputs, n, t, op, &o, mode == SYNC ? NULL : &w), &w);
    d2h(h, inputs[R], es * n);
    report("reduce_scatter(in place)", t, red_name[k], mode, rc == TC_SUCCESS && compare(t, h, want, n, "reduce_scatter(in place)"));

    /* reduce_scatter_v: rank r gets r+1 elements */
    size_t counts[MAXR], total = 0, off = 0;
    for (int r = 0; r < N; r++) { counts[r] = (size_t)r + 1; total += counts[r]; }
    for (int r = 0; r < R; r++) off += counts[r];
    fill(t, h, R, 0, total);
    h2d(in, h, es * total);
    w = NULL;
    rc = finish(mode, tc_reduce_scatter_v(comm, out, in, counts, t, op, &o, mode == SYNC ? NULL : &w), &w);
    d2h(h, out, es * counts[R]);
    for (size_t i = 0; i < counts[R]; i++) want[i] = reduce_ref(t, k, i, off);
    report("reduce_scatter_v", t, red_name[k], mode, rc == TC_SUCCESS && compare(t, h, want, counts[R], "reduce_scatter_v"));
    dfree(in);
    dfree(out);
    free(want);
    free(h);
}

/* ---- data movement ----------------------------------------------------- */

static void test_movement(tc_dtype_t t, int mode) {
    size_t es = dt_size(t), n = COUNT;
    tc_op_options_t o = opts_for(mode);
    double *want = malloc(sizeof(double) * n * N * 2);
    char *h = malloc(es * n * N * 2);
    void *in = dalloc(es * n * N), *out = dalloc(es * n * N);
    void *outs[MAXR];
    const void *ins[MAXR];
    tc_work_t *w;
    tc_result_t rc;
#define W (mode == SYNC ? NULL : &w)

    /* broadcast from rank 0 */
    fill(t, h, R, 0, n);
    h2d(in, h, es * n);
    w = NULL;
    rc = finish(mode, tc_broadcast(comm, in, n, t, 0, &o, W), &w);
    d2h(h, in, es * n);
    for (size_t i = 0; i < n; i++) want[i] = gen(t, 0, i);
    report("broadcast", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n, "broadcast"));

    /* all_gather_single, out of place and in place */
    for (int inplace = 0; inplace < 2; inplace++) {
        dmemset(out, 0, es * n * N);
        fill(t, h, R, 0, n);
        void *src = inplace ? (char *)out + es * n * R : in;
        h2d(src, h, es * n);
        w = NULL;
        rc = finish(mode, tc_all_gather_single(comm, out, src, n, t, &o, W), &w);
        d2h(h, out, es * n * N);
        for (int r = 0; r < N; r++)
            for (size_t i = 0; i < n; i++) want[r * n + i] = gen(t, r, i);
        report(inplace ? "all_gather_single(in place)" : "all_gather_single", t, "-", mode,
               rc == TC_SUCCESS && compare(t, h, want, n * N, "all_gather_single"));
    }
    /* the persistent all-gather (the plain call on nccl), twice */
    tc_all_gather_p_t *agp = NULL;
    rc = tc_all_gather_p_init(comm, out, n, t, NULL, &agp);
    for (int round = 0; round < 2 && rc == TC_SUCCESS; round++) {
        dmemset(out, 0, es * n * N);
        fill(t, h, R, 0, n);
        h2d(in, h, es * n);
        w = NULL;
        rc = finish(mode, tc_all_gather_p_exec(agp, in, &o, W), &w);
        d2h(h, out, es * n * N);
        rc = rc == TC_SUCCESS && compare(t, h, want, n * N, "all_gather_p") ? TC_SUCCESS : TC_ERR_INTERNAL;
    }
    tc_all_gather_p_free(agp);
    report("all_gather_p", t, "-", mode, rc == TC_SUCCESS);

    /* all_gather (list) */
    fill(t, h, R, 0, n);
    h2d(in, h, es * n);
    for (int r = 0; r < N; r++) outs[r] = (char *)out + es * n * r;
    w = NULL;
    rc = finish(mode, tc_all_gather(comm, outs, in, n, t, &o, W), &w);
    d2h(h, out, es * n * N);
    report("all_gather", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n * N, "all_gather"));

    /* all_gather_v: rank r contributes r+2 elements */
    size_t counts[MAXR], total = 0;
    for (int r = 0; r < N; r++) { counts[r] = (size_t)r + 2; total += counts[r]; }
    fill(t, h, R, 0, counts[R]);
    h2d(in, h, es * counts[R]);
    w = NULL;
    rc = finish(mode, tc_all_gather_v(comm, out, counts, in, t, &o, W), &w);
    d2h(h, out, es * total);
    size_t k = 0;
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < counts[r]; i++) want[k++] = gen(t, r, i);
    report("all_gather_v", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, total, "all_gather_v"));

    /* all_to_all_single: block q of rank r's input goes to rank q */
    fill(t, h, R, 0, n * N);
    h2d(in, h, es * n * N);
    w = NULL;
    rc = finish(mode, tc_all_to_all_single(comm, out, in, n, t, &o, W), &w);
    d2h(h, out, es * n * N);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++) want[r * n + i] = gen(t, r, n * R + i);
    report("all_to_all_single", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n * N, "all_to_all_single"));

    /* all_to_all (lists) */
    for (int r = 0; r < N; r++) { ins[r] = (char *)in + es * n * r; outs[r] = (char *)out + es * n * r; }
    dmemset(out, 0, es * n * N);
    w = NULL;
    rc = finish(mode, tc_all_to_all(comm, outs, ins, n, t, &o, W), &w);
    d2h(h, out, es * n * N);
    report("all_to_all", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n * N, "all_to_all"));

    /* all_to_all_v_single: rank r sends (r + q) % 3 elements to rank q */
    size_t ic[MAXR], oc[MAXR], itot = 0, otot = 0;
    for (int q = 0; q < N; q++) { ic[q] = (size_t)(R + q) % 3; oc[q] = (size_t)(q + R) % 3; itot += ic[q]; otot += oc[q]; }
    fill(t, h, R, 0, itot);
    h2d(in, h, es * itot);
    w = NULL;
    rc = finish(mode, tc_all_to_all_v_single(comm, out, oc, in, ic, t, &o, W), &w);
    d2h(h, out, es * otot);
    k = 0;
    for (int q = 0; q < N; q++) {
        size_t qoff = 0; /* offset of the block rank q sends to me, in q's input */
        for (int p = 0; p < R; p++) qoff += (size_t)(q + p) % 3;
        for (size_t i = 0; i < oc[q]; i++) want[k++] = gen(t, q, qoff + i);
    }
    report("all_to_all_v_single", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, otot, "all_to_all_v_single"));

    /* the same three in place (output == input): NCCL leaves overlapping
       send and receive buffers of an all-to-all undefined (its sends and
       receives run concurrently), so the library must stage the input */
    fill(t, h, R, 0, n * N);
    h2d(in, h, es * n * N);
    w = NULL;
    rc = finish(mode, tc_all_to_all_single(comm, in, in, n, t, &o, W), &w);
    d2h(h, in, es * n * N);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++) want[r * n + i] = gen(t, r, n * R + i);
    report("all_to_all_single(in place)", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n * N, "all_to_all_single(in place)"));
    fill(t, h, R, 0, n * N);
    h2d(in, h, es * n * N);
    for (int r = 0; r < N; r++) { ins[r] = (char *)in + es * n * r; outs[r] = (char *)in + es * n * r; }
    w = NULL;
    rc = finish(mode, tc_all_to_all(comm, outs, ins, n, t, &o, W), &w);
    d2h(h, in, es * n * N);
    report("all_to_all(in place)", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n * N, "all_to_all(in place)"));
    fill(t, h, R, 0, itot); /* ic == oc: the same layout in and out */
    h2d(in, h, es * itot);
    w = NULL;
    rc = finish(mode, tc_all_to_all_v_single(comm, in, oc, in, ic, t, &o, W), &w);
    d2h(h, in, es * otot);
    k = 0;
    for (int q = 0; q < N; q++) {
        size_t qoff = 0;
        for (int p = 0; p < R; p++) qoff += (size_t)(q + p) % 3;
        for (size_t i = 0; i < oc[q]; i++) want[k++] = gen(t, q, qoff + i);
    }
    report("all_to_all_v_single(in place)", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, otot, "all_to_all_v_single(in place)"));

    /* scatter from the last rank */
    int root = N - 1;
    fill(t, h, R, 0, n * N);
    h2d(in, h, es * n * N);
    for (int r = 0; r < N; r++) ins[r] = (char *)in + es * n * r;
    w = NULL;
    rc = finish(mode, tc_scatter(comm, out, ins, n, t, root, &o, W), &w);
    d2h(h, out, es * n);
    for (size_t i = 0; i < n; i++) want[i] = gen(t, root, n * R + i);
    report("scatter", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n, "scatter"));

    /* scatter in place: the root's output is its own block of the input */
    fill(t, h, R, 0, n * N);
    h2d(in, h, es * n * N);
    for (int r = 0; r < N; r++) ins[r] = (char *)in + es * n * r;
    void *sdst = R == root ? (void *)ins[root] : out;
    w = NULL;
    rc = finish(mode, tc_scatter(comm, sdst, ins, n, t, root, &o, W), &w);
    d2h(h, sdst, es * n);
    for (size_t i = 0; i < n; i++) want[i] = gen(t, root, n * R + i);
    report("scatter(in place)", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n, "scatter(in place)"));

    /* gather to rank 0 */
    fill(t, h, R, 0, n);
    h2d(in, h, es * n);
    for (int r = 0; r < N; r++) outs[r] = (char *)out + es * n * r;
    w = NULL;
    rc = finish(mode, tc_gather(comm, outs, in, n, t, 0, &o, W), &w);
    d2h(h, out, es * n * N);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++) want[r * n + i] = gen(t, r, i);
    report("gather", t, "-", mode, rc == TC_SUCCESS && (R != 0 || compare(t, h, want, n * N, "gather")));
    /* gather in place: the root's input is its own block of the output */
    fill(t, h, R, 0, n);
    for (int r = 0; r < N; r++) outs[r] = (char *)out + es * n * r;
    void *gsrc = R == 0 ? outs[0] : in;
    h2d(gsrc, h, es * n);
    w = NULL;
    rc = finish(mode, tc_gather(comm, outs, gsrc, n, t, 0, &o, W), &w);
    d2h(h, out, es * n * N);
    report("gather(in place)", t, "-", mode, rc == TC_SUCCESS && (R != 0 || compare(t, h, want, n * N, "gather(in place)")));
    /* gather_single to the last rank, out of place then in place (the
       root's input is its own block of the output); NULL output elsewhere */
    fill(t, h, R, 0, n);
    h2d(in, h, es * n);
    w = NULL;
    rc = finish(mode, tc_gather_single(comm, R == root ? out : NULL, in, n, t, root, &o, W), &w);
    d2h(h, out, es * n * N);
    report("gather_single", t, "-", mode, rc == TC_SUCCESS && (R != root || compare(t, h, want, n * N, "gather_single")));
    fill(t, h, R, 0, n);
    void *gssrc = R == root ? (void *)((char *)out + es * n * root) : in;
    h2d(gssrc, h, es * n);
    w = NULL;
    rc = finish(mode, tc_gather_single(comm, R == root ? out : NULL, gssrc, n, t, root, &o, W), &w);
    d2h(h, out, es * n * N);
    report("gather_single(in place)", t, "-", mode, rc == TC_SUCCESS && (R != root || compare(t, h, want, n * N, "gather_single(in place)")));
    /* all_gather (list) in place: the input is this rank's output */
    fill(t, h, R, 0, n);
    h2d(outs[R], h, es * n);
    w = NULL;
    rc = finish(mode, tc_all_gather(comm, outs, outs[R], n, t, &o, W), &w);
    d2h(h, out, es * n * N);
    report("all_gather(in place)", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n * N, "all_gather(in place)"));

    /* send/recv around a ring (batched so that it cannot deadlock), and the
       same with two separate calls for two ranks or more */
    int next = (R + 1) % N, prev = (R + N - 1) % N;
    fill(t, h, R, 0, n);
    h2d(in, h, es * n);
    tc_batch_t *b = NULL;
    CHECK(tc_batch_begin(comm, &b) == TC_SUCCESS);
    CHECK(tc_batch_send(b, in, n, t, next) == TC_SUCCESS);
    CHECK(tc_batch_recv(b, out, n, t, prev) == TC_SUCCESS);
    w = NULL;
    rc = finish(mode, tc_batch_issue(b, &o, W), &w);
    tc_batch_free(b);
    d2h(h, out, es * n);
    for (size_t i = 0; i < n; i++) want[i] = gen(t, prev, i);
    report("batch send/recv ring", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n, "batch"));
    /* the same ring in place: one buffer sent and received into; a group's
       sends and receives run concurrently, so the library stages the send */
    fill(t, h, R, 0, n);
    h2d(out, h, es * n);
    b = NULL;
    CHECK(tc_batch_begin(comm, &b) == TC_SUCCESS);
    CHECK(tc_batch_recv(b, out, n, t, prev) == TC_SUCCESS);
    CHECK(tc_batch_send(b, out, n, t, next) == TC_SUCCESS);
    w = NULL;
    rc = finish(mode, tc_batch_issue(b, &o, W), &w);
    tc_batch_free(b);
    d2h(h, out, es * n);
    report("batch send/recv ring(in place)", t, "-", mode, rc == TC_SUCCESS && compare(t, h, want, n, "batch(in place)"));
    /* tags: NCCL matches by peer and order only, so a non-zero tag is
       refused before anything is enqueued (tag 0 is the plain call) */
    tc_op_options_t tagged = o;
    tagged.tag = 5;
    w = NULL;
    rc = tc_send(comm, in, n, t, next, &tagged, W);
    report("send with a non-zero tag refused", t, "-", mode,
           rc == TC_ERR_UNSUPPORTED && strstr(tc_last_error(), "'opts.tag'") != NULL && w == NULL);
    b = NULL;
    CHECK(tc_batch_begin(comm, &b) == TC_SUCCESS);
    CHECK(tc_batch_recv_tagged(b, out, n, t, prev, 0) == TC_SUCCESS);
    CHECK(tc_batch_send_tagged(b, in, n, t, next, 9) == TC_SUCCESS);
    rc = tc_batch_issue(b, &o, W);
    tc_batch_free(b);
    report("batch entry with a non-zero tag refused", t, "-", mode,
           rc == TC_ERR_UNSUPPORTED && strstr(tc_last_error(), "'batch[1].tag'") != NULL && w == NULL);
    /* a receive from any source: NCCL receives name their peer */
    if (N >= 2) {
        w = NULL;
        rc = tc_recv(comm, out, n, t, TC_ANY_SOURCE, &o, W);
        report("recv from any source refused", t, "-", mode,
               rc == TC_ERR_UNSUPPORTED && strstr(tc_last_error(), "TC_ANY_SOURCE") != NULL && w == NULL);
    }
    if (N >= 2) {
        /* even ranks send first, odd ranks receive first */
        tc_result_t r1, r2;
        dmemset(out, 0, es * n);
        if (R % 2 == 0) {
            w = NULL;
            r1 = finish(mode, tc_send(comm, in, n, t, next, &o, W), &w);
            w = NULL;
            r2 = finish(mode, tc_recv(comm, out, n, t, prev, &o, W), &w);
        } else {
            w = NULL;
            r2 = finish(mode, tc_recv(comm, out, n, t, prev, &o, W), &w);
            w = NULL;
            r1 = finish(mode, tc_send(comm, in, n, t, next, &o, W), &w);
        }
        d2h(h, out, es * n);
        report("send/recv ring", t, "-", mode, r1 == TC_SUCCESS && r2 == TC_SUCCESS && compare(t, h, want, n, "send/recv"));
    }
#undef W
    dfree(in);
    dfree(out);
    free(want);
    free(h);
}

/* ---- graphs ------------------------------------------------------------ */

/* Captures an all_reduce (and, async, its wait) into a graph, replays it
   three times with fresh inputs each time. */
static void test_graph(int async_op) {
    const tc_dtype_t t = TC_FLOAT32;
    size_t n = COUNT, es = 4;
    void *d = dalloc(es * n), *stage = dalloc(es * n);
    float *h = malloc(es * n);
    double want[256];
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.async_op = async_op;
    o.stream = stream;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    CUgraph graph;
    CUgraphExec exec;
    CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    /* the graph copies the staged input into place, then reduces */
    CU(cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)d, (CUdeviceptr)(uintptr_t)stage, es * n, stream));
    tc_work_t *w = NULL;
    tc_result_t rc = tc_all_reduce(comm, d, n, t, sum, &o, async_op ? &w : NULL);
    if (rc == TC_SUCCESS && w) {
        int st = -1;
        CHECK(tc_work_status(w, &st) == TC_SUCCESS); /* must not query events during capture */
        rc = tc_work_wait(w, stream);
        tc_work_free(w);
    }
    CU(cuStreamEndCapture(stream, &graph));
    report(async_op ? "graph capture (async)" : "graph capture", t, "sum", SYNC, rc == TC_SUCCESS);
    if (rc != TC_SUCCESS) goto out;
    CU(cuGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; rep++) {
        seed++;
        fill(t, h, R, 0, n);
        h2d(stage, h, es * n);
        CU(cuGraphLaunch(exec, stream));
        CU(cuStreamSynchronize(stream));
        d2h(h, d, es * n);
        for (size_t i = 0; i < n; i++) want[i] = reduce_ref(t, TC_SUM, i, 0);
        report(async_op ? "graph replay (async)" : "graph replay", t, "sum", SYNC, compare(t, h, want, n, "graph replay"));
    }
    CU(cuGraphExecDestroy(exec));
    CU(cuGraphDestroy(graph));
out:
    dfree(d);
    dfree(stage);
    free(h);
}

/* An all-to-all whose input and output overlap needs a staging copy of
   its input, which cannot outlive a graph: refused under capture, leaving
   the capture and the comm usable. */
static void test_graph_in_place_all_to_all(void) {
    size_t n = 8;
    void *d = dalloc(4 * n * (size_t)N);
    tc_op_options_t o = opts_for(SYNC);
    CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    tc_result_t rc = tc_all_to_all_single(comm, d, d, n, TC_FLOAT32, &o, NULL);
    CUgraph graph = NULL;
    CUresult end = cuStreamEndCapture(stream, &graph);
    report("in-place all_to_all_single refused under capture", TC_FLOAT32, "-", SYNC,
           rc == TC_ERR_UNSUPPORTED && end == CUDA_SUCCESS && tc_comm_get_async_error(comm) == TC_SUCCESS);
    if (graph) CU(cuGraphDestroy(graph));
    dfree(d);
}

/* A host function that holds its stream for `ms` milliseconds. */
static void hold_stream(void *ms) {
    struct timespec t = {0, (long)(intptr_t)ms * 1000000L};
    nanosleep(&t, NULL);
}

/* A work still pending while another stream captures in GLOBAL mode (the
   default of cuStreamBeginCapture and of torch.cuda.graph): the comm's
   watchdog keeps polling the work's events during the capture, which must
   neither invalidate the capture nor fail the work or the comm. */
static void test_global_capture_while_pending(void) {
    size_t n = COUNT;
    CUstream busy, cap;
    CU(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
    CU(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
    void *d = dalloc(4 * n), *a = dalloc(4 * n), *b = dalloc(4 * n);
    CU(cuLaunchHostFunc(busy, hold_stream, (void *)(intptr_t)400)); /* the all_reduce cannot start for 400 ms */
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = busy;
    o.async_op = 1;
    tc_work_t *w = NULL;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_result_t rc = tc_all_reduce(comm, d, n, TC_FLOAT32, sum, &o, &w);
    CU(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult copy = cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)b, (CUdeviceptr)(uintptr_t)a, 4 * n, cap);
    hold_stream((void *)(intptr_t)300); /* the watchdog polls meanwhile */
    CUgraph graph = NULL;
    CUresult end = cuStreamEndCapture(cap, &graph);
    report("global-mode capture while a work is pending", TC_FLOAT32, "sum", ASYNC_BLOCK,
           rc == TC_SUCCESS && copy == CUDA_SUCCESS && end == CUDA_SUCCESS);
    if (end != CUDA_SUCCESS) fprintf(stderr, "rank %d: capture ended with CUDA error %d\n", R, (int)end);
    if (graph) CU(cuGraphDestroy(graph));
    rc = rc == TC_SUCCESS ? tc_work_wait_blocking(w) : rc;
    tc_work_free(w);
    report("the pending work completes after the capture", TC_FLOAT32, "sum", ASYNC_BLOCK, rc == TC_SUCCESS);
    report("comm healthy after the capture", TC_FLOAT32, "-", ASYNC_BLOCK, tc_comm_get_async_error(comm) == TC_SUCCESS);
    CU(cuStreamSynchronize(busy));
    dfree(d);
    dfree(a);
    dfree(b);
    CU(cuStreamDestroy(busy));
    CU(cuStreamDestroy(cap));
}

/* Another thread's in-place all-to-all while this thread captures in
   GLOBAL mode: the staging buffer the all-to-all needs (large enough here to
   be allocated afresh) must not be allocated, waited for or freed with
   calls that invalidate the capture. */
struct a2a_job {
    void *buf;
    size_t n;
    tc_result_t rc;
};
static void *in_place_a2a(void *p) {
    struct a2a_job *j = p;
    tc_op_options_t o = opts_for(SYNC);
    /* what the driver tells this thread of the (uncaptured) stream, printed
       when it is not "none", to tell the driver's view from the library's */
    CUstreamCaptureStatus seen = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult q = cuStreamIsCapturing(stream, &seen);
    if (q != CUDA_SUCCESS || seen != CU_STREAM_CAPTURE_STATUS_NONE)
        fprintf(stderr, "rank %d: the other thread sees the comm's stream: cuStreamIsCapturing %d, status %d\n", R, (int)q,
                (int)seen);
    j->rc = tc_all_to_all_single(comm, j->buf, j->buf, j->n, TC_FLOAT32, &o, NULL);
    if (j->rc != TC_SUCCESS) {
        fprintf(stderr, "rank %d: in-place all_to_all on another thread: %s\n", R, tc_last_error());
        q = cuStreamIsCapturing(stream, &seen);
        fprintf(stderr, "rank %d: after it, the other thread sees the comm's stream %p: cuStreamIsCapturing %d, status %d\n", R,
                (void *)stream, (int)q, (int)seen);
    }
    return NULL;
}
static void test_global_capture_while_staging(void) {
    struct a2a_job j = {NULL, (size_t)1 << 16, TC_SUCCESS};
    j.buf = dalloc(4 * j.n * (size_t)N);
    CUstream cap;
    CU(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
    void *a = dalloc(64), *b = dalloc(64);
    CU(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult copy = cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)b, (CUdeviceptr)(uintptr_t)a, 64, cap);
    pthread_t th;
    int started = pthread_create(&th, NULL, in_place_a2a, &j) == 0;
    if (started) pthread_join(th, NULL);
    CUgraph graph = NULL;
    CUresult end = cuStreamEndCapture(cap, &graph);
    CU(cuStreamSynchronize(stream));
    report("in-place all_to_all on another thread during a global-mode capture", TC_FLOAT32, "-", SYNC,
           started && j.rc == TC_SUCCESS && copy == CUDA_SUCCESS && end == CUDA_SUCCESS);
    if (end != CUDA_SUCCESS)
        fprintf(stderr,
                "rank %d: capture ended with CUDA error %d; the other thread's all_to_all returned %d (a FAIL line's "
                "message is this thread's last error, which may be an earlier test's)\n",
                R, (int)end, (int)j.rc);
    if (graph) CU(cuGraphDestroy(graph));
    CU(cuStreamDestroy(cap));
    dfree(j.buf);
    dfree(a);
    dfree(b);
}

/* Several works in flight at once: three async all_reduces (the comm's
   internal stream) and a sync one on the caller's stream issued before any
   is waited for, then waited for in reverse order. Every rank issues them
   in the same order, which is all NCCL asks. */
static void test_many_in_flight(void) {
    enum { K = 4 };
    size_t n = COUNT;
    void *d[K];
    float *h = malloc(sizeof(float) * n);
    double want[256];
    tc_work_t *w[K] = {NULL};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_result_t rc[K];
    seed++;
    for (int k = 0; k < K; k++) {
        d[k] = dalloc(sizeof(float) * n);
        fill(TC_FLOAT32, h, R + k, 0, n);
        h2d(d[k], h, sizeof(float) * n);
    }
    for (int k = 0; k < K; k++) {
        tc_op_options_t o = opts_for(k == K - 1 ? SYNC : ASYNC_WAIT);
        rc[k] = tc_all_reduce(comm, d[k], n, TC_FLOAT32, sum, &o, k == K - 1 ? NULL : &w[k]);
    }
    for (int k = K - 1; k >= 0; k--)
        if (w[k]) {
            if (rc[k] == TC_SUCCESS) rc[k] = tc_work_wait_blocking(w[k]);
            tc_work_free(w[k]);
        }
    CU(cuStreamSynchronize(stream));
    for (int k = 0; k < K; k++) {
        d2h(h, d[k], sizeof(float) * n);
        for (size_t i = 0; i < n; i++) {
            want[i] = 0;
            for (int r = 0; r < N; r++) want[i] += gen(TC_FLOAT32, r + k, i);
        }
        report(k == K - 1 ? "sync all_reduce issued behind three async ones" : "async all_reduce among several in flight",
               TC_FLOAT32, "sum", k == K - 1 ? SYNC : ASYNC_BLOCK, rc[k] == TC_SUCCESS && compare(TC_FLOAT32, h, want, n, "in flight"));
        dfree(d[k]);
    }
    free(h);
}

/* ---- split and barrier ------------------------------------------------- */

static void test_split(void) {
    /* the even ranks form a child comm; odd ranks opt out */
    int ranks[MAXR], n = 0;
    for (int r = 0; r < N; r += 2) ranks[n++] = r;
    tc_comm_t *child = NULL;
    tc_result_t rc = R % 2 == 0 ? tc_comm_split(comm, ranks, (size_t)n, "gpu_even", NULL, &child)
                                : tc_comm_split(comm, NULL, 0, "gpu_even", NULL, &child);
    report("split", TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS && ((R % 2 == 0) == (child != NULL)));
    if (child) {
        int cr = -1, cs = -1;
        tc_comm_get_rank(child, &cr);
        tc_comm_get_size(child, &cs);
        report("split rank/size", TC_FLOAT32, "-", SYNC, cr == R / 2 && cs == n);
        float one[4] = {1, 1, 1, 1}, got[4];
        void *d = dalloc(sizeof one);
        h2d(d, one, sizeof one);
        tc_op_options_t o = opts_for(SYNC);
        tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
        rc = tc_all_reduce(child, d, 4, TC_FLOAT32, sum, &o, NULL);
        CU(cuStreamSynchronize(stream));
        d2h(got, d, sizeof got);
        report("split all_reduce", TC_FLOAT32, "sum", SYNC, rc == TC_SUCCESS && got[0] == n && got[3] == n);
        dfree(d);
        report("split finalize", TC_FLOAT32, "-", SYNC, tc_comm_finalize(child) == TC_SUCCESS);
        tc_comm_destroy(child);
    }
    /* every rank opts out: a collective call that makes no comm anywhere */
    child = (tc_comm_t *)&rc;
    rc = tc_comm_split(comm, NULL, 0, "gpu_none", NULL, &child);
    report("split all opt out", TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS && child == NULL);
    if (N >= 2) {
        /* ranks 0 and 1 list each other in different orders: both are told,
           nobody hangs, the parent stays usable */
        int mine[2] = {R, 1 - R};
        child = NULL;
        rc = R < 2 ? tc_comm_split(comm, mine, 2, "gpu_mismatch", NULL, &child)
                   : tc_comm_split(comm, NULL, 0, "gpu_mismatch", NULL, &child);
        int ok = R < 2 ? rc == TC_ERR_INVALID_USAGE && child == NULL && strstr(tc_last_error(), "same list") != NULL
                       : rc == TC_SUCCESS && child == NULL;
        if (!ok) fprintf(stderr, "rank %d: mismatched split gave %d: %s\n", R, (int)rc, tc_last_error());
        report("split mismatched lists", TC_FLOAT32, "-", SYNC, ok);
    }
    tc_op_options_t o = opts_for(SYNC);
    rc = tc_barrier(comm, &o, NULL);
    CU(cuStreamSynchronize(stream));
    report("barrier", TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS);
}

/* PREMUL_SUM with the factor given by pointer: in device memory (NCCL reads
   it when the kernel runs) and in host memory (read at the call), for
   float32 and float16, sync and async. */
static void test_premul_pointer(void) {
    static const tc_dtype_t types[] = {TC_FLOAT32, TC_FLOAT16};
    for (size_t ti = 0; ti < 2; ti++) {
        tc_dtype_t t = types[ti];
        size_t es = dt_size(t), n = COUNT;
        char factor[8], *h = malloc(es * n);
        double want[256];
        put(t, factor, 0, PREMUL);
        void *dfactor = dalloc(es), *d = dalloc(es * n);
        h2d(dfactor, factor, es);
        for (int where = 0; where < 2; where++) {
            for (int mode = 0; mode < 2; mode++) {
                seed++;
                tc_reduce_op_t op = TC_REDUCE_OP(TC_PREMUL_SUM);
                op.premul_factor = 100; /* must be ignored: the pointer wins */
                op.premul_factor_ptr = where ? (const void *)factor : dfactor;
                tc_op_options_t o = opts_for(mode);
                fill(t, h, R, 0, n);
                h2d(d, h, es * n);
                tc_work_t *w = NULL;
                tc_result_t rc = finish(mode, tc_all_reduce(comm, d, n, t, op, &o, mode == SYNC ? NULL : &w), &w);
                d2h(h, d, es * n);
                for (size_t i = 0; i < n; i++) want[i] = reduce_ref(t, TC_PREMUL_SUM, i, 0);
                report(where ? "all_reduce premul_sum (host factor pointer)" : "all_reduce premul_sum (device factor pointer)", t,
                       "premul_sum", mode, rc == TC_SUCCESS && compare(t, h, want, n, "premul pointer"));
            }
        }
        dfree(dfactor);
        dfree(d);
        free(h);
    }
}

/* A second comm with hints: non-blocking NCCL calls (blocking=0, where
   NCCL answers ncclInProgress and the library polls) on a high-priority
   internal stream; sync and async all_reduce, a barrier, finalize. */
/* Splits of a non-blocking comm: NCCL runs them as a job of the PARENT
   (ncclCommSplit answers ncclInProgress, the parent is polled, and the child
   handle is written only when the job ends). Without hints the child
   inherits the parent's config (NULL config); with hints it gets a config
   of its own, non-blocking unless a hint says otherwise. The even ranks
   form the first child (the others opt out, NCCL_SPLIT_NOCOLOR), every rank
   the others; each child runs an all_reduce and finalizes, and the parent
   stays usable. */
static void test_nonblocking_split(tc_comm_t *parent) {
    static tc_hint_t max_ctas[] = {{"nccl.max_ctas", "4"}}, blocking_child[] = {{"nccl.blocking", "1"}};
    struct { const char *name, *what; tc_hint_t *hints; int even_only; } cases[] = {
        {"gpu_nb_split_inherit", "split of a non-blocking comm, no hints (NULL config)", NULL, 1},
        {"gpu_nb_split_config", "split of a non-blocking comm with a config (max_ctas=4)", max_ctas, 0},
        {"gpu_nb_split_blocking", "split of a non-blocking comm into a blocking child", blocking_child, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int ranks[MAXR], n = 0;
        for (int r = 0; r < N; r += cases[ci].even_only ? 2 : 1) ranks[n++] = r;
        int member = cases[ci].even_only ? R % 2 == 0 : 1;
        tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
        co.abort_on_error = 0;
        co.hints = cases[ci].hints;
        co.num_hints = cases[ci].hints ? 1 : 0;
        tc_comm_t *child = (tc_comm_t *)&n; /* must be overwritten */
        tc_result_t rc = member ? tc_comm_split(parent, ranks, (size_t)n, cases[ci].name, &co, &child)
                                : tc_comm_split(parent, NULL, 0, cases[ci].name, &co, &child);
        report(cases[ci].what, TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS && (member ? child != NULL : child == NULL));
        if (rc != TC_SUCCESS || !child) continue;
        int cr = -1, cs = -1;
        tc_comm_get_rank(child, &cr);
        tc_comm_get_size(child, &cs);
        float one[4] = {1, 1, 1, 1}, got[4] = {0};
        void *d = dalloc(sizeof one);
        h2d(d, one, sizeof one);
        tc_op_options_t o = opts_for(SYNC);
        tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
        rc = tc_all_reduce(child, d, 4, TC_FLOAT32, sum, &o, NULL);
        CU(cuStreamSynchronize(stream));
        d2h(got, d, sizeof got);
        dfree(d);
        report("all_reduce on the child of a non-blocking split", TC_FLOAT32, "sum", SYNC,
               rc == TC_SUCCESS && cs == n && cr == (cases[ci].even_only ? R / 2 : R) && got[0] == n && got[3] == n);
        report("finalize of the child of a non-blocking split", TC_FLOAT32, "-", SYNC, tc_comm_finalize(child) == TC_SUCCESS);
        tc_comm_destroy(child);
    }
    tc_op_options_t o = opts_for(SYNC);
    tc_result_t rc = tc_barrier(parent, &o, NULL);
    CU(cuStreamSynchronize(stream));
    report("non-blocking parent usable after its splits", TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS);
}

/* Operations on a non-blocking comm for 2 s while its watchdog polls NCCL
   every 100 ms: each operation's settling polls ncclCommGetAsyncError too,
   and NCCL completes the comm's group job there without a lock, so the
   library must never poll one comm from two threads at once. */
static void test_nonblocking_polls(tc_comm_t *c) {
    float one[4] = {1, 1, 1, 1};
    void *d = dalloc(sizeof one);
    tc_op_options_t o = opts_for(SYNC);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tc_result_t rc = TC_SUCCESS;
    long ops = 0;
    /* every rank runs the same number of operations: rank 0's clock decides */
    for (int more = 1; more && rc == TC_SUCCESS; ops++) {
        h2d(d, one, sizeof one);
        rc = tc_all_reduce(c, d, 4, TC_FLOAT32, sum, &o, NULL);
        CU(cuStreamSynchronize(stream));
        clock_gettime(CLOCK_MONOTONIC, &t);
        float flag[4] = {0};
        flag[0] = R == 0 && (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 2000;
        h2d(d, flag, sizeof flag);
        if (rc == TC_SUCCESS) rc = tc_all_reduce(c, d, 4, TC_FLOAT32, sum, &o, NULL);
        CU(cuStreamSynchronize(stream));
        d2h(flag, d, sizeof flag);
        more = flag[0] > 0;
    }
    CU(cuStreamSynchronize(stream));
    dfree(d);
    report("2 s of all_reduces on a non-blocking comm while its watchdog polls", TC_FLOAT32, "sum", SYNC,
           rc == TC_SUCCESS && tc_comm_get_async_error(c) == TC_SUCCESS);
}

static void test_hinted_comm(void) {
    tc_hint_t hints[] = {{"nccl.blocking", "0"}, {"high_priority_stream", "1"}};
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "gpu_ops_nonblocking";
    co.abort_on_error = 0;
    co.hints = hints;
    co.num_hints = 2;
    tc_device_t dev = {TC_DEVICE_CUDA, -1};
    tc_comm_t *c = NULL;
    tc_result_t rc = tc_comm_new("nccl", dev, &co, &c);
    report("tc_comm_new with blocking=0, high_priority_stream=1", TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS);
    if (rc != TC_SUCCESS) return;
    size_t n = COUNT;
    float *h = malloc(sizeof(float) * n);
    void *d = dalloc(sizeof(float) * n);
    double want[256];
    for (int mode = 0; mode < NMODES; mode++) {
        seed++;
        fill(TC_FLOAT32, h, R, 0, n);
        h2d(d, h, sizeof(float) * n);
        tc_op_options_t o = opts_for(mode);
        tc_work_t *w = NULL;
        tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
        rc = finish(mode, tc_all_reduce(c, d, n, TC_FLOAT32, sum, &o, mode == SYNC ? NULL : &w), &w);
        d2h(h, d, sizeof(float) * n);
        for (size_t i = 0; i < n; i++) want[i] = reduce_ref(TC_FLOAT32, TC_SUM, i, 0);
        report("all_reduce on a non-blocking comm", TC_FLOAT32, "sum", mode, rc == TC_SUCCESS && compare(TC_FLOAT32, h, want, n, "non-blocking"));
    }
    /* grouped calls (ncclGroupEnd answers in-progress): an all_to_all list
       and a gather to the last rank */
    for (int mode = 0; mode < NMODES; mode++) {
        seed++;
        size_t es = sizeof(float);
        float *hh = malloc(es * n * (size_t)N);
        void *in = dalloc(es * n * (size_t)N), *out = dalloc(es * n * (size_t)N);
        const void *ins[MAXR];
        void *outs[MAXR];
        for (int r = 0; r < N; r++) { ins[r] = (char *)in + es * n * r; outs[r] = (char *)out + es * n * r; }
        fill(TC_FLOAT32, hh, R, 0, n * N);
        h2d(in, hh, es * n * N);
        tc_op_options_t o = opts_for(mode);
        tc_work_t *w = NULL;
        rc = finish(mode, tc_all_to_all(c, outs, ins, n, TC_FLOAT32, &o, mode == SYNC ? NULL : &w), &w);
        d2h(hh, out, es * n * N);
        double *wa = malloc(sizeof(double) * n * N);
        for (int r = 0; r < N; r++)
            for (size_t i = 0; i < n; i++) wa[r * n + i] = gen(TC_FLOAT32, r, n * R + i);
        report("all_to_all on a non-blocking comm", TC_FLOAT32, "-", mode, rc == TC_SUCCESS && compare(TC_FLOAT32, hh, wa, n * N, "non-blocking all_to_all"));
        fill(TC_FLOAT32, hh, R, 0, n);
        h2d(in, hh, es * n);
        w = NULL;
        rc = finish(mode, tc_gather(c, outs, in, n, TC_FLOAT32, N - 1, &o, mode == SYNC ? NULL : &w), &w);
        d2h(hh, out, es * n * N);
        for (int r = 0; r < N; r++)
            for (size_t i = 0; i < n; i++) wa[r * n + i] = gen(TC_FLOAT32, r, i);
        report("gather on a non-blocking comm", TC_FLOAT32, "-", mode,
               rc == TC_SUCCESS && (R != N - 1 || compare(TC_FLOAT32, hh, wa, n * N, "non-blocking gather")));
        free(wa);
        free(hh);
        dfree(in);
        dfree(out);
    }
    tc_op_options_t o = opts_for(SYNC);
    rc = tc_barrier(c, &o, NULL);
    CU(cuStreamSynchronize(stream));
    report("barrier on a non-blocking comm", TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS);
    test_nonblocking_split(c);
    test_nonblocking_polls(c);
    report("finalize of a non-blocking comm", TC_FLOAT32, "-", SYNC, tc_comm_finalize(c) == TC_SUCCESS);
    tc_comm_destroy(c);
    dfree(d);
    free(h);
}

/* A plain host buffer is refused up front (NCCL would hand it to a kernel
   whose fault breaks the process's CUDA context); pinned host memory is
   device-accessible and works. */
static void test_host_buffers(void) {
    enum { HN = 64 };
    tc_op_options_t o = opts_for(SYNC);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    float plain[HN];
    for (int i = 0; i < HN; i++) plain[i] = (float)i;
    tc_result_t rc = tc_all_reduce(comm, plain, HN, TC_FLOAT32, sum, &o, NULL);
    report("plain host buffer refused (TC_ERR_INVALID_ARGUMENT)", TC_FLOAT32, "sum", SYNC, rc == TC_ERR_INVALID_ARGUMENT);
    report("comm healthy after a refused host buffer", TC_FLOAT32, "-", SYNC, tc_comm_get_async_error(comm) == TC_SUCCESS);
    float *pinned = NULL;
    CU(cuMemHostAlloc((void **)&pinned, HN * sizeof(float), 0));
    for (int i = 0; i < HN; i++) pinned[i] = (float)(i % 5);
    rc = tc_all_reduce(comm, pinned, HN, TC_FLOAT32, sum, &o, NULL);
    CU(cuStreamSynchronize(stream));
    int ok = rc == TC_SUCCESS;
    for (int i = 0; i < HN && ok; i++) ok = pinned[i] == (float)(N * (i % 5));
    report("all_reduce on pinned host memory", TC_FLOAT32, "sum", SYNC, ok);
    CU(cuMemFreeHost(pinned));
}

/* Bitwise reductions are unsupported on NCCL and leave the comm usable. */
static void test_unsupported(void) {
    void *d = dalloc(16);
    tc_op_options_t o = opts_for(SYNC);
    tc_reduce_op_t band = TC_REDUCE_OP(TC_BAND);
    tc_result_t rc = tc_all_reduce(comm, d, 4, TC_INT32, band, &o, NULL);
    report("band is TC_ERR_UNSUPPORTED", TC_INT32, "band", SYNC, rc == TC_ERR_UNSUPPORTED);
    report("comm healthy after unsupported op", TC_INT32, "-", SYNC, tc_comm_get_async_error(comm) == TC_SUCCESS);
    dfree(d);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "gpu_ops";
    co.abort_on_error = 0;
    tc_device_t dev = {TC_DEVICE_CUDA, -1};
    tc_result_t rc = tc_comm_new("nccl", dev, &co, &comm);
    if (rc != TC_SUCCESS) {
        fprintf(stderr, "tc_comm_new(nccl): %s: %s\n", tc_result_string(rc), tc_last_error());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    if (N > MAXR) { fprintf(stderr, "at most %d ranks\n", MAXR); return 1; }

    static const tc_dtype_t dtypes[] = {TC_FLOAT32, TC_FLOAT64, TC_FLOAT16, TC_BFLOAT16, TC_INT8, TC_UINT8, TC_INT32,
                                        TC_INT64, TC_BOOL, TC_UINT32, TC_UINT64, TC_FLOAT8_E4M3, TC_FLOAT8_E5M2};
    int modes = env_int("TC_GPU_MODES", NMODES);
    for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++) {
        tc_dtype_t t = dtypes[di];
        if (dt_fp8(t)) { /* NCCL 2.24 or newer */
            void *d = dalloc(16);
            tc_op_options_t o = opts_for(SYNC);
            tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
            rc = tc_all_reduce(comm, d, 4, t, sum, &o, NULL);
            CU(cuStreamSynchronize(stream));
            dfree(d);
            if (rc == TC_ERR_UNSUPPORTED) {
                printf("rank %d: %s skipped: %s\n", R, dt_name(t), tc_last_error());
                skipped++;
                continue;
            }
        }
        for (int mode = 0; mode < modes; mode++) {
            for (size_t ki = 0; ki < sizeof red_kinds / sizeof red_kinds[0]; ki++) {
                int k = red_kinds[ki];
                seed++;
                if (!red_supported(t, k)) {
                    void *d = dalloc(16);
                    tc_op_options_t o = opts_for(SYNC);
                    tc_reduce_op_t op = TC_REDUCE_OP(k);
                    rc = tc_all_reduce(comm, d, 1, t, op, &o, NULL);
                    report("unsupported reduction refused", t, red_name[k], mode, rc == TC_ERR_UNSUPPORTED);
                    dfree(d);
                    continue;
                }
                test_reductions(t, k, mode);
            }
            seed++;
            test_movement(t, mode);
        }
    }
    test_graph(0);
    test_graph(1);
    test_graph_in_place_all_to_all();
    test_global_capture_while_pending();
    test_global_capture_while_staging();
    test_many_in_flight();
    test_split();
    test_premul_pointer();
    test_hinted_comm();
    test_host_buffers();
    test_unsupported();

    rc = tc_comm_finalize(comm);
    report("finalize", TC_FLOAT32, "-", SYNC, rc == TC_SUCCESS);
    tc_comm_destroy(comm);
    CU(cuStreamDestroy(stream));
    printf("rank %d: %d passed, %d failed, %d skipped\n", R, passed, failed, skipped);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
