/* TEST DOUBLE: a simulated NCCL (libnccl.so.2) running on our simulated CUDA
   driver (fake_cuda.c), for one rank or for several ranks as separate
   processes on one machine. Written for this project from NCCL's documented
   C API; it is not NVIDIA's NCCL and proves nothing about real NCCL, its
   algorithms or real GPUs. What it models:
   - ranks: ncclGetUniqueId makes a random id; ncclCommInitRank(Config) with
     nranks > 1 joins the "job" of that id, a directory
     $TC_SIM_NCCL_DIR/tc-sim-nccl-<id> (default $TMPDIR or /tmp), where every
     rank leaves a join file and waits for the others (a rank missing after
     TC_SIM_NCCL_INIT_TIMEOUT_MS, default 60000, is an error, not a hang);
     one rank needs no directory;
   - transport: point-to-point messages, one file per message, written under
     a temporary name and renamed into place; the receiver polls for
     (source, destination, sequence number), reads and deletes it. Sends up
     to TC_SIM_NCCL_EAGER_BYTES (default 4 MiB, NCCL's default buffer size)
     complete at once; a larger one completes only once its receiver took
     it (a group's receives run first, so a group never deadlocks on
     itself, but ungrouped sends and receives in opposite orders on two
     ranks hang as with NCCL). Receives wait (until the message comes or the comm is
     aborted; a dead peer process sets ncclRemoteError as the comm's
     asynchronous error and the receive keeps waiting for the abort, as a
     real kernel would). Messages to self stay in memory;
   - every collective is composed here of those messages plus a local
     reduction, with NCCL's documented semantics: in-place layouts, roots,
     counts per rank, SUM/PROD/MIN/MAX/AVG for every data type of the
     version, PreMulSum with a host or device scalar (each rank scales its
     own contribution with its own scalar; float AVG is a pre-multiplication
     by 1/nranks, integer AVG a sum then a division). Contributions are
     reduced in rank order, each step rounded to the data type (so results
     are the same bits on every rank; real NCCL's order depends on its
     algorithm). Every message carries the collective's signature (kind,
     data type, count, root, op): ranks calling different collectives at the
     same point is reported as a device fault instead of silently mixing;
   - work runs as a "kernel" on the caller's stream (recorded when the
     stream captures a graph, run at every replay). The kernels of one comm
     run one at a time, in the order they were issued (as NCCL serializes a
     comm's operations), and a device runs TC_SIM_NCCL_MAX_KERNELS NCCL
     kernels at once (default 1: NCCL gives no guarantee that kernels of two
     comms are resident together, so two comms used in different orders
     on two ranks deadlock as on hardware); message sequence numbers are taken when a kernel
     runs, so replays match across ranks when every rank replays alike;
   - connections: a pair of ranks is connected lazily, by the first
     operation that exchanges data between them over a channel not yet
     connected, on the calling thread (before its kernel is launched, also
     when the stream captures); a larger transfer is spread over more
     channels (one per CONN_CHANNEL_BYTES, a power of two, at most
     CONN_MAX_CHANNELS), so the first exchange of a larger size connects
     more of them. Connecting allocates the channel's buffers on the comm's
     device through the driver on the calling thread, subject to its capture
     interaction mode (simcu_conn_alloc, checked as cuMemAlloc): while
     another thread has a global-mode capture running, a thread in the
     default (global) mode is refused, that capture is invalidated and the
     call fails (ncclUnhandledCudaError; the pair stays unconnected). Only
     the point-to-point kinds connect (send/recv, all-to-all, gather,
     scatter: NCCL runs them over its p2p connections); the ring and tree
     connections of the other collectives are not modelled;
   - groups: calls between ncclGroupStart and ncclGroupEnd become one kernel
     per comm at the end, which first sends everything and then receives (so
     any order of sends and receives inside a group completes); send/recv to
     self must be inside a group and match in size; a failed call inside a
     group fails the group and launches nothing;
   - ncclCommShrink (2.27+): collective over the ranks not excluded, which
     compare their lists (a difference is ncclInvalidUsage) and form a comm
     in parent order; a job of the parent like ncclCommSplit;
   - ncclCommRevoke (2.28+): ends a comm's operations (kernels waiting for
     data stop) and keeps it for ncclCommShrink/Split/Destroy/Abort only;
   - ncclCommSplit: collective over the parent (colors and keys are
     exchanged between all ranks); NCCL_SPLIT_NOCOLOR gives NULL; ranks of
     one color form a comm ordered by key, then parent rank. As in NCCL's
     init.cc, it is a job of the PARENT: it blocks when the parent is
     blocking; with a non-blocking parent it answers ncclSuccess (as NCCL
     2.28 and 2.29 do: their ncclGroupEnd's ncclInProgress is not passed
     on) with *newcomm still NULL, runs on a thread of its own, writes
     *newcomm when it ends (TC_SIM_SPLIT_DELAY_US later, default 2000), and the parent's
     ncclCommGetAsyncError says ncclInProgress until then. A NULL config
     gives the child the parent's mode; a config's undefined blocking field
     means blocking, as in NCCL;
   - argument checks NCCL makes or that a real GPU would turn into a fault:
     comm handles (destroyed or aborted comms are kept, and any later use
     of one ends the process with a message: NCCL freed it), data
     types of this version, reduction ops (user ops belong to their comm and
     datatype), root and peer ranks, buffers (simulated device memory or
     pinned/registered host memory; plain host memory is refused; buffers a
     rank does not use, such as a non-root's receive buffer of ncclReduce,
     are not looked at), overlapping buffers outside NCCL's in-place layouts
     (undefined results with real NCCL), streams;
   - non-blocking comms (config blocking = 0): init (its rendezvous then
     runs on a thread of its own), collectives and group ends answer
     ncclInProgress, and ncclCommGetAsyncError reports
     ncclInProgress for a few polls; any call on the comm before it reported
     ncclSuccess is flagged and refused (ncclInvalidArgument, as NCCL's
     ncclCommEnsureReady does), so is any use of its call's stream (the
     simulated driver answers CUDA_ERROR_ILLEGAL_STATE: NCCL may not have
     enqueued the work yet), and two threads inside
     ncclCommGetAsyncError of one non-blocking comm at once are flagged
     (ncclInvalidUsage: NCCL completes and clears the group job there
     without a lock);
   - registration reference-counted by range as in NCCL's register.cc: the
     same buffer, or a range inside a live registration, gives the same
     handle; each ncclCommDeregister drops one reference; host memory is
     accepted and left unregistered (NULL handle); references left at
     ncclCommDestroy are reported (and released with the comm);
   - comms are not thread-safe: two threads inside calls on one comm at once
     is reported as ncclInvalidUsage (ncclCommGetAsyncError and
     ncclCommAbort may come from any thread, as NCCL allows); ncclCommAbort
     also ends a receive waiting for a peer;
   - a peer that never arrives at one rank: with TC_SIM_NCCL_HANG_CALL=N (or
     a list N,M,...) the N-th kernel launched in the process keeps running
     until its comm is aborted (or TC_SIM_NCCL_HANG_MS, default 60000,
     passed). With several ranks a peer that does not call simply leaves the
     receiver waiting.
   Job files are removed when the comm is destroyed or aborted and at exit;
   ids are random, so a stale directory of a crashed run is never reused.
   - windows and one-sided puts and signals (2.27 / 2.29+): see
     fake_nccl_rma.c, included at the end.
   Compile with -DSIM_NCCL_VERSION=21805 (say) to get an older library:
   symbols newer than that version are not exported at all, like the real
   older library (ncclCommRegister/ncclMemAlloc 2.19, fp8 2.24, ncclAlltoAll,
   ncclGather and ncclScatter 2.28, ncclCommWindowRegister 2.27,
   ncclPutSignal / ncclSignal / ncclWaitSignal 2.29). The default is
   2.29.7. */
#define _GNU_SOURCE
#include "sim_gpu.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef SIM_NCCL_VERSION
#define SIM_NCCL_VERSION 22907
#endif
#define HAS(v) (SIM_NCCL_VERSION >= (v))
#define EXPORT __attribute__((visibility("default")))
/* Connections (see connect_peers): bytes a channel carries of one transfer,
   channels per peer, and the buffers allocated for each channel. */
#define CONN_CHANNEL_BYTES ((size_t)64 << 10)
#define CONN_MAX_CHANNELS 8
#define CONN_BUFFER_BYTES ((size_t)4096)

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
#define ID_TAG "SIMNCCL"
#define ID_RANDOM 16 /* random bytes after the tag: the job's name */

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

/* A message to self (kept in memory). */
struct selfmsg {
    size_t bytes;
    struct selfmsg *next;
    char data[];
};

enum { LIVE, FINALIZED, DESTROYED, ABORTED };
struct reg;
typedef struct ncclComm {
    unsigned magic;
    int state, blocking, device, pending_polls, inflight, busy;
    int job_running; /* a non-blocking split's job is still running */
    int init_pending; /* created inside a group: joins its job at ncclGroupEnd */
    int polling;     /* a thread is inside ncclCommGetAsyncError */
    int holding;     /* its last non-blocking call holds `held` until it reports success */
    CUstream held;
    int rank, nranks;
    ncclResult_t async_error; /* ncclRemoteError once a peer process died */
    int revoked; /* ncclCommRevoke (2.28+): data transfers end, management calls only */
    struct user_op ops[MAX_USER_OPS];
    struct reg *regs; /* live registrations, released with the comm */
    /* several ranks: the job directory, the peers' processes and the next
       sequence number per peer of data messages (taken by kernels) and of
       control messages (split, taken by the calling thread) */
    char dir[PATH_MAX];
    pid_t *pids;
    unsigned long *send_seq, *recv_seq, *csend_seq, *crecv_seq;
    unsigned long splits, shrinks;
    /* kernels run one at a time, in issue order */
    unsigned long issued, next_run;
    int running, dir_users; /* dir_users: kernels and splits using the directory */
    struct selfmsg *self_head, *self_tail;
    /* connections (see connect_peers): per peer, the channels connected (a
       bit each), and their buffers (nranks x CONN_MAX_CHANNELS) */
    unsigned char *conn;
    void **conn_buf;
    struct rma *rma; /* windows and one-sided traffic (fake_nccl_rma.c) */
    struct ncclComm *next;
} *ncclComm_t;
static void release_registrations(ncclComm_t c);
#define COMM_MAGIC 0x4e43434cu

static pthread_mutex_t M = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t MC = PTHREAD_COND_INITIALIZER;
static struct ncclComm *comms;
#define MAX_SIM_DEVICES 8
static int device_kernels[MAX_SIM_DEVICES]; /* NCCL kernels running per device, under M */
static unsigned long device_launches[MAX_SIM_DEVICES];
struct kernel;
static struct kernel *device_waiting[MAX_SIM_DEVICES]; /* launched, not started: in launch order */
EXPORT ncclResult_t ncclGroupStart(void);
EXPORT ncclResult_t ncclGroupEnd(void);
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

static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? atol(v) : dflt;
}

static void sleep_us(long us) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&t, NULL);
}
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
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
    memcpy(id->internal, ID_TAG, sizeof ID_TAG);
    unsigned char rnd[ID_RANDOM];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, rnd, sizeof rnd) : -1;
    if (fd >= 0) close(fd);
    if (got != (ssize_t)sizeof rnd) { /* no urandom: time and pid */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        long v[2] = {(long)getpid() ^ t.tv_sec, t.tv_nsec};
        memcpy(rnd, v, sizeof rnd);
    }
    memcpy(id->internal + 8, rnd, sizeof rnd);
    return ncclSuccess;
}

