/* TEST DOUBLE: a simulated NCCL (libnccl.so.2) for world size 1, running on
   our simulated CUDA driver (fake_cuda.c). Written for this project from
   NCCL's documented C API; it is not NVIDIA's NCCL and proves nothing about
   real NCCL or real GPUs. What it models:
   - one rank: a collective is a device-to-device copy from the send to the
     receive buffer (nothing moves when they are equal), run as a "kernel" on
     the caller's stream (so it is recorded when the stream captures a
     graph); PreMulSum multiplies by its scalar (host value taken at
     creation, device value read when the kernel runs); SUM, PROD, MIN, MAX
     and AVG of one contribution are the identity;
   - argument checks NCCL makes or that a real GPU would turn into a fault:
     comm handles (destroyed or aborted comms are kept and reported), data
     types of this version, reduction ops (user ops belong to their comm and
     datatype), root and peer ranks, buffers (simulated device memory or
     pinned/registered host memory; plain host memory is refused), streams;
   - groups: calls between ncclGroupStart and ncclGroupEnd are launched at
     the end; send/recv to self must be inside a group and match in size;
     a failed call inside a group fails the group and launches nothing;
   - non-blocking comms (config blocking = 0): init, collectives and group
     ends answer ncclInProgress, and ncclCommGetAsyncError reports
     ncclInProgress for a few polls;
   - comms are not thread-safe: two threads inside calls on one comm at once
     is reported as ncclInvalidUsage (ncclCommGetAsyncError and
     ncclCommAbort may come from any thread, as NCCL allows);
   - nranks != 1 is ncclInvalidUsage with a message;
   - a peer that never arrives: with TC_SIM_NCCL_HANG_CALL=N (or a list
     N,M,...) the N-th kernel launched in the process keeps running until its comm is aborted (or
     TC_SIM_NCCL_HANG_MS, default 60000, passed), as a real collective waits
     for a missing rank.
   Compile with -DSIM_NCCL_VERSION=21805 (say) to get an older library:
   symbols newer than that version are not exported at all, like the real
   older library (ncclCommRegister/ncclMemAlloc 2.19, fp8 2.24, ncclAlltoAll,
   ncclGather and ncclScatter 2.28). */
#define _GNU_SOURCE
#include "sim_gpu.h"
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef SIM_NCCL_VERSION
#define SIM_NCCL_VERSION 22809
#endif
#define HAS(v) (SIM_NCCL_VERSION >= (v))
#define EXPORT __attribute__((visibility("default")))

typedef int ncclResult_t;
enum { ncclSuccess, ncclUnhandledCudaError, ncclSystemError, ncclInternalError, ncclInvalidArgument, ncclInvalidUsage,
       ncclRemoteError, ncclInProgress };
typedef int ncclDataType_t;
enum { ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64, ncclFloat16, ncclFloat32, ncclFloat64,
       ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2 };
#define NUM_TYPES (HAS(22400) ? 12 : 10)
typedef int ncclRedOp_t;
enum { ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, ncclNumOps };
enum { ncclScalarDevice, ncclScalarHostImmediate };
#define NCCL_SPLIT_NOCOLOR (-1)
#define CONFIG_MAGIC 0xcafebeefu
#define UNDEF_INT INT32_MIN

typedef struct {
    char internal[128];
} ncclUniqueId;

/* The leading fields of ncclConfig_t (present in every version we accept). */
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking;
} config_head;

#define MAX_USER_OPS 64
struct user_op {
    int live;
    ncclDataType_t dtype;
    int residence;
    unsigned char value[8];
    const void *dev;
};

enum { LIVE, FINALIZED, DESTROYED, ABORTED };
struct reg;
typedef struct ncclComm {
    unsigned magic;
    int state, blocking, device, pending_polls, inflight, busy;
    struct user_op ops[MAX_USER_OPS];
    struct reg *regs; /* live registrations, released with the comm */
    struct ncclComm *next;
} *ncclComm_t;
static void release_registrations(ncclComm_t c);
#define COMM_MAGIC 0x4e43434cu