/* Under M: a usable comm, or an error naming what is wrong with it. */
static ncclResult_t check_comm(ncclComm_t c, const char *fn, int allow_finalized) {
    if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    struct ncclComm *k = comms;
    while (k && k != c) k = k->next;
    if (!k || c->magic != COMM_MAGIC) return fail(ncclInvalidArgument, "%s: %p is not a comm of this library", fn, (void *)c);
    if (c->state == DESTROYED || c->state == ABORTED) {
        /* NCCL frees the comm in ncclCommAbort/ncclCommDestroy: a later use
           reads freed memory. A fault here, not an error code a caller
           could get away with. */
        fprintf(stderr, "[sim-nccl] %s: use of comm %p after ncclComm%s: a use-after-free with real NCCL; aborting the process\n",
                fn, (void *)c, c->state == ABORTED ? "Abort" : "Destroy");
        abort();
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
    if (r == ncclSuccess && c->init_pending) {
        fprintf(stderr, "[sim-nccl] %s: comm %p used before the group that creates it ended\n", fn, (void *)c);
        r = fail(ncclInvalidUsage, "%s: comm %p is created by a group that has not ended", fn, (void *)c);
    }
    /* a revoked comm takes management calls only (NCCL: new operations are
       ncclInvalidUsage, ncclCommFinalize is not supported, nor a second revoke) */
    if (r == ncclSuccess && c->revoked && strcmp(fn, "ncclCommShrink") != 0 && strcmp(fn, "ncclCommSplit") != 0 &&
        strcmp(fn, "ncclCommDestroy") != 0)
        r = fail(ncclInvalidUsage, "%s: comm %p was revoked (ncclCommRevoke): only destroy, split and shrink remain", fn,
                 (void *)c);
    /* NCCL's ncclCommEnsureReady: a non-blocking comm must have reported
       ncclSuccess (ncclCommGetAsyncError) for its previous call first */
    if (r == ncclSuccess && !allow_finalized && !c->blocking && (c->job_running || c->pending_polls > 0)) {
        fprintf(stderr, "[sim-nccl] %s: comm %p used before its previous non-blocking operation reported ncclSuccess\n", fn,
                (void *)c);
        r = fail(ncclInvalidArgument, "%s: attempt to use the communicator before the previous operation returned ncclSuccess", fn);
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
/* A non-blocking call's stream may not be used until the comm reported
   success (NCCL enqueues the work from its own thread): the simulated
   driver refuses any use of it meanwhile. Called without M. */
static void hold_stream(ncclComm_t c, CUstream s) {
    pthread_mutex_lock(&M);
    int hold = !c->blocking && !c->holding;
    if (hold) c->holding = 1, c->held = s;
    pthread_mutex_unlock(&M);
    if (hold) simcu_stream_hold(s, 1);
}
/* Under M: takes the comm's hold, to be released by release_hold without M. */
static int take_hold(ncclComm_t c, CUstream *s) {
    int h = c->holding;
    *s = c->held;
    c->holding = 0;
    return h;
}
static void release_hold(int h, CUstream s) {
    if (h) simcu_stream_hold(s, -1);
}
static void unbusy(ncclComm_t c) {
    pthread_mutex_lock(&M);
    c->busy = 0;
    pthread_mutex_unlock(&M);
}

/* ---- the job directory and messages ------------------------------------- */

/* Message files: "<dir>/<ch>.<src>.<dst>.<seq>" with ch 'd' (data, taken by
   kernels), 'c' (control, split) or 'a' (the acknowledgement of a data
   message beyond the eager threshold, from its receiver); written as "<dir>/t.<...>" first. */
struct msghdr {
    uint32_t magic;
    int32_t kind, dtype, op, root, pad;
    uint64_t count, bytes;
};
#define MSG_MAGIC 0x4d53474eu

static void job_dir(char *out, size_t n, const unsigned char *rnd, const char *suffix) {
    const char *base = getenv("TC_SIM_NCCL_DIR");
    if (!base || !*base) base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    int k = snprintf(out, n, "%s/tc-sim-nccl-", base);
    for (int i = 0; i < ID_RANDOM && k + 3 < (int)n; i++) k += snprintf(out + k, n - (size_t)k, "%02x", rnd[i]);
    if (suffix) snprintf(out + k, n - (size_t)k, "%s", suffix);
}

static int write_file(const char *dir, const char *tmpname, const char *name, const void *a, size_t an, const void *b, size_t bn,
                      int exclusive) {
    char tmp[PATH_MAX + 64], fin[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s/%s", dir, tmpname);
    snprintf(fin, sizeof fin, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int ok = 1;
    const char *parts[2] = {a, b};
    size_t lens[2] = {an, bn};
    for (int i = 0; i < 2 && ok; i++) {
        size_t off = 0;
        while (off < lens[i]) {
            ssize_t w = write(fd, parts[i] + off, lens[i] - off);
            if (w <= 0) { ok = 0; break; }
            off += (size_t)w;
        }
    }
    if (close(fd) != 0) ok = 0;
    if (ok) {
        if (exclusive) { /* link fails when the name exists */
            ok = link(tmp, fin) == 0;
            unlink(tmp);
        } else {
            ok = rename(tmp, fin) == 0;
        }
    } else {
        unlink(tmp);
    }
    return ok ? 0 : -1;
}

/* Sends one message (never blocks). `seq` must be taken by the caller. */
static int msg_put(ncclComm_t c, char ch, int dst, unsigned long seq, const struct msghdr *h, const void *data) {
    char name[96], tmp[96];
    snprintf(name, sizeof name, "%c.%d.%d.%lu", ch, c->rank, dst, seq);
    snprintf(tmp, sizeof tmp, "t.%c.%d.%d.%lu", ch, c->rank, dst, seq);
    return write_file(c->dir, tmp, name, h, sizeof *h, data, (size_t)h->bytes, 0);
}

static int peer_alive(ncclComm_t c, int q) {
    return !(c->pids && c->pids[q] > 0 && kill(c->pids[q], 0) != 0 && errno == ESRCH);
}

/* Sends beyond this many bytes complete only when the receiver took them. */
static size_t eager_bytes(void) { return (size_t)env_long("TC_SIM_NCCL_EAGER_BYTES", 4L << 20); }

/* Receives one message: 0 done, 1 the comm was aborted (or, with
   timeout_ms >= 0, the time passed: 2), -1 a malformed message. The header is
   returned in *h and the payload (h->bytes, at most `cap`) in `buf`. */
static int msg_get(ncclComm_t c, char ch, int src, unsigned long seq, struct msghdr *h, void *buf, size_t cap, long timeout_ms) {
    char path[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/%c.%d.%d.%lu", c->dir, ch, src, c->rank, seq);
    long pause = 10;
    double start = now_ms(), last_check = start;
    for (;;) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            int rc = 0;
            if (read(fd, h, sizeof *h) != (ssize_t)sizeof *h || h->magic != MSG_MAGIC || h->bytes > cap) rc = -1;
            size_t off = 0;
            while (rc == 0 && off < h->bytes) {
                ssize_t r = read(fd, (char *)buf + off, (size_t)h->bytes - off);
                if (r <= 0) rc = -1;
                else off += (size_t)r;
            }
            close(fd);
            unlink(path);
            if (rc == 0 && ch == 'd' && h->bytes > eager_bytes()) { /* the sender waits for this */
                char ack[96], tmp[96];
                snprintf(ack, sizeof ack, "a.%d.%d.%lu", c->rank, src, seq);
                snprintf(tmp, sizeof tmp, "t.a.%d.%d.%lu", c->rank, src, seq);
                write_file(c->dir, tmp, ack, "", 0, NULL, 0, 0);
            }
            return rc;
        }
        pthread_mutex_lock(&M);
        int state = c->state;
        pthread_mutex_unlock(&M);
        if (state == ABORTED || state == DESTROYED) return 1;
        double t = now_ms();
        pthread_mutex_lock(&M);
        int revoked = c->revoked && ch == 'd'; /* a shrink's control messages still flow */
        pthread_mutex_unlock(&M);
        if (revoked) return 1;
        if (timeout_ms >= 0 && t - start > (double)timeout_ms) return 2;
        if (t - last_check > 200) {
            last_check = t;
            if (!peer_alive(c, src)) {
                pthread_mutex_lock(&M);
                if (c->async_error == ncclSuccess) {
                    c->async_error = ncclRemoteError;
                    fprintf(stderr, "[sim-nccl] rank %d: peer rank %d (pid %d) exited while a receive waits for it\n", c->rank, src,
                            (int)c->pids[src]);
                }
                pthread_mutex_unlock(&M);
            }
        }
        sleep_us(pause);
        if (pause < 1000) pause *= 2;
    }
}

/* Removes this rank's traces from the job directory; the last rank out
   removes the directory. */
static int job_file_exists(const char *dir, const char *kind, int rank) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s.%d", dir, kind, rank);
    return access(path, F_OK) == 0;
}

static void touch_job_file(const char *dir, const char *kind, int rank) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s.%d", dir, kind, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
}

static void leave_job(ncclComm_t c) {
    if (!c->dir[0]) return;
    char suffix[32], path[PATH_MAX + 300];
    snprintf(suffix, sizeof suffix, ".%d.", c->rank);
    /* A peer still polling for the join files (its init slower than ours)
       must find ours after we left, as real NCCL's bootstrap completes on
       every rank: the join file goes only once every rank has seen all of
       them; until then a "left" marker says we are gone. */
    int all_seen = 1;
    for (int q = 0; q < c->nranks && all_seen; q++) all_seen = job_file_exists(c->dir, "seen", q);
    snprintf(path, sizeof path, "%s/join.%d", c->dir, c->rank);
    if (all_seen) unlink(path);
    else touch_job_file(c->dir, "left", c->rank);
    DIR *d = opendir(c->dir);
    int others = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            const char *n = e->d_name;
            /* a rank whose process is gone left its join file behind */
            if (strncmp(n, "join.", 5) == 0) {
                int q = atoi(n + 5);
                int gone = q == c->rank || job_file_exists(c->dir, "left", q);
                if (!gone && !(c->pids && q >= 0 && q < c->nranks && !peer_alive(c, q))) others++;
            }
            /* messages to me: "<ch>.<src>.<me>.<seq>" */
            if ((n[0] == 'd' || n[0] == 'c' || n[0] == 'a') && n[1] == '.') {
                const char *p = strchr(n + 2, '.');
                if (p && strncmp(p, suffix, strlen(suffix)) == 0) {
                    snprintf(path, sizeof path, "%s/%s", c->dir, n);
                    unlink(path);
                }
            }
        }
        closedir(d);
    }
    if (others == 0 && (d = opendir(c->dir))) { /* nobody left: remove what others left behind for me */
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
            snprintf(path, sizeof path, "%s/%s", c->dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(c->dir);
    c->dir[0] = 0;
}

/* At exit (or unload): the job files of comms never destroyed. A thread
   holding M at that moment means a kernel is running: then nothing is done. */
__attribute__((destructor)) static void at_exit_cleanup(void) {
    if (pthread_mutex_trylock(&M) != 0) return;
    for (struct ncclComm *c = comms; c; c = c->next) leave_job(c);
    pthread_mutex_unlock(&M);
}

/* Joins the job in `dir` as `rank` of `nranks` and waits for every rank. */
static ncclResult_t join_job(ncclComm_t c, const char *dir, const char *fn) {
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        c->dir[0] = 0;
        return fail(ncclSystemError, "%s: cannot make the job directory %s: %s", fn, dir, strerror(errno));
    }
    long info[2] = {(long)getpid(), c->nranks};
    char name[32], tmp[48];
    snprintf(name, sizeof name, "join.%d", c->rank);
    snprintf(tmp, sizeof tmp, "t.join.%d.%d", c->rank, (int)getpid());
    if (write_file(dir, tmp, name, info, sizeof info, NULL, 0, 1) != 0) {
        ncclResult_t r = errno == EEXIST ? fail(ncclInvalidUsage, "%s: rank %d joined the job of this unique id twice", fn, c->rank)
                                         : fail(ncclSystemError, "%s: cannot write %s/%s: %s", fn, dir, name, strerror(errno));
        c->dir[0] = 0;
        return r;
    }
    c->pids = calloc((size_t)c->nranks, sizeof *c->pids);
    long timeout = env_long("TC_SIM_NCCL_INIT_TIMEOUT_MS", 60000);
    double start = now_ms();
    for (int q = 0; q < c->nranks; q++) {
        char path[PATH_MAX + 48];
        snprintf(path, sizeof path, "%s/join.%d", dir, q);
        for (long pause = 100;; pause = pause < 5000 ? pause * 2 : pause) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            long peer[2];
            if (fd >= 0) {
                ssize_t n = read(fd, peer, sizeof peer);
                close(fd);
                if (n == (ssize_t)sizeof peer) {
                    if (peer[1] != c->nranks) {
                        leave_job(c);
                        return fail(ncclInvalidUsage, "%s: rank %d was initialized with nranks %ld, this rank with %d", fn, q, peer[1],
                                    c->nranks);
                    }
                    c->pids[q] = (pid_t)peer[0];
                    break;
                }
            }
            pthread_mutex_lock(&M);
            int gone = c->state == ABORTED || c->state == DESTROYED;
            pthread_mutex_unlock(&M);
            if (gone) {
                leave_job(c);
                return fail(ncclInvalidUsage, "%s: the comm was aborted while rank %d had not joined", fn, q);
            }
            if (now_ms() - start > (double)timeout) {
                leave_job(c);
                return fail(ncclSystemError, "%s: rank %d of %d did not join within %ld ms (TC_SIM_NCCL_INIT_TIMEOUT_MS)", fn, q,
                            c->nranks, timeout);
            }
            sleep_us(pause);
        }
    }
    touch_job_file(dir, "seen", c->rank);
    return ncclSuccess;
}

/* ---- comms --------------------------------------------------------------- */

static ncclResult_t check_config(const config_head *cfg, int *blocking, const char *fn) {
    *blocking = 1;
    if (!cfg) return ncclSuccess;
    if (cfg->magic != CONFIG_MAGIC || cfg->size < sizeof *cfg)
        return fail(ncclInvalidArgument, "%s: config was not initialized with NCCL_CONFIG_INITIALIZER (magic %#x, size %zu)", fn,
                    cfg->magic, cfg->size);
    if (cfg->blocking != UNDEF_INT && cfg->blocking != 0 && cfg->blocking != 1)
        return fail(ncclInvalidArgument, "%s: config.blocking is %d (0 or 1)", fn, cfg->blocking);
    if (cfg->blocking == 0) *blocking = 0;
    return ncclSuccess;
}

/* A comm's connection buffers, taken from it under M and freed without M
   (the driver's lock is taken before M where the driver releases kernels). */
static void **take_connections(ncclComm_t c) {
    void **bufs = c->conn_buf;
    c->conn_buf = NULL;
    free(c->conn);
    c->conn = NULL;
    return bufs;
}
static void free_connections(void **bufs, int nranks) {
    if (!bufs) return;
    for (size_t i = 0; i < (size_t)nranks * CONN_MAX_CHANNELS; i++)
        if (bufs[i]) simcu_conn_free(bufs[i]);
    free(bufs);
}

static void free_comm_parts(ncclComm_t c) {
    free(c->pids), free(c->send_seq), free(c->recv_seq), free(c->csend_seq), free(c->crecv_seq);
    c->pids = NULL, c->send_seq = c->recv_seq = c->csend_seq = c->crecv_seq = NULL;
    while (c->self_head) {
        struct selfmsg *m = c->self_head;
        c->self_head = m->next;
        free(m);
    }
    c->self_tail = NULL;
}

/* Inits called between ncclGroupStart and ncclGroupEnd: the comm exists at
   once (its handle is returned), and joins its job at the group's end, all
   of the group's inits at the same time, each on a thread of its own (so
   that the ranks of one process, e.g. one per device, meet each other). */
struct pending_init {
    ncclComm_t comm;
    char dir[PATH_MAX];
    ncclResult_t result;
    pthread_t thread;
    int threaded;
    struct pending_init *next;
};
static __thread struct pending_init *g_inits;
static int in_group(void);
static void *nonblocking_init_thread(void *arg);

/* Makes a comm as `rank` of `nranks` on `device`, joining the job in `dir`
   (NULL for one rank); inside a group the joining waits for ncclGroupEnd. */
static ncclResult_t new_comm(ncclComm_t *out, int nranks, int rank, const char *dir, int blocking, int device, const char *fn) {
    struct ncclComm *c = calloc(1, sizeof *c);
    c->magic = COMM_MAGIC;
    c->blocking = blocking;
    c->rank = rank, c->nranks = nranks;
    c->next_run = 1;
    size_t n = (size_t)nranks;
    c->send_seq = calloc(n, sizeof(unsigned long)), c->recv_seq = calloc(n, sizeof(unsigned long));
    c->csend_seq = calloc(n, sizeof(unsigned long)), c->crecv_seq = calloc(n, sizeof(unsigned long));
    c->conn = calloc(n, 1), c->conn_buf = calloc(n * CONN_MAX_CHANNELS, sizeof(void *));
    c->device = device;
    if (dir && !blocking && !in_group()) { /* NCCL's init job runs on a thread of its own */
        struct pending_init *p = calloc(1, sizeof *p);
        p->comm = c;
        snprintf(p->dir, sizeof p->dir, "%s", dir);
        c->job_running = 1;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        int started = pthread_create(&p->thread, &a, nonblocking_init_thread, p) == 0;
        pthread_attr_destroy(&a);
        if (!started) {
            free(p);
            free_comm_parts(c);
            free_connections(take_connections(c), nranks);
            free(c);
            return fail(ncclSystemError, "%s: cannot start the init's thread", fn);
        }
    } else if (dir && in_group()) {
        struct pending_init *p = calloc(1, sizeof *p);
        p->comm = c;
        snprintf(p->dir, sizeof p->dir, "%s", dir);
        p->next = g_inits;
        g_inits = p;
        c->init_pending = 1;
    } else if (dir) {
        ncclResult_t r = join_job(c, dir, fn);
        if (r != ncclSuccess) {
            free_comm_parts(c);
            free_connections(take_connections(c), nranks);
            free(c);
            return r;
        }
    }
    pthread_mutex_lock(&M);
    c->next = comms;
    comms = c;
    if (!blocking) c->pending_polls = 2;
    pthread_mutex_unlock(&M);
    *out = c;
    return blocking || c->init_pending ? ncclSuccess : ncclInProgress;
}

/* A non-blocking comm's init: joins its job, then the comm reports the
   result through ncclCommGetAsyncError (ncclInProgress until then). */
static void *nonblocking_init_thread(void *arg) {
    struct pending_init *p = arg;
    ncclResult_t r = join_job(p->comm, p->dir, "ncclCommInitRankConfig (non-blocking)");
    pthread_mutex_lock(&M);
    p->comm->job_running = 0;
    if (r != ncclSuccess) p->comm->async_error = r;
    pthread_cond_broadcast(&MC);
    pthread_mutex_unlock(&M);
    free(p);
    return NULL;
}

static void *init_thread(void *arg) {
    struct pending_init *p = arg;
    p->result = join_job(p->comm, p->dir, "ncclGroupEnd (a grouped ncclCommInitRank)");
    return NULL;
}

/* At the end of the outermost group: the group's inits join their jobs
   together. The first failure is the group's result. */
static ncclResult_t run_pending_inits(ncclComm_t *first) {
    ncclResult_t r = ncclSuccess;
    for (struct pending_init *p = g_inits; p; p = p->next)
        p->threaded = pthread_create(&p->thread, NULL, init_thread, p) == 0;
    for (struct pending_init *p = g_inits; p; p = p->next) {
        if (p->threaded) pthread_join(p->thread, NULL);
        else p->result = fail(ncclSystemError, "ncclGroupEnd: cannot start a thread for a grouped init");
    }
    while (g_inits) {
        struct pending_init *p = g_inits;
        g_inits = p->next;
        pthread_mutex_lock(&M);
        p->comm->init_pending = 0;
        if (p->result != ncclSuccess) p->comm->async_error = p->result;
        pthread_mutex_unlock(&M);
        if (r == ncclSuccess) r = p->result;
        *first = p->comm;
        free(p);
    }
    return r;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config, int device) {
    const char *fn = "ncclCommInitRankConfig";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (nranks < 1) return fail(ncclInvalidArgument, "%s: nranks %d is not positive", fn, nranks);
    if (rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "%s: rank %d is outside [0, %d)", fn, rank, nranks);
    if (memcmp(id.internal, ID_TAG, sizeof ID_TAG) != 0)
        return fail(ncclInvalidArgument, "%s: the unique id was not made by ncclGetUniqueId", fn);
    int blocking;
    ncclResult_t r = check_config(config, &blocking, fn);
    if (r != ncclSuccess) return r;
    char dir[PATH_MAX];
    if (nranks > 1) job_dir(dir, sizeof dir, (const unsigned char *)id.internal + 8, NULL);
    return new_comm(comm, nranks, rank, nranks > 1 ? dir : NULL, blocking, device, fn);
}
EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config) {
    /* the device current at init, as NCCL takes it from the runtime (device
       0 when no context is current) */
    int d = simcu_current_device();
    return init_rank(comm, nranks, id, rank, config, d < 0 ? 0 : d);
}

/* One process, one rank per device (devlist NULL: devices 0..ndev-1), as
   NCCL does it: a unique id, then the ranks' inits in one group. Two ranks
   on one device is NCCL's "Duplicate GPU detected" (ncclInvalidUsage). */
EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms_out, int ndev, const int *devlist) {
    const char *fn = "ncclCommInitAll";
    if (!comms_out) return fail(ncclInvalidArgument, "%s: comms is NULL", fn);
    if (ndev < 1) return fail(ncclInvalidArgument, "%s: ndev %d is not positive", fn, ndev);
    int count = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS)
        return fail(ncclUnhandledCudaError, "%s: the CUDA driver gave no device count", fn);
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= count) return fail(ncclInvalidArgument, "%s: devlist[%d] = %d is not a device (%d visible)", fn, i, d, count);
        for (int j = 0; j < i; j++)
            if ((devlist ? devlist[j] : j) == d) return fail(ncclInvalidUsage, "%s: Duplicate GPU detected: device %d twice", fn, d);
    }
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return r;
    ncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; i++) r = init_rank(&comms_out[i], ndev, id, i, NULL, devlist ? devlist[i] : i);
    ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
}
EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

#if HAS(21800)
/* One split as NCCL runs it: a job over the parent (run by the calling
   thread when the parent is blocking, by a thread of its own otherwise). */
struct split_job {
    ncclComm_t parent;
    int color, key, blocking;
    ncclComm_t *newcomm;
    unsigned long split_no;
    /* ncclCommShrink: the sorted excluded ranks (owned by the job) */
    int shrink, nexclude, *exclude;
};

static ncclResult_t shrink_work(struct split_job *j);
static ncclResult_t run_job(ncclComm_t comm, struct split_job *j, const char *fn);

/* Every rank tells every other its color and key (control messages), then
   the ranks of each color form a comm ordered by key, then parent rank, in
   a job directory named after the parent's. The child handle is written to
   *newcomm only now, at the end, as NCCL does. */
static ncclResult_t split_work(struct split_job *j) {
    if (j->shrink) return shrink_work(j);
    const char *fn = "ncclCommSplit";
    ncclComm_t comm = j->parent;
    int n = comm->nranks, me = comm->rank, color = j->color, key = j->key;
    int *colors = calloc((size_t)n, sizeof(int)), *keys = calloc((size_t)n, sizeof(int));
    ncclResult_t r = ncclSuccess;
    colors[me] = color, keys[me] = key;
    long timeout = env_long("TC_SIM_NCCL_INIT_TIMEOUT_MS", 60000);
    for (int q = 0; q < n && r == ncclSuccess; q++) {
        if (q == me) continue;
        struct msghdr h = {MSG_MAGIC, -2, 0, 0, 0, 0, 0, sizeof(int) * 2};
        int v[2] = {color, key};
        if (msg_put(comm, 'c', q, comm->csend_seq[q]++, &h, v) != 0)
            r = fail(ncclSystemError, "%s: cannot write a message in %s: %s", fn, comm->dir, strerror(errno));
    }
    for (int q = 0; q < n && r == ncclSuccess; q++) {
        if (q == me) continue;
        struct msghdr h;
        int v[2];
        int g = msg_get(comm, 'c', q, comm->crecv_seq[q]++, &h, v, sizeof v, timeout);
        if (g == 2) r = fail(ncclSystemError, "%s: rank %d did not take part within %ld ms", fn, q, timeout);
        else if (g == 1) r = fail(ncclInvalidUsage, "%s: the comm was aborted", fn);
        else if (g != 0 || h.kind != -2) r = fail(ncclInternalError, "%s: rank %d sent something else than its split color (a different call?)", fn, q);
        else colors[q] = v[0], keys[q] = v[1];
    }
    ncclComm_t child = NULL;
    if (r == ncclSuccess && color != NCCL_SPLIT_NOCOLOR) {
        int size = 0, newrank = 0;
        for (int q = 0; q < n; q++) {
            if (colors[q] != color) continue;
            size++;
            if (keys[q] < key || (keys[q] == key && q < me)) newrank++;
        }
        char dir[PATH_MAX + 64];
        if (size > 1) snprintf(dir, sizeof dir, "%s.s%lu.c%d", comm->dir, j->split_no, color);
        r = new_comm(&child, size, newrank, size > 1 ? dir : NULL, j->blocking, comm->device, fn);
        if (r == ncclInProgress) r = ncclSuccess;
    }
    free(colors);
    free(keys);
    if (r == ncclSuccess) __atomic_store_n(j->newcomm, child, __ATOMIC_RELEASE);
    return r;
}