static pthread_mutex_t M = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t MC = PTHREAD_COND_INITIALIZER;
static struct ncclComm *comms;
static __thread char last_error[512];

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    const char *t = getenv("TC_SIM_TRACE");
    if (t && *t && strcmp(t, "0") != 0) fprintf(stderr, "[sim-nccl] error %d: %s\n", r, last_error);
    return r;
}

EXPORT ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = SIM_NCCL_VERSION;
    return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (simulated NCCL)";
    case ncclSystemError: return "unhandled system error (simulated NCCL)";
    case ncclInternalError: return "internal error (simulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (simulated NCCL)";
    case ncclInvalidUsage: return "invalid usage (simulated NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

#if HAS(21300)
EXPORT const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm; /* NCCL keeps one last error per thread, not per comm */
    return last_error;
}
#endif

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    memset(id, 0, sizeof *id);
    memcpy(id->internal, "SIMNCCL", 8);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long v[3] = {(long)getpid(), t.tv_sec, t.tv_nsec};
    memcpy(id->internal + 8, v, sizeof v);
    return ncclSuccess;
}

/* Under M: a usable comm, or an error naming what is wrong with it. */
static ncclResult_t check_comm(ncclComm_t c, const char *fn, int allow_finalized) {
    if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    struct ncclComm *k = comms;
    while (k && k != c) k = k->next;
    if (!k || c->magic != COMM_MAGIC) return fail(ncclInvalidArgument, "%s: %p is not a comm of this library", fn, (void *)c);
    if (c->state == DESTROYED || c->state == ABORTED) {
        fprintf(stderr, "[sim-nccl] %s: use of comm %p after ncclComm%s (a use-after-free with real NCCL)\n", fn, (void *)c,
                c->state == ABORTED ? "Abort" : "Destroy");
        return fail(ncclInvalidArgument, "%s: comm %p was %s", fn, (void *)c, c->state == ABORTED ? "aborted" : "destroyed");
    }
    if (c->state == FINALIZED && !allow_finalized) return fail(ncclInvalidUsage, "%s: comm was finalized", fn);
    return ncclSuccess;
}

/* Calls on one comm from two threads at once are a caller bug: NCCL comms
   are not thread-safe. */
static ncclResult_t enter(ncclComm_t c, const char *fn, int allow_finalized) {
    pthread_mutex_lock(&M);
    ncclResult_t r = check_comm(c, fn, allow_finalized);
    if (r == ncclSuccess && c->busy) {
        fprintf(stderr, "[sim-nccl] %s: comm %p used by two threads at once\n", fn, (void *)c);
        r = fail(ncclInvalidUsage, "%s: comm %p is in use by another thread", fn, (void *)c);
    }
    if (r == ncclSuccess) c->busy = 1;
    pthread_mutex_unlock(&M);
    return r;
}
static ncclResult_t leave(ncclComm_t c, ncclResult_t r) {
    pthread_mutex_lock(&M);
    c->busy = 0;
    if (r == ncclSuccess && !c->blocking) {
        c->pending_polls = 2;
        r = ncclInProgress;
    }
    pthread_mutex_unlock(&M);
    return r;
}

static ncclResult_t new_comm(ncclComm_t *out, const config_head *cfg, const char *fn) {
    int blocking = 1;
    if (cfg) {
        if (cfg->magic != CONFIG_MAGIC || cfg->size < sizeof *cfg)
            return fail(ncclInvalidArgument, "%s: config was not initialized with NCCL_CONFIG_INITIALIZER (magic %#x, size %zu)", fn,
                        cfg->magic, cfg->size);
        if (cfg->blocking != UNDEF_INT && cfg->blocking != 0 && cfg->blocking != 1)
            return fail(ncclInvalidArgument, "%s: config.blocking is %d (0 or 1)", fn, cfg->blocking);
        if (cfg->blocking == 0) blocking = 0;
    }
    struct ncclComm *c = calloc(1, sizeof *c);
    c->magic = COMM_MAGIC;
    c->blocking = blocking;
    /* the device current at init, as NCCL takes it from the runtime (device
       0 when no context is current) */
    int d = simcu_current_device();
    c->device = d < 0 ? 0 : d;
    pthread_mutex_lock(&M);
    c->next = comms;
    comms = c;
    if (!blocking) c->pending_polls = 2;
    pthread_mutex_unlock(&M);
    *out = c;
    return blocking ? ncclSuccess : ncclInProgress;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    if (nranks != 1)
        return fail(ncclInvalidUsage,
                    "ncclCommInitRankConfig: nranks %d: this simulated NCCL runs one rank only (use a real GPU for more)", nranks);
    if (rank != 0) return fail(ncclInvalidArgument, "ncclCommInitRankConfig: rank %d is outside [0, %d)", rank, nranks);
    if (memcmp(id.internal, "SIMNCCL", 8) != 0)
        return fail(ncclInvalidArgument, "ncclCommInitRankConfig: the unique id was not made by ncclGetUniqueId");
    return new_comm(comm, config, "ncclCommInitRankConfig");
}
EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

#if HAS(21800)
EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config) {
    (void)key;
    if (!newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    ncclResult_t r = enter(comm, "ncclCommSplit", 0);
    if (r != ncclSuccess) return r;
    if (color == NCCL_SPLIT_NOCOLOR) *newcomm = NULL;
    else if (color < 0) r = fail(ncclInvalidArgument, "ncclCommSplit: color %d is negative", color);
    else r = new_comm(newcomm, config, "ncclCommSplit");
    pthread_mutex_lock(&M);
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}
#endif

/* One rank: every comm counts 1 and this process is its rank 0. */
static ncclResult_t comm_int(ncclComm_t comm, int *out, int value, const char *fn) {
    if (!out) return fail(ncclInvalidArgument, "%s: out-pointer is NULL", fn);
    pthread_mutex_lock(&M);
    ncclResult_t r = check_comm(comm, fn, 1);
    if (r == ncclSuccess) *out = value;
    pthread_mutex_unlock(&M);
    return r;
}
EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { return comm_int(comm, count, 1, "ncclCommCount"); }
EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { return comm_int(comm, rank, 0, "ncclCommUserRank"); }

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    pthread_mutex_lock(&M);
    ncclResult_t r = check_comm(comm, "ncclCommGetAsyncError", 1);
    if (r == ncclSuccess) {
        if (comm->pending_polls > 0) {
            comm->pending_polls--;
            *asyncError = ncclInProgress;
        } else {
            *asyncError = ncclSuccess;
        }
    }
    pthread_mutex_unlock(&M);
    return r;
}

/* Under M: waits for the comm's launched (not captured) kernels. */
static void drain(ncclComm_t c) {
    while (c->inflight > 0) pthread_cond_wait(&MC, &M);
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    ncclResult_t r = enter(comm, "ncclCommFinalize", 0);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&M);
    drain(comm); /* finalize flushes the comm's operations */
    comm->state = FINALIZED;
    pthread_mutex_unlock(&M);
    return leave(comm, ncclSuccess);
}
EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ncclResult_t r = enter(comm, "ncclCommDestroy", 1);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&M);
    drain(comm);
    comm->state = DESTROYED; /* kept, so that a later use is reported */
    comm->busy = 0;
    release_registrations(comm);
    pthread_mutex_unlock(&M);
    return ncclSuccess;
}
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    pthread_mutex_lock(&M);
    /* any thread may abort, also while another is inside a call */
    ncclResult_t r = check_comm(comm, "ncclCommAbort", 1);
    if (r == ncclSuccess) {
        comm->state = ABORTED;
        release_registrations(comm);
    }
    pthread_mutex_unlock(&M);
    return r;
}