/* The thread of a non-blocking parent's split: the parent reports
   ncclInProgress until it ends, then its result (an error stays). */
static void *split_thread(void *p) {
    struct split_job *j = p;
    sleep_us(env_long("TC_SIM_SPLIT_DELAY_US", 2000)); /* NCCL's job thread starts later than the call returns */
    ncclResult_t r = split_work(j);
    ncclComm_t comm = j->parent;
    pthread_mutex_lock(&M);
    comm->job_running = 0;
    if (r != ncclSuccess && comm->async_error == ncclSuccess) comm->async_error = r;
    if (--comm->dir_users == 0 && comm->state == ABORTED) leave_job(comm);
    pthread_cond_broadcast(&MC);
    pthread_mutex_unlock(&M);
    free(j->exclude);
    free(j);
    return NULL;
}

/* Collective over the parent. As in NCCL: *newcomm is NULL on return and
   written when the split completed; whether the call blocks is the
   PARENT's mode (its group job), and a NULL config gives the child the
   parent's config (so its mode too). A non-blocking parent answers
   ncclSuccess at once (as NCCL 2.28 and 2.29 do), and the caller polls
   ncclCommGetAsyncError(parent) until the job ended; *newcomm is written
   by the job's thread before that. */
EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *config) {
    const char *fn = "ncclCommSplit";
    if (!newcomm) return fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) return r;
    *newcomm = NULL;
    int blocking = comm->blocking;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) r = fail(ncclInvalidArgument, "%s: color %d is negative", fn, color);
    else if (config) r = check_config(config, &blocking, fn);
    /* NCCL would still need every rank to take part: an argument error on
       one rank leaves the others waiting, as with real NCCL */
    if (r != ncclSuccess) {
        unbusy(comm);
        return r;
    }
    struct split_job *j = calloc(1, sizeof *j);
    j->parent = comm, j->color = color, j->key = key, j->blocking = blocking, j->newcomm = newcomm;
    return run_job(comm, j, fn);
}

/* Runs a split or shrink job over `comm` (entered by the caller): on the
   calling thread for a blocking parent, else on a thread of its own. */
static ncclResult_t run_job(ncclComm_t comm, struct split_job *j, const char *fn) {
    ncclResult_t r;
    pthread_mutex_lock(&M);
    j->split_no = j->shrink ? ++comm->shrinks : ++comm->splits;
    comm->dir_users++; /* an abort from another thread keeps the directory until the job is done */
    int parent_blocking = comm->blocking;
    if (!parent_blocking) comm->job_running = 1;
    pthread_mutex_unlock(&M);
    if (!parent_blocking) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, split_thread, j) != 0) {
            pthread_attr_destroy(&a);
            free(j->exclude);
            free(j);
            pthread_mutex_lock(&M);
            comm->job_running = 0, comm->dir_users--, comm->busy = 0;
            pthread_mutex_unlock(&M);
            return fail(ncclSystemError, "%s: cannot start the job's thread", fn);
        }
        pthread_attr_destroy(&a);
        unbusy(comm);
        /* NCCL's ncclCommSplit and ncclCommShrink return ncclSuccess here,
           not the in-progress of their group: the parent's state tells */
        return ncclSuccess;
    }
    r = split_work(j);
    free(j->exclude);
    free(j);
    pthread_mutex_lock(&M);
    if (--comm->dir_users == 0 && comm->state == ABORTED) leave_job(comm);
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}
#endif

#if HAS(22700)
static int excluded(const struct split_job *j, int q) {
    for (int i = 0; i < j->nexclude; i++)
        if (j->exclude[i] == q) return 1;
    return 0;
}

/* The remaining ranks (only they) exchange their exclusion lists (control
   messages), fail with ncclInvalidUsage on a difference, then form a comm
   in parent order, in a job directory named after the parent's and the
   list. */
static ncclResult_t shrink_work(struct split_job *j) {
    const char *fn = "ncclCommShrink";
    ncclComm_t comm = j->parent;
    int n = comm->nranks, me = comm->rank, k = j->nexclude;
    size_t bytes = sizeof(int) * (size_t)(k + 1);
    int *mine = calloc((size_t)k + 1, sizeof(int)), *theirs = calloc((size_t)n + 1, sizeof(int));
    mine[0] = k;
    memcpy(mine + 1, j->exclude, sizeof(int) * (size_t)k);
    ncclResult_t r = ncclSuccess;
    long timeout = env_long("TC_SIM_NCCL_INIT_TIMEOUT_MS", 60000);
    for (int q = 0; q < n && r == ncclSuccess; q++) {
        if (q == me || excluded(j, q)) continue;
        struct msghdr h = {MSG_MAGIC, -3, 0, 0, 0, 0, 0, bytes};
        if (msg_put(comm, 'c', q, comm->csend_seq[q]++, &h, mine) != 0)
            r = fail(ncclSystemError, "%s: cannot write a message in %s: %s", fn, comm->dir, strerror(errno));
    }
    for (int q = 0; q < n && r == ncclSuccess; q++) {
        if (q == me || excluded(j, q)) continue;
        struct msghdr h;
        int g = msg_get(comm, 'c', q, comm->crecv_seq[q]++, &h, theirs, sizeof(int) * ((size_t)n + 1), timeout);
        if (g == 2) r = fail(ncclSystemError, "%s: rank %d did not take part within %ld ms", fn, q, timeout);
        else if (g == 1) r = fail(ncclInvalidUsage, "%s: the comm was aborted", fn);
        else if (g != 0 || h.kind != -3) r = fail(ncclInternalError, "%s: rank %d sent something else than its exclusion list (a different call?)", fn, q);
        else if (h.bytes != bytes || memcmp(mine, theirs, bytes) != 0) r = fail(ncclInvalidUsage, "%s: rank %d excludes other ranks than this one", fn, q);
    }
    ncclComm_t child = NULL;
    if (r == ncclSuccess) {
        int newrank = 0;
        for (int q = 0; q < me; q++) newrank += !excluded(j, q);
        char dir[PATH_MAX + 64];
        int at = snprintf(dir, sizeof dir, "%s.x%lu", comm->dir, j->split_no);
        for (int i = 0; i < k && at > 0 && (size_t)at < sizeof dir - 16; i++) at += snprintf(dir + at, sizeof dir - (size_t)at, "-%d", j->exclude[i]);
        r = new_comm(&child, n - k, newrank, n - k > 1 ? dir : NULL, j->blocking, comm->device, fn);
        if (r == ncclInProgress) r = ncclSuccess;
    }
    free(mine);
    free(theirs);
    if (r == ncclSuccess) __atomic_store_n(j->newcomm, child, __ATOMIC_RELEASE);
    return r;
}

static int int_less(const void *a, const void *b) {
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* Collective over the ranks not excluded (the excluded ones take no part).
   A job of the parent as ncclCommSplit is; shrinkFlags NCCL_SHRINK_ABORT
   first ends the parent's operations (here: nothing is left running once
   the call is entered). */
EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
                                   void *config, int shrinkFlags) {
    const char *fn = "ncclCommShrink";
    if (!newcomm) return fail(ncclInvalidArgument, "%s: newcomm is NULL", fn);
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) return r;
    *newcomm = NULL;
    int blocking = comm->blocking;
    int *list = calloc((size_t)(excludeRanksCount > 0 ? excludeRanksCount : 1), sizeof(int));
    if (shrinkFlags != 0 && shrinkFlags != 1) r = fail(ncclInvalidArgument, "%s: shrinkFlags %d is not NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT", fn, shrinkFlags);
    else if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList)) r = fail(ncclInvalidArgument, "%s: bad excludeRanksList/Count (%d)", fn, excludeRanksCount);
    for (int i = 0; r == ncclSuccess && i < excludeRanksCount; i++) {
        int q = excludeRanksList[i];
        if (q < 0 || q >= comm->nranks) r = fail(ncclInvalidArgument, "%s: excluded rank %d is outside [0, %d)", fn, q, comm->nranks);
        else if (q == comm->rank) r = fail(ncclInvalidArgument, "%s: this rank (%d) is in excludeRanksList", fn, q);
        for (int p = 0; r == ncclSuccess && p < i; p++)
            if (list[p] == q) r = fail(ncclInvalidArgument, "%s: rank %d is excluded twice", fn, q);
        list[i] = q;
    }
    if (r == ncclSuccess && config) r = check_config(config, &blocking, fn);
    if (r != ncclSuccess) {
        free(list);
        unbusy(comm);
        return r;
    }
    qsort(list, (size_t)excludeRanksCount, sizeof(int), int_less);
    struct split_job *j = calloc(1, sizeof *j);
    j->parent = comm, j->blocking = blocking, j->newcomm = newcomm;
    j->shrink = 1, j->nexclude = excludeRanksCount, j->exclude = list;
    return run_job(comm, j, fn);
}
#elif HAS(21800)
static ncclResult_t shrink_work(struct split_job *j) {
    (void)j;
    return ncclInternalError;
}
#endif

#if HAS(22800)
/* ncclCommRevoke (2.28+): ends the comm's operations without freeing it.
   Kernels waiting for data stop (as the abort ends them), the call returns
   once none is left in flight (quiesced, also for a non-blocking comm:
   NCCL may answer ncclInProgress, here it is done at once), and the comm
   then takes only ncclCommShrink, ncclCommSplit, ncclCommDestroy and
   ncclCommAbort (see enter). The failure it had stays its asynchronous
   error. revokeFlags must be NCCL_REVOKE_DEFAULT (0). */
static void drain(ncclComm_t c);
EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
    const char *fn = "ncclCommRevoke";
    if (revokeFlags != 0) return fail(ncclInvalidArgument, "%s: revokeFlags %d is not NCCL_REVOKE_DEFAULT (0)", fn, revokeFlags);
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&M);
    comm->revoked = 1;
    pthread_cond_broadcast(&MC);
    drain(comm);
    pthread_mutex_unlock(&M);
    unbusy(comm);
    return ncclSuccess;
}
#endif

static ncclResult_t comm_int(ncclComm_t comm, int *out, int which, const char *fn) {
    if (!out) return fail(ncclInvalidArgument, "%s: out-pointer is NULL", fn);
    pthread_mutex_lock(&M);
    ncclResult_t r = check_comm(comm, fn, 1);
    if (r == ncclSuccess) *out = which ? comm->rank : comm->nranks;
    pthread_mutex_unlock(&M);
    return r;
}
EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { return comm_int(comm, count, 0, "ncclCommCount"); }
EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { return comm_int(comm, rank, 1, "ncclCommUserRank"); }

/* Real NCCL completes and clears the comm's group job here without a lock:
   two threads polling one comm at once is a race there, reported here (a
   short pause inside the call makes an overlap visible). */
EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
    pthread_mutex_lock(&M);
    ncclResult_t r = check_comm(comm, "ncclCommGetAsyncError", 1);
    if (r == ncclSuccess && comm->polling && !comm->blocking) {
        fprintf(stderr, "[sim-nccl] ncclCommGetAsyncError: comm %p polled by two threads at once (NCCL clears its group job "
                        "without a lock)\n", (void *)comm);
        r = fail(ncclInvalidUsage, "ncclCommGetAsyncError: comm %p is being polled by another thread", (void *)comm);
    }
    if (r == ncclSuccess) {
        comm->polling = 1;
        pthread_mutex_unlock(&M);
        sleep_us(20);
        pthread_mutex_lock(&M);
        comm->polling = 0;
        if (comm->async_error != ncclSuccess) {
            *asyncError = comm->async_error;
            fail(comm->async_error, "a peer process of this comm exited, or its non-blocking split failed");
        } else if (comm->job_running) {
            *asyncError = ncclInProgress;
        } else if (comm->pending_polls > 0) {
            comm->pending_polls--;
            *asyncError = ncclInProgress;
        } else {
            *asyncError = ncclSuccess;
        }
    }
    CUstream hs = NULL;
    int h = r == ncclSuccess && *asyncError != ncclInProgress ? take_hold(comm, &hs) : 0;
    pthread_mutex_unlock(&M);
    release_hold(h, hs);
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
    while (comm->job_running) pthread_cond_wait(&MC, &M);
    CUstream hs = NULL;
    int h = take_hold(comm, &hs);
    comm->busy = 0;
    release_registrations(comm);
    leave_job(comm);
    free_comm_parts(comm);
    void **conns = take_connections(comm);
    pthread_cond_broadcast(&MC);
    pthread_mutex_unlock(&M);
    free_connections(conns, comm->nranks);
    release_hold(h, hs);
    return ncclSuccess;
}
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    pthread_mutex_lock(&M);
    /* any thread may abort, also while another is inside a call */
    ncclResult_t r = check_comm(comm, "ncclCommAbort", 1);
    void **conns = NULL;
    CUstream hs = NULL;
    int h = 0;
    if (r == ncclSuccess) {
        comm->state = ABORTED;
        /* NCCL joins the comm's job thread (a non-blocking init or split):
           it sees ABORTED and ends */
        pthread_cond_broadcast(&MC);
        while (comm->job_running) pthread_cond_wait(&MC, &M);
        h = take_hold(comm, &hs);
        release_registrations(comm);
        /* a kernel waiting for a message sees ABORTED and stops; the
           directory goes now, or when the last kernel or split using it
           ends */
        if (comm->dir_users == 0) leave_job(comm);
        /* a thread still inside a call may be connecting: its buffers stay */
        if (!comm->busy) conns = take_connections(comm);
        pthread_cond_broadcast(&MC);
    }
    pthread_mutex_unlock(&M);
    free_connections(conns, comm->nranks);
    release_hold(h, hs);
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