/* ---- data types and reductions ------------------------------------------ */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023u, x;
    if (e == 0 && m == 0) x = sign;
    else if (e == 0) { /* subnormal */
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    } else if (e == 31) x = sign | 0x7f800000u | (m << 13);
    else x = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    float a = fabsf(f);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < ldexpf(1, -14)) return (uint16_t)(sign | (uint16_t)lrintf(a * ldexpf(1, 24))); /* subnormal, nearest even */
    int e;
    float mant = frexpf(a, &e); /* a = mant * 2^e, mant in [0.5, 1) */
    uint32_t m = (uint32_t)lrintf(ldexpf(mant, 11)); /* 11 significant bits, nearest even */
    if (m == 2048) { m = 1024; e++; }
    return (uint16_t)(sign | ((uint32_t)(e + 14) << 10) | (m & 1023u));
}
static float bf16_to_float(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if (isnan(f)) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* dst[i] = src[i] * scalar, in the data type's own arithmetic. */
static void premul(ncclDataType_t t, char *dst, const char *src, size_t n, const unsigned char *s) {
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case ncclFloat32: { float a, b; memcpy(&a, src + 4 * i, 4); memcpy(&b, s, 4); a *= b; memcpy(dst + 4 * i, &a, 4); break; }
        case ncclFloat64: { double a, b; memcpy(&a, src + 8 * i, 8); memcpy(&b, s, 8); a *= b; memcpy(dst + 8 * i, &a, 8); break; }
        case ncclFloat16: case ncclBfloat16: {
            uint16_t a, b;
            memcpy(&a, src + 2 * i, 2);
            memcpy(&b, s, 2);
            uint16_t r = t == ncclFloat16 ? float_to_half(half_to_float(a) * half_to_float(b))
                                          : float_to_bf16(bf16_to_float(a) * bf16_to_float(b));
            memcpy(dst + 2 * i, &r, 2);
            break;
        }
        case ncclInt8: case ncclUint8: dst[i] = (char)(unsigned char)((unsigned char)src[i] * s[0]); break;
        case ncclInt32: case ncclUint32: { uint32_t a, b; memcpy(&a, src + 4 * i, 4); memcpy(&b, s, 4); a *= b; memcpy(dst + 4 * i, &a, 4); break; }
        case ncclInt64: case ncclUint64: { uint64_t a, b; memcpy(&a, src + 8 * i, 8); memcpy(&b, s, 8); a *= b; memcpy(dst + 8 * i, &a, 8); break; }
        default: memcpy(dst + i, src + i, 1); break; /* fp8: no pre-multiplication in NCCL */
        }
    }
}

/* ---- kernels ----------------------------------------------------------- */

struct kernel {
    ncclComm_t comm;
    int hang; /* TC_SIM_NCCL_HANG_CALL picked this one */
    int counted; /* launched outside a capture: finalize waits for it */
    const char *name;
    const void *src;
    void *dst;
    size_t count;
    ncclDataType_t dtype;
    int has_scalar, residence;
    unsigned char value[8];
    const void *dev_scalar;
};

static void run_kernel(void *p) {
    struct kernel *k = p;
    pthread_mutex_lock(&M);
    int state = k->comm->state;
    pthread_mutex_unlock(&M);
    size_t bytes = k->count * type_size(k->dtype);
    if (k->hang) {
        const char *v = getenv("TC_SIM_NCCL_HANG_MS");
        long ms = v && *v ? atol(v) : 60000;
        for (long t = 0; t < ms && state == LIVE; t++) {
            usleep(1000);
            pthread_mutex_lock(&M);
            state = k->comm->state;
            pthread_mutex_unlock(&M);
        }
    }
    if (state == ABORTED) return; /* kernels of an aborted comm stop early */
    if (state == DESTROYED) {
        simcu_fault("%s kernel ran after its NCCL comm %p was destroyed (a graph replayed after ncclCommDestroy?)", k->name,
                    (void *)k->comm);
        return;
    }
    char *d = simcu_device_view(k->dst, bytes);
    const char *s = simcu_device_view(k->src, bytes);
    if (!d || !s) {
        simcu_fault("%s: buffer %p or %p (%zu bytes) is not device-accessible memory when the kernel runs (freed?)", k->name,
                    k->src, k->dst, bytes);
        return;
    }
    if (!k->has_scalar) {
        if (d != s) memmove(d, s, bytes);
        return;
    }
    unsigned char v[8];
    memcpy(v, k->value, sizeof v);
    if (k->residence == ncclScalarDevice) {
        const void *sv = simcu_device_view(k->dev_scalar, type_size(k->dtype));
        if (!sv) {
            simcu_fault("%s: the PreMulSum scalar at %p is not device-accessible when the kernel runs", k->name, k->dev_scalar);
            return;
        }
        memcpy(v, sv, type_size(k->dtype));
    }
    premul(k->dtype, d, s, k->count, v);
}
static void release_kernel(void *p) {
    struct kernel *k = p;
    if (k->counted) {
        pthread_mutex_lock(&M);
        k->comm->inflight--;
        pthread_cond_broadcast(&MC);
        pthread_mutex_unlock(&M);
    }
    free(k);
}

static ncclResult_t launch(struct kernel *k, CUstream stream) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    const char *name = k->name;
    if (cuStreamIsCapturing(stream, &st) != CUDA_SUCCESS) {
        free(k);
        return fail(ncclUnhandledCudaError, "%s: stream %p is not a valid stream", name, (void *)stream);
    }
    k->counted = st == CU_STREAM_CAPTURE_STATUS_NONE;
    static long launches;
    const char *hang = getenv("TC_SIM_NCCL_HANG_CALL"); /* "N" or "N,M,..." */
    pthread_mutex_lock(&M);
    long me = ++launches;
    for (const char *p = hang; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (atol(p) == me) k->hang = 1;
    if (k->counted) k->comm->inflight++;
    pthread_mutex_unlock(&M);
    CUresult r = simcu_launch(stream, run_kernel, k, release_kernel); /* releases k on failure */
    if (r != CUDA_SUCCESS) return fail(ncclUnhandledCudaError, "%s: kernel launch failed: CUDA error %d", name, (int)r);
    return ncclSuccess;
}

/* ---- groups ------------------------------------------------------------ */

enum { P_COLL, P_SEND, P_RECV };
struct pending {
    int kind;
    struct kernel *k; /* P_COLL */
    ncclComm_t comm;
    void *buf;
    size_t bytes;
    CUstream stream;
    struct pending *next;
};
static __thread int g_depth;
static __thread ncclResult_t g_error;
static __thread struct pending *g_head, *g_tail;

static void defer(struct pending *p) {
    p->next = NULL;
    if (g_tail) g_tail->next = p;
    else g_head = p;
    g_tail = p;
}

EXPORT ncclResult_t ncclGroupStart(void) {
    if (g_depth == 0) g_error = ncclSuccess;
    g_depth++;
    return ncclSuccess;
}