/* fp8 (e4m3: bias 7, no infinities, 448 the largest finite; e5m2: bias
   15, IEEE-like), converted through float with round-to-nearest-even;
   out-of-range values saturate to the largest finite value. */
static float fp8_to_float(uint8_t v, int e4m3) {
    int mb = e4m3 ? 3 : 2, eb = e4m3 ? 4 : 5, bias = e4m3 ? 7 : 15;
    int e = (v >> mb) & ((1 << eb) - 1), m = v & ((1 << mb) - 1);
    float f;
    if (e4m3 && e == 15 && m == 7) f = NAN;
    else if (!e4m3 && e == 31) f = m ? NAN : INFINITY;
    else if (e == 0) f = ldexpf((float)m, 1 - bias - mb);
    else f = ldexpf((float)(m + (1 << mb)), e - bias - mb);
    return (v & 0x80) ? -f : f;
}
static uint8_t float_to_fp8(float f, int e4m3) {
    int mb = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    if (isnan(f)) return (uint8_t)(sign | 0x7f);
    float a = fabsf(f), maxf = e4m3 ? 448.0f : 57344.0f;
    if (a == 0) return sign;
    int e;
    frexpf(a, &e);
    int exp = e - 1 < 1 - bias ? 1 - bias : e - 1;
    float r = rintf(ldexpf(a, mb - exp)); /* significand at this exponent, nearest even */
    if (r >= (float)(2 << mb)) r /= 2, exp++;
    if (ldexpf(r, exp - mb) > maxf) return (uint8_t)(sign | (e4m3 ? 0x7e : 0x7b));
    int m = (int)r;
    if (m < (1 << mb)) return (uint8_t)(sign | m); /* subnormal */
    return (uint8_t)(sign | ((exp + bias) << mb) | (m - (1 << mb)));
}

/* A small float type (f16, bf16, fp8) as float, and back (rounded). */
static int small_float(ncclDataType_t t) {
    return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}
static float sf_get(ncclDataType_t t, const char *p) {
    uint16_t h;
    switch (t) {
    case ncclFloat16: memcpy(&h, p, 2); return half_to_float(h);
    case ncclBfloat16: memcpy(&h, p, 2); return bf16_to_float(h);
    case ncclFloat8e4m3: return fp8_to_float((uint8_t)*p, 1);
    default: return fp8_to_float((uint8_t)*p, 0);
    }
}
static void sf_put(ncclDataType_t t, char *p, float f) {
    uint16_t h;
    switch (t) {
    case ncclFloat16: h = float_to_half(f); memcpy(p, &h, 2); break;
    case ncclBfloat16: h = float_to_bf16(f); memcpy(p, &h, 2); break;
    case ncclFloat8e4m3: *p = (char)float_to_fp8(f, 1); break;
    default: *p = (char)float_to_fp8(f, 0); break;
    }
}

/* acc[i] = acc[i] (op) x[i] for n elements, in the data type's own
   arithmetic (integers wrap; small floats are rounded after each step). */
#define INT_COMBINE(T)                                                                                                         \
    for (size_t i = 0; i < n; i++) {                                                                                           \
        T a, b;                                                                                                                \
        memcpy(&a, acc + i * sizeof(T), sizeof(T));                                                                            \
        memcpy(&b, x + i * sizeof(T), sizeof(T));                                                                              \
        switch (op) {                                                                                                          \
        case ncclProd: a = (T)((uint64_t)a * (uint64_t)b); break;                                                              \
        case ncclMax: a = a > b ? a : b; break;                                                                                \
        case ncclMin: a = a < b ? a : b; break;                                                                                \
        default: a = (T)((uint64_t)a + (uint64_t)b); break;                                                                    \
        }                                                                                                                      \
        memcpy(acc + i * sizeof(T), &a, sizeof(T));                                                                            \
    }
#define FLOAT_COMBINE(T)                                                                                                       \
    for (size_t i = 0; i < n; i++) {                                                                                           \
        T a, b;                                                                                                                \
        memcpy(&a, acc + i * sizeof(T), sizeof(T));                                                                            \
        memcpy(&b, x + i * sizeof(T), sizeof(T));                                                                              \
        switch (op) {                                                                                                          \
        case ncclProd: a = a * b; break;                                                                                       \
        case ncclMax: a = fmax(a, b); break;                                                                                   \
        case ncclMin: a = fmin(a, b); break;                                                                                   \
        default: a = a + b; break;                                                                                             \
        }                                                                                                                      \
        memcpy(acc + i * sizeof(T), &a, sizeof(T));                                                                            \
    }
static void combine(ncclDataType_t t, int op, char *acc, const char *x, size_t n) {
    switch (t) {
    case ncclInt8: INT_COMBINE(int8_t) break;
    case ncclUint8: INT_COMBINE(uint8_t) break;
    case ncclInt32: INT_COMBINE(int32_t) break;
    case ncclUint32: INT_COMBINE(uint32_t) break;
    case ncclInt64: INT_COMBINE(int64_t) break;
    case ncclUint64: INT_COMBINE(uint64_t) break;
    case ncclFloat32: FLOAT_COMBINE(float) break;
    case ncclFloat64: FLOAT_COMBINE(double) break;
    default: {
        size_t es = type_size(t);
        for (size_t i = 0; i < n; i++) {
            float a = sf_get(t, acc + i * es), b = sf_get(t, x + i * es), r;
            switch (op) {
            case ncclProd: r = a * b; break;
            case ncclMax: r = fmaxf(a, b); break;
            case ncclMin: r = fminf(a, b); break;
            default: r = a + b; break;
            }
            sf_put(t, acc + i * es, r);
        }
    }
    }
}

/* Integer AVG: the sum divided by nranks (C division: toward zero). */
#define INT_DIV(T)                                                                                                             \
    for (size_t i = 0; i < n; i++) {                                                                                           \
        T a;                                                                                                                   \
        memcpy(&a, acc + i * sizeof(T), sizeof(T));                                                                            \
        a = (T)(a / (T)d);                                                                                                     \
        memcpy(acc + i * sizeof(T), &a, sizeof(T));                                                                            \
    }
static void int_divide(ncclDataType_t t, char *acc, size_t n, int d) {
    switch (t) {
    case ncclInt8: INT_DIV(int8_t) break;
    case ncclUint8: INT_DIV(uint8_t) break;
    case ncclInt32: INT_DIV(int32_t) break;
    case ncclUint32: INT_DIV(uint32_t) break;
    case ncclInt64: INT_DIV(int64_t) break;
    case ncclUint64: INT_DIV(uint64_t) break;
    default: break;
    }
}

/* dst[i] = src[i] * scalar (one element of the data type at s), in the data
   type's own arithmetic. */
static void premul(ncclDataType_t t, char *dst, const char *src, size_t n, const unsigned char *s) {
    size_t es = type_size(t);
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case ncclFloat32: { float a, b; memcpy(&a, src + 4 * i, 4); memcpy(&b, s, 4); a *= b; memcpy(dst + 4 * i, &a, 4); break; }
        case ncclFloat64: { double a, b; memcpy(&a, src + 8 * i, 8); memcpy(&b, s, 8); a *= b; memcpy(dst + 8 * i, &a, 8); break; }
        case ncclFloat16: case ncclBfloat16: case ncclFloat8e4m3: case ncclFloat8e5m2:
            sf_put(t, dst + es * i, sf_get(t, src + es * i) * sf_get(t, (const char *)s));
            break;
        case ncclInt8: case ncclUint8: dst[i] = (char)(unsigned char)((unsigned char)src[i] * s[0]); break;
        case ncclInt32: case ncclUint32: { uint32_t a, b; memcpy(&a, src + 4 * i, 4); memcpy(&b, s, 4); a *= b; memcpy(dst + 4 * i, &a, 4); break; }
        default: { uint64_t a, b; memcpy(&a, src + 8 * i, 8); memcpy(&b, s, 8); a *= b; memcpy(dst + 8 * i, &a, 8); break; }
        }
    }
}
/* 1/nranks in the data type (float AVG pre-multiplies by it). */
static void reciprocal(ncclDataType_t t, unsigned char *out, int n) {
    memset(out, 0, 8);
    if (t == ncclFloat32) { float f = 1.0f / (float)n; memcpy(out, &f, 4); }
    else if (t == ncclFloat64) { double f = 1.0 / n; memcpy(out, &f, 8); }
    else sf_put(t, (char *)out, 1.0f / (float)n);
}
static int is_float(ncclDataType_t t) { return t == ncclFloat32 || t == ncclFloat64 || small_float(t); }

/* ---- kernels ------------------------------------------------------------- */

enum { K_ALLREDUCE, K_REDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCESCATTER, K_ALLTOALL, K_GATHER, K_SCATTER, K_SEND, K_RECV };
static const char *kind_name[] = {"ncclAllReduce", "ncclReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter",
                                  "ncclAlltoAll", "ncclGather", "ncclScatter", "ncclSend", "ncclRecv"};

/* One operation of a kernel. `count` is NCCL's count argument; `peer` is
   the root of rooted collectives and the peer of send/recv. */
struct kop {
    int kind, op, peer;
    const void *src;
    void *dst;
    size_t count;
    ncclDataType_t dtype;
    int has_scalar, residence; /* PreMulSum: scalar value or device pointer */
    unsigned char value[8];
    const void *dev_scalar;
    char *own; /* while running: this rank's part, taken in the send phase */
};

/* A data message beyond the eager threshold: the kernel that sent it ends
   only once its receiver took it. */
struct rendezvous {
    int dst;
    unsigned long seq;
};

struct kernel {
    ncclComm_t comm;
    struct rendezvous *waits; /* sends beyond the eager threshold */
    int nwaits;
    int hang; /* TC_SIM_NCCL_HANG_CALL picked this one */
    int counted; /* launched outside a capture: finalize waits for it */
    unsigned long ticket; /* issue order of launched kernels (0: captured) */
    unsigned long dseq;   /* launch order on its device (0: captured) */
    struct kernel *dnext; /* the device's launched kernels not started yet */
    const char *name;
    int nops;
    struct kop *ops;
};

static void kernel_free(struct kernel *k) {
    if (!k) return;
    free(k->waits);
    free(k->ops);
    free(k);
}

/* Signature of an operation, carried by its messages. */
static struct msghdr sig(const struct kop *o, size_t bytes) {
    struct msghdr h;
    memset(&h, 0, sizeof h);
    h.magic = MSG_MAGIC;
    h.kind = o->kind == K_RECV ? K_SEND : o->kind;
    h.dtype = o->kind >= K_SEND ? -1 : o->dtype;
    h.op = o->kind >= K_SEND ? -1 : (o->op >= ncclNumOps ? ncclNumOps : o->op);
    h.root = o->kind >= K_SEND ? -1 : o->peer;
    h.count = o->kind >= K_SEND ? 0 : o->count;
    h.bytes = bytes;
    return h;
}

static int k_send(struct kernel *k, const struct kop *o, int dst, const void *data, size_t bytes) {
    ncclComm_t c = k->comm;
    struct msghdr h = sig(o, bytes);
    if (dst == c->rank) { /* to self: in memory */
        struct selfmsg *m = malloc(sizeof *m + bytes);
        m->bytes = bytes, m->next = NULL;
        memcpy(m->data, data, bytes);
        pthread_mutex_lock(&M);
        if (c->self_tail) c->self_tail->next = m;
        else c->self_head = m;
        c->self_tail = m;
        pthread_mutex_unlock(&M);
        return 0;
    }
    unsigned long seq = c->send_seq[dst]++;
    if (bytes > eager_bytes()) {
        k->waits = realloc(k->waits, sizeof *k->waits * (size_t)(k->nwaits + 1));
        k->waits[k->nwaits++] = (struct rendezvous){dst, seq};
    }
    if (msg_put(c, 'd', dst, seq, &h, data) != 0) {
        simcu_fault("%s (simulated NCCL, rank %d): cannot write a message to rank %d in %s: %s", k->name, c->rank, dst, c->dir,
                    strerror(errno));
        return -1;
    }
    return 0;
}