static void drop_group(void) {
    while (g_head) {
        struct pending *p = g_head;
        g_head = p->next;
        free(p->k);
        free(p);
    }
    g_tail = NULL;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
    if (g_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no group was started");
    if (--g_depth > 0) return ncclSuccess;
    ncclResult_t r = g_error;
    /* pair sends and receives to self, in order, per comm */
    for (struct pending *p = g_head; p && r == ncclSuccess; p = p->next) {
        if (p->kind != P_SEND) continue;
        struct pending *q = g_head;
        while (q && !(q->kind == P_RECV && q->comm == p->comm)) q = q->next;
        if (!q) {
            r = fail(ncclInvalidUsage, "ncclGroupEnd: a send to self (%zu bytes) has no matching receive: it would never complete",
                     p->bytes);
            break;
        }
        if (q->bytes != p->bytes) {
            r = fail(ncclInvalidUsage, "ncclGroupEnd: send of %zu bytes to self matched with a receive of %zu bytes", p->bytes, q->bytes);
            break;
        }
        struct kernel *k = calloc(1, sizeof *k);
        k->comm = p->comm, k->name = "ncclSend/ncclRecv", k->src = p->buf, k->dst = q->buf, k->count = p->bytes, k->dtype = ncclUint8;
        q->kind = -1; /* consumed */
        p->kind = P_COLL;
        p->k = k;
        p->stream = q->stream;
    }
    for (struct pending *p = g_head; p && r == ncclSuccess; p = p->next)
        if (p->kind == P_RECV) r = fail(ncclInvalidUsage, "ncclGroupEnd: a receive from self (%zu bytes) has no matching send", p->bytes);
    ncclComm_t any = g_head ? g_head->comm : NULL;
    for (struct pending *p = g_head; p && r == ncclSuccess; p = p->next) {
        if (p->kind != P_COLL) continue;
        struct kernel *k = p->k;
        p->k = NULL;
        r = launch(k, p->stream);
    }
    drop_group();
    if (r == ncclSuccess && any) {
        pthread_mutex_lock(&M);
        if (!any->blocking && any->state == LIVE) {
            any->pending_polls = 2;
            r = ncclInProgress;
        }
        pthread_mutex_unlock(&M);
    }
    return r;
}

/* ---- argument checks ----------------------------------------------------- */

static ncclResult_t check_buffer(const void *p, size_t bytes, const char *fn, const char *which) {
    if (bytes == 0) return ncclSuccess;
    if (!p) return fail(ncclInvalidArgument, "%s: %s is NULL", fn, which);
    int kind = simcu_memory_kind(p);
    if (kind == 0)
        return fail(ncclInvalidArgument, "%s: %s %p is not device memory or registered host memory (plain host memory)", fn, which, p);
    if (!simcu_device_view(p, bytes))
        return fail(ncclInvalidArgument, "%s: %s %p does not hold %zu bytes in one allocation", fn, which, p, bytes);
    return ncclSuccess;
}

/* Builds the kernel of a collective after checking its arguments; under a
   group it is deferred. `op` < 0: no reduction. */
static ncclResult_t collective(const char *fn, ncclComm_t comm, const void *src, void *dst, size_t count, ncclDataType_t t,
                               ncclRedOp_t op, int root, CUstream stream) {
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) {
        if (g_depth) g_error = r;
        return r;
    }
    struct kernel *k = NULL;
    if (t < 0 || t >= NUM_TYPES) r = fail(ncclInvalidArgument, "%s: invalid data type %d (NCCL %d)", fn, t, SIM_NCCL_VERSION);
    else if (root != 0) r = fail(ncclInvalidArgument, "%s: root %d is outside [0, 1)", fn, root);
    else if (!simcu_stream_valid(stream)) r = fail(ncclUnhandledCudaError, "%s: stream %p is not a valid stream", fn, (void *)stream);
    else if ((r = check_buffer(src, count * type_size(t), fn, "sendbuff")) != ncclSuccess) {
    } else if ((r = check_buffer(dst, count * type_size(t), fn, "recvbuff")) != ncclSuccess) {
    } else {
        k = calloc(1, sizeof *k);
        k->comm = comm, k->name = fn, k->src = src, k->dst = dst, k->count = count, k->dtype = t;
        if (op >= ncclNumOps) {
            pthread_mutex_lock(&M);
            struct user_op *u = op - ncclNumOps < MAX_USER_OPS ? &comm->ops[op - ncclNumOps] : NULL;
            if (!u || !u->live) r = fail(ncclInvalidArgument, "%s: reduction op %d is not a live op of this comm", fn, op);
            else if (u->dtype != t) r = fail(ncclInvalidArgument, "%s: op %d was created for data type %d, used with %d", fn, op, u->dtype, t);
            else {
                /* NCCL takes what it needs now: the op may be destroyed once this call returned */
                k->has_scalar = 1, k->residence = u->residence, k->dev_scalar = u->dev;
                memcpy(k->value, u->value, sizeof k->value);
            }
            pthread_mutex_unlock(&M);
        } else if (op < -1 || (op >= 0 && op >= ncclNumOps)) {
            r = fail(ncclInvalidArgument, "%s: invalid reduction op %d", fn, op);
        }
    }
    if (r == ncclSuccess && g_depth) {
        struct pending *p = calloc(1, sizeof *p);
        p->kind = P_COLL, p->k = k, p->comm = comm, p->stream = stream;
        defer(p);
    } else if (r == ncclSuccess) {
        r = launch(k, stream);
    } else {
        free(k);
        if (g_depth) g_error = r;
    }
    if (g_depth) { /* the group's end reports in-progress, not each call */
        pthread_mutex_lock(&M);
        comm->busy = 0;
        pthread_mutex_unlock(&M);
        return r;
    }
    return leave(comm, r);
}