/* Receives `bytes` from `src` into buf: 0 done, 1 aborted, -1 fault. */
static int k_recv(struct kernel *k, const struct kop *o, int src, void *buf, size_t bytes) {
    ncclComm_t c = k->comm;
    if (src == c->rank) {
        pthread_mutex_lock(&M);
        struct selfmsg *m = c->self_head;
        if (m) {
            c->self_head = m->next;
            if (!c->self_head) c->self_tail = NULL;
        }
        pthread_mutex_unlock(&M);
        int ok = m && m->bytes == bytes;
        if (ok) memcpy(buf, m->data, bytes);
        else simcu_fault("%s (simulated NCCL): a receive from self of %zu bytes matched %s", k->name, bytes, m ? "a send of another size" : "no send");
        free(m);
        return ok ? 0 : -1;
    }
    struct msghdr want = sig(o, bytes), got;
    int g = msg_get(c, 'd', src, c->recv_seq[src]++, &got, buf, bytes, -1);
    if (g == 1) return 1;
    if (g != 0 || got.kind != want.kind || got.dtype != want.dtype || got.op != want.op || got.root != want.root ||
        got.count != want.count || got.bytes != want.bytes) {
        if (g != 0)
            simcu_fault("%s (simulated NCCL, rank %d): the message from rank %d does not fit %zu bytes (or is malformed)", k->name, c->rank,
                        src, bytes);
        else
            simcu_fault("%s (simulated NCCL, rank %d): mismatched calls: rank %d sent for %s (dtype %d, op %d, root %d, count %llu, "
                        "%llu bytes) where this rank runs %s (dtype %d, op %d, root %d, count %llu, %llu bytes)",
                        k->name, c->rank, src, kind_name[got.kind], got.dtype, got.op, got.root, (unsigned long long)got.count,
                        (unsigned long long)got.bytes, kind_name[o->kind], want.dtype, want.op, want.root,
                        (unsigned long long)want.count, (unsigned long long)want.bytes);
        return -1;
    }
    return 0;
}

/* This rank's contribution to a reduction, as NCCL scales it: PreMulSum by
   its scalar, float AVG by 1/nranks. NULL on a fault. */
static char *contribution(struct kernel *k, const struct kop *o, const char *src, size_t n) {
    size_t bytes = n * type_size(o->dtype);
    char *out = malloc(bytes ? bytes : 1);
    memcpy(out, src, bytes);
    if (o->has_scalar) {
        unsigned char v[8];
        memcpy(v, o->value, sizeof v);
        if (o->residence == ncclScalarDevice) {
            const void *sv = simcu_device_view(o->dev_scalar, type_size(o->dtype));
            if (!sv) {
                simcu_fault("%s: the PreMulSum scalar at %p is not device-accessible when the kernel runs", k->name, o->dev_scalar);
                free(out);
                return NULL;
            }
            memcpy(v, sv, type_size(o->dtype));
        }
        premul(o->dtype, out, out, n, v);
    } else if (o->op == ncclAvg && is_float(o->dtype)) {
        unsigned char v[8];
        reciprocal(o->dtype, v, k->comm->nranks);
        premul(o->dtype, out, out, n, v);
    }
    return out;
}

/* The reduction of everybody's contributions (in rank order) into `dst`;
   `own` is this rank's. 0, 1 (aborted) or -1. */
static int reduce_into(struct kernel *k, const struct kop *o, const char *own, char *dst, size_t n) {
    ncclComm_t c = k->comm;
    size_t bytes = n * type_size(o->dtype);
    char *acc = malloc(bytes ? bytes : 1), *tmp = malloc(bytes ? bytes : 1);
    int rc = 0, op = o->has_scalar || o->op == ncclAvg ? ncclSum : o->op;
    for (int r = 0; r < c->nranks && rc == 0; r++) {
        const char *x = own;
        if (r != c->rank) {
            rc = k_recv(k, o, r, tmp, bytes);
            x = tmp;
        }
        if (rc != 0) break;
        if (r == 0) memcpy(acc, x, bytes);
        else combine(o->dtype, op, acc, x, n);
    }
    if (rc == 0) {
        if (o->op == ncclAvg && !is_float(o->dtype)) int_divide(o->dtype, acc, n, c->nranks);
        memcpy(dst, acc, bytes);
    }
    free(acc);
    free(tmp);
    return rc;
}

/* Bytes this rank reads from src and writes to dst in `o`. */
static void op_sizes(const struct kop *o, int me, int n, size_t *sb, size_t *db) {
    size_t b = o->count * type_size(o->dtype), nb = b * (size_t)n;
    int root = me == o->peer;
    switch (o->kind) {
    case K_ALLREDUCE: *sb = b, *db = b; break;
    case K_REDUCE: *sb = b, *db = root ? b : 0; break;
    case K_BROADCAST: *sb = root ? b : 0, *db = b; break;
    case K_ALLGATHER: *sb = b, *db = nb; break;
    case K_REDUCESCATTER: *sb = nb, *db = b; break;
    case K_ALLTOALL: *sb = nb, *db = nb; break;
    case K_GATHER: *sb = b, *db = root ? nb : 0; break;
    case K_SCATTER: *sb = root ? nb : 0, *db = b; break;
    case K_SEND: *sb = b, *db = 0; break;
    default: *sb = 0, *db = b; break;
    }
}

/* Send phase of one operation: everything this rank sends, and its own
   part (o->own) for the receive phase. */
static int send_phase(struct kernel *k, struct kop *o, const char *s) {
    ncclComm_t c = k->comm;
    int me = c->rank, n = c->nranks;
    size_t es = type_size(o->dtype), b = o->count * es;
    switch (o->kind) {
    case K_SEND: return k_send(k, o, o->peer, s, b);
    case K_RECV: return 0;
    case K_ALLREDUCE: case K_REDUCE:
        if (!(o->own = contribution(k, o, s, o->count))) return -1;
        for (int q = 0; q < n; q++)
            if (q != me && (o->kind == K_ALLREDUCE || q == o->peer) && k_send(k, o, q, o->own, b)) return -1;
        return 0;
    case K_REDUCESCATTER:
        for (int q = 0; q < n; q++) {
            char *part = contribution(k, o, s + (size_t)q * b, o->count);
            if (!part) return -1;
            if (q == me) { o->own = part; continue; }
            int rc = k_send(k, o, q, part, b);
            free(part);
            if (rc) return -1;
        }
        return 0;
    case K_BROADCAST: case K_SCATTER:
        if (me != o->peer) return 0;
        for (int q = 0; q < n; q++)
            if (q != me && k_send(k, o, q, s + (o->kind == K_SCATTER ? (size_t)q * b : 0), b)) return -1;
        o->own = malloc(b ? b : 1);
        memcpy(o->own, s + (o->kind == K_SCATTER ? (size_t)me * b : 0), b);
        return 0;
    case K_ALLGATHER: case K_GATHER:
        for (int q = 0; q < n; q++)
            if (q != me && (o->kind == K_ALLGATHER || q == o->peer) && k_send(k, o, q, s, b)) return -1;
        o->own = malloc(b ? b : 1);
        memcpy(o->own, s, b);
        return 0;
    case K_ALLTOALL:
        for (int q = 0; q < n; q++)
            if (q != me && k_send(k, o, q, s + (size_t)q * b, b)) return -1;
        o->own = malloc(b ? b : 1);
        memcpy(o->own, s + (size_t)me * b, b);
        return 0;
    }
    return 0;
}

/* Receive phase of one operation. */
static int recv_phase(struct kernel *k, struct kop *o, char *d) {
    ncclComm_t c = k->comm;
    int me = c->rank, n = c->nranks, rc = 0;
    size_t es = type_size(o->dtype), b = o->count * es;
    switch (o->kind) {
    case K_SEND: return 0;
    case K_RECV: return k_recv(k, o, o->peer, d, b);
    case K_ALLREDUCE: return reduce_into(k, o, o->own, d, o->count);
    case K_REDUCE: return me == o->peer ? reduce_into(k, o, o->own, d, o->count) : 0;
    case K_REDUCESCATTER: return reduce_into(k, o, o->own, d, o->count);
    case K_BROADCAST: case K_SCATTER:
        if (me == o->peer) memcpy(d, o->own, b);
        else rc = k_recv(k, o, o->peer, d, b);
        return rc;
    case K_ALLGATHER: case K_GATHER: case K_ALLTOALL:
        if (o->kind == K_GATHER && me != o->peer) return 0;
        for (int q = 0; q < n && rc == 0; q++) {
            if (q == me) memcpy(d + (size_t)q * b, o->own, b);
            else rc = k_recv(k, o, q, d + (size_t)q * b, b);
        }
        return rc;
    }
    return 0;
}

/* Waits until `dst` took message `seq` of this kernel: 0, or 1 when the
   comm was aborted or the receiver's process is gone. */