EXPORT ncclResult_t ncclAllReduce(const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, CUstream st) {
    return collective("ncclAllReduce", c, s, d, n, t, op < 0 ? 1000 : op, 0, st);
}
EXPORT ncclResult_t ncclReduce(const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c, CUstream st) {
    /* off the root recvbuff is unused; one rank is always the root */
    return collective("ncclReduce", c, s, d, n, t, op < 0 ? 1000 : op, root, st);
}
EXPORT ncclResult_t ncclBroadcast(const void *s, void *d, size_t n, ncclDataType_t t, int root, ncclComm_t c, CUstream st) {
    return collective("ncclBroadcast", c, s, d, n, t, -1, root, st);
}
EXPORT ncclResult_t ncclAllGather(const void *s, void *d, size_t n, ncclDataType_t t, ncclComm_t c, CUstream st) {
    return collective("ncclAllGather", c, s, d, n, t, -1, 0, st);
}
EXPORT ncclResult_t ncclReduceScatter(const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, CUstream st) {
    return collective("ncclReduceScatter", c, s, d, n, t, op < 0 ? 1000 : op, 0, st);
}
#if HAS(22800)
EXPORT ncclResult_t ncclAlltoAll(const void *s, void *d, size_t n, ncclDataType_t t, ncclComm_t c, CUstream st) {
    return collective("ncclAlltoAll", c, s, d, n, t, -1, 0, st);
}
EXPORT ncclResult_t ncclGather(const void *s, void *d, size_t n, ncclDataType_t t, int root, ncclComm_t c, CUstream st) {
    return collective("ncclGather", c, s, d, n, t, -1, root, st);
}
EXPORT ncclResult_t ncclScatter(const void *s, void *d, size_t n, ncclDataType_t t, int root, ncclComm_t c, CUstream st) {
    return collective("ncclScatter", c, s, d, n, t, -1, root, st);
}
#endif

static ncclResult_t p2p(int kind, void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t comm, CUstream stream) {
    const char *fn = kind == P_SEND ? "ncclSend" : "ncclRecv";
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) {
        if (g_depth) g_error = r;
        return r;
    }
    if (t < 0 || t >= NUM_TYPES) r = fail(ncclInvalidArgument, "%s: invalid data type %d", fn, t);
    else if (peer != 0) r = fail(ncclInvalidArgument, "%s: peer %d is outside [0, 1)", fn, peer);
    else if (!simcu_stream_valid(stream)) r = fail(ncclUnhandledCudaError, "%s: stream %p is not a valid stream", fn, (void *)stream);
    else if (!g_depth)
        r = fail(ncclInvalidUsage, "%s: a send or receive to self outside a group never completes (real NCCL hangs)", fn);
    else r = check_buffer(buf, n * type_size(t), fn, kind == P_SEND ? "sendbuff" : "recvbuff");
    if (r == ncclSuccess) {
        struct pending *p = calloc(1, sizeof *p);
        p->kind = kind, p->comm = comm, p->buf = buf, p->bytes = n * type_size(t), p->stream = stream;
        defer(p);
    } else if (g_depth) {
        g_error = r;
    }
    pthread_mutex_lock(&M);
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}
EXPORT ncclResult_t ncclSend(const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, CUstream s) {
    return p2p(P_SEND, (void *)buf, n, t, peer, c, s);
}
EXPORT ncclResult_t ncclRecv(void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, CUstream s) {
    return p2p(P_RECV, buf, n, t, peer, c, s);
}

/* ---- PreMulSum ---------------------------------------------------------- */

EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t t, int residence, ncclComm_t comm) {
    ncclResult_t r = enter(comm, "ncclRedOpCreatePreMulSum", 0);
    if (r != ncclSuccess) return r;
    if (!op || !scalar) r = fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op or scalar is NULL");
    else if (t < 0 || t >= NUM_TYPES) r = fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid data type %d", t);
    else if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        r = fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid residence %d", residence);
    else if (residence == ncclScalarDevice && !simcu_device_view(scalar, type_size(t)))
        r = fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: device-resident scalar %p is not device-accessible memory", scalar);
    if (r == ncclSuccess) {
        pthread_mutex_lock(&M);
        int i = 0;
        while (i < MAX_USER_OPS && comm->ops[i].live) i++;
        if (i == MAX_USER_OPS) r = fail(ncclInvalidUsage, "ncclRedOpCreatePreMulSum: too many live ops (leaked?)");
        else {
            struct user_op *u = &comm->ops[i];
            memset(u, 0, sizeof *u);
            u->live = 1, u->dtype = t, u->residence = residence;
            if (residence == ncclScalarHostImmediate) memcpy(u->value, scalar, type_size(t)); /* read now */
            else u->dev = scalar;
            *op = ncclNumOps + i;
        }
        comm->busy = 0;
        pthread_mutex_unlock(&M);
        return r;
    }
    pthread_mutex_lock(&M);
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}
EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
    ncclResult_t r = enter(comm, "ncclRedOpDestroy", 0);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&M);
    if (op < ncclNumOps || op - ncclNumOps >= MAX_USER_OPS || !comm->ops[op - ncclNumOps].live)
        r = fail(ncclInvalidArgument, "ncclRedOpDestroy: %d is not a live user op of this comm", op);
    else comm->ops[op - ncclNumOps].live = 0;
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}

/* ---- registration and allocation ---------------------------------------- */

struct reg {
    unsigned magic;
    ncclComm_t comm;
    void *buf;
    size_t size;
    struct reg *next;
};
#define REG_MAGIC 0x52454749u

/* Under M: a destroyed or aborted comm takes its registrations with it. */
static void release_registrations(ncclComm_t c) {
    while (c->regs) {
        struct reg *g = c->regs;
        c->regs = g->next;
        g->magic = 0;
        free(g);
    }
}

#if HAS(21900)

EXPORT ncclResult_t ncclCommRegister(ncclComm_t comm, void *buff, size_t size, void **handle) {
    ncclResult_t r = enter(comm, "ncclCommRegister", 0);
    if (r != ncclSuccess) return r;
    if (!handle) r = fail(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
    else if (simcu_memory_kind(buff) != CU_MEMORYTYPE_DEVICE)
        r = fail(ncclInvalidArgument, "ncclCommRegister: %p is not device memory", buff);
    else if (!simcu_device_view(buff, size))
        r = fail(ncclInvalidArgument, "ncclCommRegister: %p does not hold %zu bytes in one allocation", buff, size);
    else {
        struct reg *g = calloc(1, sizeof *g);
        g->magic = REG_MAGIC, g->comm = comm, g->buf = buff, g->size = size;
        pthread_mutex_lock(&M);
        g->next = comm->regs;
        comm->regs = g;
        pthread_mutex_unlock(&M);
        *handle = g;
    }
    pthread_mutex_lock(&M);
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}
EXPORT ncclResult_t ncclCommDeregister(ncclComm_t comm, void *handle) {
    ncclResult_t r = enter(comm, "ncclCommDeregister", 1);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&M);
    struct reg **pp = &comm->regs; /* only live handles are looked at */
    while (*pp && *pp != handle) pp = &(*pp)->next;
    struct reg *g = *pp;
    if (!g || g->magic != REG_MAGIC)
        r = fail(ncclInvalidArgument, "ncclCommDeregister: %p is not a live registration of this comm", handle);
    else if (simcu_memory_kind(g->buf) != CU_MEMORYTYPE_DEVICE)
        r = fail(ncclUnhandledCudaError, "ncclCommDeregister: the registered buffer %p was freed before it was deregistered", g->buf);
    else {
        *pp = g->next;
        g->magic = 0;
        free(g);
    }
    pthread_mutex_unlock(&M);
    pthread_mutex_lock(&M);
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}
EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    if (!ptr || size == 0) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL or size is 0");
    CUresult c = simcu_alloc(ptr, size, 1);
    return c == CUDA_SUCCESS ? ncclSuccess : fail(ncclUnhandledCudaError, "ncclMemAlloc(%zu): CUDA error %d", size, (int)c);
}
EXPORT ncclResult_t ncclMemFree(void *ptr) {
    if (!ptr) return ncclSuccess;
    CUresult c = simcu_free(ptr, 1);
    return c == CUDA_SUCCESS ? ncclSuccess
                             : fail(ncclUnhandledCudaError, "ncclMemFree(%p): not memory of ncclMemAlloc (CUDA error %d)", ptr, (int)c);
}
#endif