static int await_receiver(struct kernel *k, int dst, unsigned long seq) {
    ncclComm_t c = k->comm;
    char path[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/a.%d.%d.%lu", c->dir, dst, c->rank, seq); /* the receiver's acknowledgement */
    double last_check = now_ms();
    for (long pause = 10; unlink(path) != 0; pause = pause < 1000 ? pause * 2 : pause) {
        pthread_mutex_lock(&M);
        int state = c->state;
        pthread_mutex_unlock(&M);
        if (state == ABORTED || state == DESTROYED) return 1;
        if (now_ms() - last_check > 200) {
            pthread_mutex_lock(&M);
            int revoked = c->revoked;
            pthread_mutex_unlock(&M);
            if (revoked) return 1;
            last_check = now_ms();
            if (!peer_alive(c, dst)) {
                pthread_mutex_lock(&M);
                if (c->async_error == ncclSuccess) c->async_error = ncclRemoteError;
                pthread_mutex_unlock(&M);
                return 1;
            }
        }
        sleep_us(pause);
    }
    return 0;
}

static void run_ops(struct kernel *k) {
    ncclComm_t c = k->comm;
    int me = c->rank, n = c->nranks, rc = 0;
    const char **srcs = calloc((size_t)k->nops, sizeof *srcs);
    char **dsts = calloc((size_t)k->nops, sizeof *dsts);
    for (int i = 0; i < k->nops && rc == 0; i++) {
        struct kop *o = &k->ops[i];
        size_t sb, db;
        op_sizes(o, me, n, &sb, &db);
        srcs[i] = sb ? simcu_device_view(o->src, sb) : "";
        dsts[i] = db ? simcu_device_view(o->dst, db) : NULL;
        if (!srcs[i] || (db && !dsts[i])) {
            simcu_fault("%s: buffer %p or %p (%zu/%zu bytes) is not device-accessible memory when the kernel runs (freed?)", k->name,
                        o->src, o->dst, sb, db);
            rc = -1;
        }
    }
    for (int i = 0; i < k->nops && rc == 0; i++) rc = send_phase(k, &k->ops[i], srcs[i]);
    for (int i = 0; i < k->nops && rc == 0; i++) rc = recv_phase(k, &k->ops[i], dsts[i]);
    /* NCCL's connection buffers hold TC_SIM_NCCL_EAGER_BYTES (default 4 MiB,
       its default buffer size); a larger send completes only when its
       receiver took it. The operations of a group progress together (the
       receives above ran first), but a send alone on the stream blocks it:
       ungrouped sends and receives in opposite orders on two ranks hang,
       as on hardware, until the comm is aborted. */
    for (int i = 0; i < k->nwaits && rc == 0; i++) rc = await_receiver(k, k->waits[i].dst, k->waits[i].seq);
    k->nwaits = 0;
    for (int i = 0; i < k->nops; i++) {
        free(k->ops[i].own);
        k->ops[i].own = NULL;
    }
    free(srcs);
    free(dsts);
}

static void run_kernel(void *p) {
    struct kernel *k = p;
    ncclComm_t c = k->comm;
    pthread_mutex_lock(&M);
    int state = c->state;
    pthread_mutex_unlock(&M);
    if (k->hang) {
        long ms = env_long("TC_SIM_NCCL_HANG_MS", 60000);
        for (long t = 0; t < ms && state == LIVE; t++) {
            sleep_us(1000);
            pthread_mutex_lock(&M);
            state = c->state;
            pthread_mutex_unlock(&M);
        }
    }
    pthread_mutex_lock(&M);
    /* one kernel of a comm at a time, launched ones in issue order */
    while ((c->state == LIVE || c->state == FINALIZED) && (c->running || (k->ticket && k->ticket != c->next_run)))
        pthread_cond_wait(&MC, &M);
    /* a device holds TC_SIM_NCCL_MAX_KERNELS NCCL kernels at once (default
       1): kernels of two comms issued in different orders on two ranks
       deadlock, as they can on hardware, until a comm is aborted */
    long max_kernels = env_long("TC_SIM_NCCL_MAX_KERNELS", 1);
    int dev = c->device >= 0 && c->device < MAX_SIM_DEVICES ? c->device : 0;
    /* the device takes kernels in launch order: one launched earlier and not
       started yet goes first, unless its stream holds it back for more
       than 50 ms (waiting for an event) */
    double since = now_ms();
    while ((c->state == LIVE || c->state == FINALIZED) &&
           (device_kernels[dev] >= max_kernels || (k->dseq && device_waiting[dev] != k && now_ms() - since < 50))) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 2000000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&MC, &M, &until);
    }
    for (struct kernel **pp = &device_waiting[dev]; *pp; pp = &(*pp)->dnext)
        if (*pp == k) {
            *pp = k->dnext;
            break;
        }
    state = c->state;
    int run = state == LIVE || state == FINALIZED;
    if (run) c->running = 1, c->dir_users++, device_kernels[dev]++;
    pthread_mutex_unlock(&M);
    if (state == DESTROYED)
        simcu_fault("%s kernel ran after its NCCL comm %p was destroyed (a graph replayed after ncclCommDestroy?)", k->name, (void *)c);
    if (run) run_ops(k); /* kernels of an aborted comm stop early */
    pthread_mutex_lock(&M);
    if (run) {
        c->running = 0;
        device_kernels[dev]--;
        if (--c->dir_users == 0 && c->state == ABORTED) leave_job(c);
    }
    if (k->ticket && c->next_run <= k->ticket) c->next_run = k->ticket + 1;
    pthread_cond_broadcast(&MC);
    pthread_mutex_unlock(&M);
}
static void release_kernel(void *p) {
    struct kernel *k = p;
    if (k->dseq) { /* a kernel that never ran (failed launch) leaves the device's queue */
        pthread_mutex_lock(&M);
        int dev = k->comm->device >= 0 && k->comm->device < MAX_SIM_DEVICES ? k->comm->device : 0;
        for (struct kernel **pp = &device_waiting[dev]; *pp; pp = &(*pp)->dnext)
            if (*pp == k) {
                *pp = k->dnext;
                break;
            }
        pthread_mutex_unlock(&M);
    }
    if (k->counted) {
        pthread_mutex_lock(&M);
        k->comm->inflight--;
        pthread_cond_broadcast(&MC);
        pthread_mutex_unlock(&M);
    }
    kernel_free(k);
}

/* Channels one transfer of `bytes` with a peer uses (see "connections" at
   the head of this file): one per CONN_CHANNEL_BYTES, rounded up to a power
   of two, at most CONN_MAX_CHANNELS; none for an empty transfer. */
static int conn_channels(size_t bytes) {
    if (bytes == 0) return 0;
    size_t want = (bytes + CONN_CHANNEL_BYTES - 1) / CONN_CHANNEL_BYTES;
    int ch = 1;
    while ((size_t)ch < want && ch < CONN_MAX_CHANNELS) ch *= 2;
    return ch;
}

/* On the calling thread, before a kernel is launched: connects every
   channel its point-to-point transfers need that is not connected yet,
   allocating its buffers through the driver in this thread's capture
   interaction mode. A refused allocation fails the call (as NCCL's CUDA
   checks do) and leaves that channel unconnected. */
static ncclResult_t connect_peers(const struct kernel *k) {
    ncclComm_t c = k->comm;
    int me = c->rank, n = c->nranks;
    if (n == 1 || !c->conn) return ncclSuccess;
    int *need = calloc((size_t)n, sizeof *need);
    ncclResult_t r = ncclSuccess;
    if (!need) return fail(ncclSystemError, "%s: out of memory", k->name);
    for (int i = 0; i < k->nops; i++) {
        const struct kop *o = &k->ops[i];
        int ch = conn_channels(o->count * type_size(o->dtype));
        for (int q = 0; q < n; q++) {
            int peers;
            switch (o->kind) {
            case K_SEND: case K_RECV: peers = q == o->peer; break;
            case K_ALLTOALL: peers = 1; break;
            case K_GATHER: case K_SCATTER: peers = me == o->peer || q == o->peer; break;
            default: peers = 0; break; /* ring and tree connections: not modelled */
            }
            if (peers && q != me && ch > need[q]) need[q] = ch;
        }
    }
    for (int q = 0; q < n && r == ncclSuccess; q++)
        for (int ch = 0; ch < need[q] && r == ncclSuccess; ch++) {
            if (c->conn[q] & (1u << ch)) continue;
            void *buf = NULL;
            CUresult cr = simcu_conn_alloc(&buf, CONN_BUFFER_BYTES, c->device >= 0 ? c->device : 0);
            if (cr != CUDA_SUCCESS) {
                r = fail(ncclUnhandledCudaError,
                         "%s (simulated NCCL, rank %d): connecting to rank %d (channel %d): allocating its buffers failed: CUDA error "
                         "%d (a potentially unsafe call from a thread whose capture interaction mode is not relaxed, while a capture "
                         "runs)",
                         k->name, me, q, ch, (int)cr);
                break;
            }
            c->conn[q] |= (unsigned char)(1u << ch);
            c->conn_buf[(size_t)q * CONN_MAX_CHANNELS + (size_t)ch] = buf;
        }
    free(need);
    return r;
}

static ncclResult_t launch(struct kernel *k, CUstream stream) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    const char *name = k->name;
    if (cuStreamIsCapturing(stream, &st) != CUDA_SUCCESS) {
        kernel_free(k);
        return fail(ncclUnhandledCudaError, "%s: stream %p is not a valid stream", name, (void *)stream);
    }
    ncclResult_t cr = connect_peers(k);
    if (cr != ncclSuccess) {
        kernel_free(k);
        return cr;
    }
    k->counted = st == CU_STREAM_CAPTURE_STATUS_NONE;
    static long launches;
    const char *hang = getenv("TC_SIM_NCCL_HANG_CALL"); /* "N" or "N,M,..." */
    ncclComm_t c = k->comm;
    pthread_mutex_lock(&M);
    long me = ++launches;
    for (const char *p = hang; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (atol(p) == me) k->hang = 1;
    if (k->counted) {
        c->inflight++;
        k->ticket = ++c->issued;
        int dev = c->device >= 0 && c->device < MAX_SIM_DEVICES ? c->device : 0;
        k->dseq = ++device_launches[dev];
        struct kernel **pp = &device_waiting[dev];
        while (*pp) pp = &(*pp)->dnext;
        *pp = k;
    }
    unsigned long ticket = k->ticket;
    pthread_mutex_unlock(&M);
    CUresult r = simcu_launch(stream, run_kernel, k, release_kernel); /* releases k on failure */
    if (r != CUDA_SUCCESS) {
        pthread_mutex_lock(&M);
        /* never runs: the next kernel must not wait for it */
        if (ticket && c->next_run == ticket) c->next_run = ticket + 1;
        else if (ticket && c->issued == ticket) c->issued--;
        pthread_cond_broadcast(&MC);
        pthread_mutex_unlock(&M);
        return fail(ncclUnhandledCudaError, "%s: kernel launch failed: CUDA error %d", name, (int)r);
    }
    return ncclSuccess;
}

/* ---- groups ------------------------------------------------------------ */

struct pending {
    ncclComm_t comm;
    struct kop op;
    CUstream stream;
    struct pending *next;
};
static __thread int g_depth;
static int in_group(void) { return g_depth > 0; }
static __thread ncclResult_t g_error;
static __thread struct pending *g_head, *g_tail;

static void defer(ncclComm_t comm, const struct kop *o, CUstream stream) {
    struct pending *p = calloc(1, sizeof *p);
    p->comm = comm, p->op = *o, p->stream = stream;
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
        free(p);
    }
    g_tail = NULL;
}

static int self_p2p(const struct pending *p, int kind) { return p->op.kind == kind && p->op.peer == p->comm->rank; }

/* Non-blocking comms: the group's end reports in-progress. */
static ncclResult_t group_end_status(ncclComm_t c, ncclResult_t r) {
    if (r != ncclSuccess || !c) return r;
    pthread_mutex_lock(&M);
    if (!c->blocking && c->state == LIVE) {
        c->pending_polls = 2;
        r = ncclInProgress;
    }
    pthread_mutex_unlock(&M);
    return r;
}

EXPORT ncclResult_t ncclGroupEnd(void) {
    if (g_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no group was started");
    if (--g_depth > 0) return ncclSuccess;
    ncclResult_t r = g_error;
    ncclComm_t any = g_head ? g_head->comm : NULL, created = NULL;
    ncclResult_t ri = run_pending_inits(&created);
    if (r == ncclSuccess) r = ri;
    if (!any) any = created;
    /* sends to self need a receive from self of the same size, in order */
    for (struct pending *p = g_head; p && r == ncclSuccess; p = p->next) {
        if (!self_p2p(p, K_SEND)) continue;
        size_t bytes = p->op.count * type_size(p->op.dtype);
        struct pending *q;
        /* the n-th send to self pairs with the n-th receive from self */
        size_t nth = 0;
        for (struct pending *x = g_head; x != p; x = x->next) nth += x->comm == p->comm && self_p2p(x, K_SEND);
        size_t i = 0;
        for (q = g_head; q; q = q->next)
            if (q->comm == p->comm && self_p2p(q, K_RECV) && i++ == nth) break;
        if (!q) {
            r = fail(ncclInvalidUsage, "ncclGroupEnd: a send to self (%zu bytes) has no matching receive: it would never complete", bytes);
            break;
        }
        size_t rb = q->op.count * type_size(q->op.dtype);
        if (rb != bytes) {
            r = fail(ncclInvalidUsage, "ncclGroupEnd: send of %zu bytes to self matched with a receive of %zu bytes", bytes, rb);
            break;
        }
    }
    for (struct pending *p = g_head; p && r == ncclSuccess; p = p->next) {
        if (!self_p2p(p, K_RECV)) continue;
        size_t sends = 0, recvs = 0;
        for (struct pending *x = g_head; x; x = x->next)
            if (x->comm == p->comm) sends += self_p2p(x, K_SEND), recvs += self_p2p(x, K_RECV);
        if (recvs > sends)
            r = fail(ncclInvalidUsage, "ncclGroupEnd: a receive from self (%zu bytes) has no matching send",
                     p->op.count * type_size(p->op.dtype));
    }
    /* NCCL runs the operations of a group concurrently: one that reads what
       another writes is a race (undefined results), whatever the order of
       the calls. (Each call's own in-place layout was checked at the call.) */
    for (struct pending *p = g_head; p && r == ncclSuccess; p = p->next) {
        size_t psb, pdb;
        op_sizes(&p->op, p->comm->rank, p->comm->nranks, &psb, &pdb);
        for (struct pending *q = g_head; q && r == ncclSuccess && psb; q = q->next) {
            size_t qsb, qdb;
            if (q == p || q->comm != p->comm) continue;
            op_sizes(&q->op, q->comm->rank, q->comm->nranks, &qsb, &qdb);
            uintptr_t a = (uintptr_t)p->op.src, b = (uintptr_t)q->op.dst;
            if (qdb && a < b + qdb && b < a + psb) {
                fprintf(stderr, "[sim-nccl] ncclGroupEnd: %s reads %p (%zu bytes) while %s of the same group writes %p (%zu bytes)\n",
                        kind_name[p->op.kind], p->op.src, psb, kind_name[q->op.kind], q->op.dst, qdb);
                r = fail(ncclInvalidArgument, "ncclGroupEnd: %s reads a buffer that %s of the same group writes (operations of a group "
                                              "run concurrently: undefined results with NCCL)", kind_name[p->op.kind], kind_name[q->op.kind]);
            }
        }
    }
    /* one kernel per comm, on the stream of its first call */
    for (struct pending *p = g_head; p && r == ncclSuccess; p = p->next) {
        if (!p->comm) continue;
        ncclComm_t comm = p->comm;
        int n = 0;
        for (struct pending *q = p; q; q = q->next)
            if (q->comm == comm) {
                n++;
                if (q->stream != p->stream)
                    r = fail(ncclInvalidUsage, "ncclGroupEnd: one comm's calls on several streams in a group (not modeled by the "
                                               "simulated NCCL)");
            }
        if (r != ncclSuccess) break;
        struct kernel *k = calloc(1, sizeof *k);
        k->comm = comm, k->nops = n, k->ops = calloc((size_t)n, sizeof *k->ops);
        k->name = n == 1 ? kind_name[p->op.kind] : "ncclGroup";
        int i = 0;
        CUstream s = p->stream;
        for (struct pending *q = p; q; q = q->next)
            if (q->comm == comm) {
                k->ops[i++] = q->op;
                if (q != p) q->comm = NULL; /* taken */
            }
        p->comm = NULL;
        r = launch(k, s);
        if (r == ncclSuccess) hold_stream(comm, s);
    }
    drop_group();
    return group_end_status(any, r);
}

/* ---- argument checks ----------------------------------------------------- */

static ncclResult_t check_buffer(ncclComm_t comm, const void *p, size_t bytes, const char *fn, const char *which) {
    if (bytes == 0) return ncclSuccess;
    int dev = p ? simcu_pointer_device(p) : -1;
    if (dev >= 0 && dev != comm->device) {
        fprintf(stderr, "[sim-nccl] %s: %s %p is memory of device %d; the comm's device is %d\n", fn, which, p, dev, comm->device);
        return fail(ncclInvalidArgument, "%s: %s %p is memory of device %d, not of the comm's device %d (a kernel would fault)", fn,
                    which, p, dev, comm->device);
    }
    if (!p) return fail(ncclInvalidArgument, "%s: %s is NULL", fn, which);
    int kind = simcu_memory_kind(p);
    if (kind == 0)
        return fail(ncclInvalidArgument, "%s: %s %p is not device memory or registered host memory (plain host memory)", fn, which, p);
    if (!simcu_device_view(p, bytes))
        return fail(ncclInvalidArgument, "%s: %s %p does not hold %zu bytes in one allocation", fn, which, p, bytes);
    return ncclSuccess;
}

/* Overlapping send and receive buffers are defined only in NCCL's in-place
   layouts (the same pointer; for all-gather and gather the send buffer at
   this rank's block of the receive buffer; for reduce-scatter and scatter
   the receive buffer at this rank's block of the send buffer). */
static ncclResult_t check_overlap(const struct kop *o, int me, int n, const char *fn) {
    size_t sb, db;
    op_sizes(o, me, n, &sb, &db);
    if (!sb || !db || o->kind >= K_SEND) return ncclSuccess;
    uintptr_t s = (uintptr_t)o->src, d = (uintptr_t)o->dst, b = o->count * type_size(o->dtype);
    if (s + sb <= d || d + db <= s) return ncclSuccess;
    switch (o->kind) {
    case K_ALLREDUCE: case K_REDUCE: case K_BROADCAST:
        if (s == d) return ncclSuccess;
        break;
    case K_ALLGATHER: case K_GATHER:
        if (s == d + (uintptr_t)me * b) return ncclSuccess;
        break;
    case K_REDUCESCATTER: case K_SCATTER:
        if (d == s + (uintptr_t)me * b) return ncclSuccess;
        break;
    default: break;
    }
    fprintf(stderr, "[sim-nccl] %s: send buffer %p (%zu bytes) and receive buffer %p (%zu bytes) overlap outside NCCL's in-place layout\n",
            fn, o->src, sb, o->dst, db);
    return fail(ncclInvalidArgument, "%s: send and receive buffers overlap outside NCCL's in-place layout (undefined results with NCCL)", fn);
}

/* Checks a call and makes its operation; under a group it is deferred,
   otherwise launched as a kernel of its own. `op` < 0: no reduction. */
static ncclResult_t submit(int kind, ncclComm_t comm, const void *src, void *dst, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           int peer, CUstream stream) {
    const char *fn = kind_name[kind];
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) {
        if (g_depth) g_error = r;
        return r;
    }
    int me = comm->rank, n = comm->nranks;
    struct kop o;
    memset(&o, 0, sizeof o);
    o.kind = kind, o.op = op, o.peer = peer, o.src = src, o.dst = dst, o.count = count, o.dtype = t;
    size_t sb = 0, db = 0;
    if (t < 0 || t >= NUM_TYPES) r = fail(ncclInvalidArgument, "%s: invalid data type %d (NCCL %d)", fn, t, SIM_NCCL_VERSION);
    else if (peer < 0 || peer >= n)
        r = fail(ncclInvalidArgument, "%s: %s %d is outside [0, %d)", fn, kind >= K_SEND ? "peer" : "root", peer, n);
    else if (!simcu_stream_valid(stream)) r = fail(ncclUnhandledCudaError, "%s: stream %p is not a valid stream", fn, (void *)stream);
    else if (simcu_stream_device(stream) >= 0 && simcu_stream_device(stream) != comm->device)
        r = fail(ncclUnhandledCudaError, "%s: stream %p belongs to device %d, the comm to device %d (invalid resource handle)", fn,
                 (void *)stream, simcu_stream_device(stream), comm->device);
    else if (kind >= K_SEND && peer == me && !g_depth)
        r = fail(ncclInvalidUsage, "%s: a send or receive to self outside a group never completes (real NCCL hangs)", fn);
    if (r == ncclSuccess) {
        op_sizes(&o, me, n, &sb, &db);
        if ((r = check_buffer(comm, src, sb, fn, "sendbuff")) == ncclSuccess && (r = check_buffer(comm, dst, db, fn, "recvbuff")) == ncclSuccess)
            r = check_overlap(&o, me, n, fn);
    }
    if (r == ncclSuccess && op >= ncclNumOps) {
        pthread_mutex_lock(&M);
        struct user_op *u = op - ncclNumOps < MAX_USER_OPS ? &comm->ops[op - ncclNumOps] : NULL;
        if (!u || !u->live) r = fail(ncclInvalidArgument, "%s: reduction op %d is not a live op of this comm", fn, op);
        else if (u->dtype != t) r = fail(ncclInvalidArgument, "%s: op %d was created for data type %d, used with %d", fn, op, u->dtype, t);
        else {
            /* NCCL takes what it needs now: the op may be destroyed once this call returned */
            o.has_scalar = 1, o.residence = u->residence, o.dev_scalar = u->dev;
            memcpy(o.value, u->value, sizeof o.value);
        }
        pthread_mutex_unlock(&M);
    } else if (r == ncclSuccess && op < -1) {
        r = fail(ncclInvalidArgument, "%s: invalid reduction op %d", fn, op);
    } else if (r == ncclSuccess && op == ncclAvg && n == 1 && (t == ncclFloat8e4m3 || t == ncclFloat8e5m2)) {
        /* as NCCL 2.28 and 2.29: an fp8 average is a pre-multiply, and the
           one-rank path's host code has no fp8 kernel for it */
        r = fail(ncclInvalidArgument, "%s: AVG of float8 on a one-rank comm", fn);
    }
    if (r == ncclSuccess && g_depth) {
        defer(comm, &o, stream);
    } else if (r == ncclSuccess) {
        struct kernel *k = calloc(1, sizeof *k);
        k->comm = comm, k->name = fn, k->nops = 1, k->ops = calloc(1, sizeof *k->ops);
        k->ops[0] = o;
        r = launch(k, stream);
        if (r == ncclSuccess) hold_stream(comm, stream);
    } else if (g_depth) {
        g_error = r;
    }
    if (g_depth) { /* the group's end reports in-progress, not each call */
        unbusy(comm);
        return r;
    }
    return leave(comm, r);
}

/* ncclRedOp_t checked: built-in ops (not AVG before 2.10, which we never
   are older than) or user ops; everything else is refused in submit. */
static ncclRedOp_t red(ncclRedOp_t op) { return op < 0 ? -1000 : op; }

EXPORT ncclResult_t ncclAllReduce(const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, CUstream st) {
    return submit(K_ALLREDUCE, c, s, d, n, t, red(op), 0, st);
}
EXPORT ncclResult_t ncclReduce(const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c, CUstream st) {
    return submit(K_REDUCE, c, s, d, n, t, red(op), root, st);
}
EXPORT ncclResult_t ncclBroadcast(const void *s, void *d, size_t n, ncclDataType_t t, int root, ncclComm_t c, CUstream st) {
    return submit(K_BROADCAST, c, s, d, n, t, -1, root, st);
}
EXPORT ncclResult_t ncclAllGather(const void *s, void *d, size_t n, ncclDataType_t t, ncclComm_t c, CUstream st) {
    return submit(K_ALLGATHER, c, s, d, n, t, -1, 0, st);
}
EXPORT ncclResult_t ncclReduceScatter(const void *s, void *d, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, CUstream st) {
    return submit(K_REDUCESCATTER, c, s, d, n, t, red(op), 0, st);
}
#if HAS(22800)
EXPORT ncclResult_t ncclAlltoAll(const void *s, void *d, size_t n, ncclDataType_t t, ncclComm_t c, CUstream st) {
    return submit(K_ALLTOALL, c, s, d, n, t, -1, 0, st);
}
EXPORT ncclResult_t ncclGather(const void *s, void *d, size_t n, ncclDataType_t t, int root, ncclComm_t c, CUstream st) {
    return submit(K_GATHER, c, s, d, n, t, -1, root, st);
}
EXPORT ncclResult_t ncclScatter(const void *s, void *d, size_t n, ncclDataType_t t, int root, ncclComm_t c, CUstream st) {
    return submit(K_SCATTER, c, s, d, n, t, -1, root, st);
}
#endif
EXPORT ncclResult_t ncclSend(const void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, CUstream s) {
    return submit(K_SEND, c, buf, NULL, n, t, -1, peer, s);
}
EXPORT ncclResult_t ncclRecv(void *buf, size_t n, ncclDataType_t t, int peer, ncclComm_t c, CUstream s) {
    return submit(K_RECV, c, NULL, buf, n, t, -1, peer, s);
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
    int refs; /* registrations of this range (or of ranges inside it) not yet deregistered */
    struct reg *next;
};
#define REG_MAGIC 0x52454749u

/* Under M: a destroyed or aborted comm takes its registrations with it. */
static void release_registrations(ncclComm_t c) {
    int left = 0;
    for (struct reg *g = c->regs; g; g = g->next) left += g->refs;
    if (left && c->state == DESTROYED)
        fprintf(stderr, "[sim-nccl] ncclCommDestroy: %d registration reference(s) never deregistered (released with the comm)\n", left);
    while (c->regs) {
        struct reg *g = c->regs;
        c->regs = g->next;
        g->magic = 0;
        free(g);
    }
}

#if HAS(21900)

/* As NCCL's register.cc: registrations are reference-counted by range. A
   range inside a live registration of the comm (the same buffer registered
   again, or a part of it) returns that registration's handle with one more
   reference; each ncclCommDeregister drops one, and the last one releases
   it. Host memory is accepted and left unregistered (a NULL handle). */
EXPORT ncclResult_t ncclCommRegister(ncclComm_t comm, void *buff, size_t size, void **handle) {
    ncclResult_t r = enter(comm, "ncclCommRegister", 0);
    if (r != ncclSuccess) return r;
    if (!handle) r = fail(ncclInvalidArgument, "ncclCommRegister: handle is NULL");
    else if (simcu_memory_kind(buff) != CU_MEMORYTYPE_DEVICE)
        *handle = NULL;
    else if (!simcu_device_view(buff, size))
        r = fail(ncclInvalidArgument, "ncclCommRegister: %p does not hold %zu bytes in one allocation", buff, size);
    else {
        pthread_mutex_lock(&M);
        uintptr_t b = (uintptr_t)buff;
        struct reg *g = comm->regs;
        while (g && !((uintptr_t)g->buf <= b && b + size <= (uintptr_t)g->buf + g->size)) g = g->next;
        if (g) {
            g->refs++;
        } else {
            g = calloc(1, sizeof *g);
            g->magic = REG_MAGIC, g->comm = comm, g->buf = buff, g->size = size, g->refs = 1;
            g->next = comm->regs;
            comm->regs = g;
        }
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
    else if (--g->refs == 0) {
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

/* ---- windows and one-sided operations ---------------------------------- */
#include "fake_nccl_rma.c"
