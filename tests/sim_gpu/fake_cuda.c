/* TEST DOUBLE: a simulated CUDA driver (libcuda.so.1) for running the GPU
   code of libtorchcomm on machines without a GPU. Written for this project
   from the documented driver API; it is not NVIDIA's driver and proves
   nothing about real GPUs. What it models, because it matters for the
   correctness of our code:
   - TC_SIM_DEVICES=N devices (default 1, at most 8), each with a primary
     context; per-thread context stacks, and the calls that need a current
     context fail without one. Device memory belongs to the device of the
     context current at allocation (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL and
     _CONTEXT say which), streams to the device of theirs; the simulated
     NCCL refuses a buffer or stream of another device than its comm's
     (a real kernel would fault or fail to launch);
   - "device memory": host memory mapped twice, the address handed out is
     PROT_NONE (a host dereference crashes, as on a real GPU) and kernels and
     copies use the second mapping; freed ranges stay reserved so that a late
     use is reported as a device fault, not silently served;
   - pointer attributes: DEVICE for device memory, HOST for cuMemHostAlloc'd
     or registered memory, CUDA_ERROR_INVALID_VALUE for memory CUDA never saw;
   - streams with a worker thread each (work runs asynchronously, in order),
     the legacy NULL stream ordered with blocking streams and not with
     non-blocking ones, events (record/query/synchronize/wait, the latest
     record counts), host functions (which may not call the driver);
   - the host-synchronisation rules of the copy functions (a copy from
     pageable memory to the device may return before the device has it);
   - stream capture: work enqueued on a capturing stream is recorded into a
     graph, not run; synchronising a capturing stream or querying an event
     recorded during capture is an error; potentially unsafe calls
     (allocation, synchronisation, event and stream queries) follow the
     documented thread interaction modes (cuThreadExchangeStreamCaptureMode):
     a prohibited call fails and invalidates the capture it disturbs;
     fork/join is legal (a stream waiting on an event of an active capture
     joins it and must be joined back before it ends, else
     CUDA_ERROR_STREAM_CAPTURE_UNJOINED); the legacy stream used while a
     blocking stream captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) and a
     capturing stream waiting on an event recorded outside the capture
     without CU_EVENT_WAIT_EXTERNAL (..._ISOLATION) invalidate the capture;
   - strict handles: destroyed or unknown streams, events, graphs and freed
     memory give error codes;
   - modules and kernel launches (fake_cuda_kernels.c, linked into the same
     library): PTX text with a checked header, only the library's kernels
     (each run as a host emulation on the stream), parameters counted.
   Built with -DSIM_STUB it plays the toolkit's link-time stub libcuda.so
   (cuInit answers CUDA_ERROR_STUB_LIBRARY).
   TC_SIM_DELAY_US=N makes every kernel/copy/host function take N us, so that
   asynchronous completion is observable. TC_SIM_TRACE=1 prints every failing
   driver call. TC_SIM_NO_DEVICE=1 makes cuInit answer CUDA_ERROR_NO_DEVICE. */
#define _GNU_SOURCE
#include "sim_gpu.h"
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAGIC_STREAM 0x5354524du
#define MAGIC_EVENT 0x45564e54u
#define MAGIC_GRAPH 0x47524150u
#define MAGIC_EXEC 0x45584543u

static pthread_mutex_t G = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t GC = PTHREAD_COND_INITIALIZER; /* any progress */
static int g_inited, g_trace, g_delay_us;
static CUresult g_sticky; /* a device fault poisons the context */

static __thread int tl_in_hostfn;

static CUresult ret(CUresult r, const char *fn) {
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY && g_trace) fprintf(stderr, "[sim-cuda] %s -> %d\n", fn, (int)r);
    return r;
}
#define RET(r) return ret((r), __func__)
#define ENTER()                                                       \
    do {                                                              \
        if (tl_in_hostfn) RET(CUDA_ERROR_NOT_PERMITTED);              \
        if (!g_inited) RET(CUDA_ERROR_NOT_INITIALIZED);               \
    } while (0)

/* ---- contexts ---------------------------------------------------------- */

struct CUctx_st {
    int device;
    int retains;
};
#define MAX_DEVICES 8
static struct CUctx_st primaries[MAX_DEVICES];
static int g_ndev = 1;
#define CTX_STACK 16
static __thread CUcontext tl_ctx[CTX_STACK];
static __thread int tl_nctx;

static CUcontext current(void) { return tl_nctx ? tl_ctx[tl_nctx - 1] : NULL; }
static int valid_ctx(CUcontext c) { return c >= primaries && c < primaries + g_ndev; }

/* ---- memory registry ----------------------------------------------------- */

enum { M_DEVICE = 1, M_HOSTALLOC, M_HOSTREG, M_FREED };
struct alloc {
    uintptr_t base;
    size_t size, map;
    char *shadow; /* device memory: the host-accessible mapping */
    int kind, tag;
    int device; /* device memory: its device's ordinal */
    struct alloc *next;
};
static struct alloc *allocs;

static struct alloc *find(uintptr_t p) {
    for (struct alloc *a = allocs; a; a = a->next)
        if (p >= a->base && p < a->base + (a->kind == M_FREED ? a->map : a->size)) return a;
    return NULL;
}
static struct alloc *find_base(uintptr_t p, int kind) {
    for (struct alloc *a = allocs; a; a = a->next)
        if (a->base == p && a->kind == kind) return a;
    return NULL;
}

/* ---- streams, events, work items ---------------------------------------- */

struct node {
    simcu_kernel_fn fn;
    void *arg;
    void (*release)(void *);
};
struct nodes { /* a graph's recorded work, shared by the graph and its execs */
    int refs, n, cap;
    struct node *v;
};
static void nodes_unref(void *p) {
    struct nodes *ns = p;
    pthread_mutex_lock(&G);
    int last = --ns->refs == 0;
    pthread_mutex_unlock(&G);
    if (!last) return;
    for (int i = 0; i < ns->n; i++)
        if (ns->v[i].release) ns->v[i].release(ns->v[i].arg);
    free(ns->v);
    free(ns);
}
static void nodes_add(struct nodes *ns, struct node n) {
    if (ns->n == ns->cap) {
        ns->cap = ns->cap ? ns->cap * 2 : 16;
        ns->v = realloc(ns->v, sizeof *ns->v * (size_t)ns->cap);
    }
    ns->v[ns->n++] = n;
}

enum { I_FN, I_RECORD, I_WAIT };
struct item {
    int kind;
    struct node fn;
    struct CUevent_st *ev;
    unsigned long long gen, seq;
    struct item *next;
};

struct CUstream_st {
    unsigned magic;
    int dead, flags, priority, legacy;
    int device; /* of the context current at creation (the legacy stream: any) */
    int nccl_hold; /* non-blocking NCCL calls on it that have not reported success */
    struct item *head, *tail;
    unsigned long long enq_seq, done_seq;
    pthread_t thread;
    int started;
    /* capture */
    int cap_status, cap_mode;
    pthread_t cap_thread;
    unsigned long long cap_id;
    struct nodes *cap;
    /* a stream that joined another's capture by waiting on one of its
       events (fork): its captured work and how much of it the capture
       waited for (join); all must be joined before the capture ends */
    int forked;
    unsigned long long cap_work, cap_joined;
    struct CUstream_st *next_all;
};
static struct CUstream_st legacy = {.magic = MAGIC_STREAM, .legacy = 1};
static struct CUstream_st *streams = &legacy;
static unsigned long long g_cap_ids;

struct CUevent_st {
    unsigned magic;
    int dead;
    unsigned flags;
    unsigned long long rec_gen, done_gen;
    unsigned long long cap_id; /* non-zero: last recorded during that capture */
    struct CUstream_st *cap_src; /* ... on this stream, after cap_work of its captured work */
    unsigned long long cap_work;
    struct timespec when;
    struct CUevent_st *next_all;
};
static struct CUevent_st *events;

/* Destroyed graphs and execs stay listed (a later use is reported). */
struct CUgraph_st {
    unsigned magic;
    int dead;
    struct nodes *nodes;
    struct CUgraph_st *next_all;
};
struct CUgraphExec_st {
    unsigned magic;
    int dead;
    struct nodes *nodes;
    struct CUgraphExec_st *next_all;
};
static struct CUgraph_st *graphs;
static struct CUgraphExec_st *execs;
static int graph_ok(CUgraph g) {
    for (struct CUgraph_st *x = graphs; x; x = x->next_all)
        if (x == g) return !x->dead;
    return 0;
}
static int exec_ok(CUgraphExec e) {
    for (struct CUgraphExec_st *x = execs; x; x = x->next_all)
        if (x == e) return !x->dead;
    return 0;
}

static void run_node(struct node *n) {
    if (g_delay_us > 0) usleep((useconds_t)g_delay_us);
    n->fn(n->arg);
}

static void *worker(void *p) {
    struct CUstream_st *s = p;
    pthread_mutex_lock(&G);
    for (;;) {
        while (!s->head && !s->dead) pthread_cond_wait(&GC, &G);
        if (!s->head) break; /* destroyed and drained */
        struct item *it = s->head;
        if (it->kind == I_WAIT) {
            while (it->ev->done_gen < it->gen) pthread_cond_wait(&GC, &G);
        } else if (it->kind == I_RECORD) {
            if (it->ev->done_gen < it->gen) it->ev->done_gen = it->gen;
            clock_gettime(CLOCK_MONOTONIC, &it->ev->when);
        } else {
            pthread_mutex_unlock(&G);
            run_node(&it->fn);
            if (it->fn.release) it->fn.release(it->fn.arg);
            pthread_mutex_lock(&G);
        }
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->done_seq = it->seq;
        free(it);
        pthread_cond_broadcast(&GC);
    }
    pthread_mutex_unlock(&G);
    return NULL;
}

/* Under G. */
static void push(struct CUstream_st *s, struct item *it) {
    if (!s->started) {
        s->started = 1;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_create(&s->thread, &a, worker, s);
        pthread_attr_destroy(&a);
    }
    it->seq = ++s->enq_seq;
    it->next = NULL;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    pthread_cond_broadcast(&GC);
}

/* Internal events that order the legacy stream with blocking streams. */
static struct CUevent_st *internal_event(void) {
    struct CUevent_st *e = calloc(1, sizeof *e);
    e->magic = MAGIC_EVENT;
    return e;
}
static void free_internal_event(void *e) { free(e); }
static void nop(void *arg) { (void)arg; }

/* Under G: `to` waits for everything enqueued on `from` so far. */
static void order_after(struct CUstream_st *to, struct CUstream_st *from) {
    if (from->enq_seq == from->done_seq || from->cap_status) return;
    struct CUevent_st *e = internal_event();
    struct item *r = calloc(1, sizeof *r), *w = calloc(1, sizeof *w);
    r->kind = I_RECORD, r->ev = e, r->gen = 1;
    push(from, r);
    w->kind = I_WAIT, w->ev = e, w->gen = 1;
    push(to, w);
    /* freed once both ran: a no-op item on `to` after the wait */
    struct item *f = calloc(1, sizeof *f);
    f->kind = I_FN, f->fn = (struct node){nop, e, free_internal_event};
    push(to, f);
}

/* Under G: the legacy stream synchronises with blocking streams. */
static void invalidate(struct CUstream_st *s);

/* Under G. The legacy stream synchronizes with every blocking stream, so
   its use while a blocking stream captures is invalid (CUDA documents
   cudaErrorStreamCaptureImplicit) and invalidates that capture. */
static CUresult legacy_use_ok(struct CUstream_st *s) {
    CUresult r = CUDA_SUCCESS;
    for (struct CUstream_st *o = streams; o && s->legacy; o = o->next_all)
        if (o != s && !o->dead && o->flags == CU_STREAM_DEFAULT && o->cap_status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
            fprintf(stderr, "[sim-cuda] legacy stream used while blocking stream %p captures: capture invalidated\n", (void *)o);
            invalidate(o);
            r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    return r;
}

static void implicit_order(struct CUstream_st *s) {
    for (struct CUstream_st *o = streams; o; o = o->next_all) {
        if (o == s || o->dead) continue;
        if (s->legacy && o->flags == CU_STREAM_DEFAULT) order_after(s, o);
        if (!s->legacy && s->flags == CU_STREAM_DEFAULT && o->legacy) order_after(s, o);
    }
}

static struct CUstream_st *stream_of(CUstream h) {
    if (h == NULL || h == (CUstream)0x1 || h == (CUstream)0x2) return &legacy; /* legacy, per-thread: one here */
    for (struct CUstream_st *s = streams; s; s = s->next_all)
        if (s == h) return s->magic == MAGIC_STREAM && !s->dead ? s : NULL;
    return NULL;
}
static struct CUevent_st *event_of(CUevent h) {
    for (struct CUevent_st *e = events; e; e = e->next_all)
        if (e == h) return e->dead ? NULL : e;
    return NULL;
}

static void drain_all(void);

/* Under G: the capture of s, and of every stream forked into it. */
static void invalidate(struct CUstream_st *s) {
    if (s->cap_status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return;
    for (struct CUstream_st *o = streams; o; o = o->next_all)
        if (o == s || (o->cap_status == CU_STREAM_CAPTURE_STATUS_ACTIVE && o->cap_id == s->cap_id)) {
            o->cap_status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            if (g_trace) fprintf(stderr, "[sim-cuda] capture of stream %p invalidated\n", (void *)o);
        }
}

/* Under G: a non-blocking NCCL call whose comm has not reported success yet
   may not have put its work on the stream (NCCL does that from its own
   thread): any use of the stream meanwhile would be ordered wrongly. */
static CUresult held(struct CUstream_st *s, const char *fn) {
    if (!s->nccl_hold) return CUDA_SUCCESS;
    fprintf(stderr, "[sim-cuda] %s: stream %p used while a non-blocking NCCL call on it has not reported ncclSuccess\n", fn,
            (void *)s);
    return CUDA_ERROR_ILLEGAL_STATE;
}
EXPORT void simcu_stream_hold(CUstream h, int delta) {
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    if (s) s->nccl_hold += delta;
    pthread_mutex_unlock(&G);
}

/* Under G: enqueues (or records, when capturing) one piece of work. */
static CUresult enqueue(struct CUstream_st *s, struct node n) {
    CUresult hr = held(s, "enqueue");
    if (hr != CUDA_SUCCESS) {
        if (n.release) n.release(n.arg);
        return hr;
    }
    if (s->cap_status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
        if (n.release) n.release(n.arg);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    if (s->cap_status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        nodes_add(s->cap, n);
        s->cap_work++;
        return CUDA_SUCCESS;
    }
    CUresult r = g_sticky ? g_sticky : legacy_use_ok(s);
    if (r != CUDA_SUCCESS) {
        if (n.release) n.release(n.arg);
        return r;
    }
    implicit_order(s);
    struct item *it = calloc(1, sizeof *it);
    it->kind = I_FN;
    it->fn = n;
    push(s, it);
    return CUDA_SUCCESS;
}

/* Under G: waits until work `seq` of `s` ran. */
static void wait_seq(struct CUstream_st *s, unsigned long long seq) {
    while (s->done_seq < seq) pthread_cond_wait(&GC, &G);
}

/* The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode). */
static __thread int tl_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* Under G: a potentially unsafe call (allocation, synchronisation, event or
   stream query) is prohibited, as documented for the thread's interaction
   mode: GLOBAL (the default) while this thread captures (not relaxed) or any
   thread captures in global mode; THREAD_LOCAL only while this thread
   captures; RELAXED never. A prohibited call fails and invalidates the
   capture(s) it would disturb. */
static CUresult unsafe_during_capture(void) {
    CUresult r = CUDA_SUCCESS;
    if (tl_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return r;
    for (struct CUstream_st *s = streams; s; s = s->next_all) {
        if (s->dead || s->cap_status != CU_STREAM_CAPTURE_STATUS_ACTIVE || s->cap_mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        int own = pthread_equal(s->cap_thread, pthread_self());
        if (own || (tl_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && s->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            if (g_trace && !own) fprintf(stderr, "[sim-cuda] a thread in global capture mode made an unsafe call during another thread's global capture\n");
            invalidate(s);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return r;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    ENTER();
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED) RET(CUDA_ERROR_INVALID_VALUE);
    int old = tl_mode;
    tl_mode = (int)*mode;
    *mode = (CUstreamCaptureMode)old;
    return CUDA_SUCCESS;
}

EXPORT void simcu_fault(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[sim-cuda] DEVICE FAULT (CUDA_ERROR_ILLEGAL_ADDRESS from now on): ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    pthread_mutex_lock(&G);
    if (!g_sticky) g_sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    pthread_mutex_unlock(&G);
}

/* ---- errors ------------------------------------------------------------ */

static const struct {
    int code;
    const char *name, *text;
} names[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == (int)error) { *pStr = names[i].name; return CUDA_SUCCESS; }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].code == (int)error) { *pStr = names[i].text; return CUDA_SUCCESS; }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- init, devices, contexts ------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags) {
#ifdef SIM_STUB
    (void)flags;
    RET(CUDA_ERROR_STUB_LIBRARY); /* built as the toolkit's link-time stub (lib64/stubs/libcuda.so) */
#endif
    if (flags != 0) RET(CUDA_ERROR_INVALID_VALUE);
    const char *v = getenv("TC_SIM_NO_DEVICE");
    if (v && *v && strcmp(v, "0") != 0) RET(CUDA_ERROR_NO_DEVICE);
    pthread_mutex_lock(&G);
    if (!g_inited) {
        const char *t = getenv("TC_SIM_TRACE");
        g_trace = t && *t && strcmp(t, "0") != 0;
        const char *d = getenv("TC_SIM_DELAY_US");
        g_delay_us = d ? atoi(d) : 0;
        const char *n = getenv("TC_SIM_DEVICES");
        g_ndev = n && atoi(n) > 0 ? (atoi(n) > MAX_DEVICES ? MAX_DEVICES : atoi(n)) : 1;
        for (int i = 0; i < MAX_DEVICES; i++) primaries[i].device = i;
        g_inited = 1;
    }
    pthread_mutex_unlock(&G);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) RET(CUDA_ERROR_INVALID_VALUE);
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *count) {
    ENTER();
    if (!count) RET(CUDA_ERROR_INVALID_VALUE);
    *count = g_ndev;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    ENTER();
    if (!device) RET(CUDA_ERROR_INVALID_VALUE);
    if (ordinal < 0 || ordinal >= g_ndev) RET(CUDA_ERROR_INVALID_DEVICE);
    *device = ordinal;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    ENTER();
    if (!pctx) RET(CUDA_ERROR_INVALID_VALUE);
    if (dev < 0 || dev >= g_ndev) RET(CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&G);
    primaries[dev].retains++;
    pthread_mutex_unlock(&G);
    *pctx = &primaries[dev];
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER();
    if (dev < 0 || dev >= g_ndev) RET(CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&G);
    int over = primaries[dev].retains <= 0;
    if (!over) primaries[dev].retains--;
    pthread_mutex_unlock(&G);
    /* releasing more than retained would destroy a context others use */
    if (over) RET(CUDA_ERROR_INVALID_CONTEXT);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    ENTER();
    if (!pctx) RET(CUDA_ERROR_INVALID_VALUE);
    *pctx = current();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER();
    if (ctx == NULL) {
        if (tl_nctx) tl_nctx--;
        return CUDA_SUCCESS;
    }
    if (!valid_ctx(ctx)) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (tl_nctx) tl_ctx[tl_nctx - 1] = ctx;
    else tl_ctx[tl_nctx++] = ctx;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    ENTER();
    if (!valid_ctx(ctx)) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (tl_nctx == CTX_STACK) RET(CUDA_ERROR_OUT_OF_MEMORY);
    tl_ctx[tl_nctx++] = ctx;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    ENTER();
    if (!tl_nctx) RET(CUDA_ERROR_INVALID_CONTEXT);
    CUcontext c = tl_ctx[--tl_nctx];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (!device) RET(CUDA_ERROR_INVALID_VALUE);
    *device = current()->device;
    return CUDA_SUCCESS;
}
EXPORT int simcu_current_device(void) { return current() ? current()->device : -1; }

EXPORT CUresult cuCtxSynchronize(void) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    pthread_mutex_lock(&G);
    CUresult r = unsafe_during_capture();
    if (r == CUDA_SUCCESS) {
        drain_all();
        r = g_sticky;
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

/* ---- streams ----------------------------------------------------------- */

EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (!ph || (flags & ~1u)) RET(CUDA_ERROR_INVALID_VALUE);
    struct CUstream_st *s = calloc(1, sizeof *s);
    s->magic = MAGIC_STREAM;
    s->flags = (int)flags;
    s->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority; /* clamped, as documented */
    s->device = current()->device;
    pthread_mutex_lock(&G);
    s->next_all = streams;
    streams = s;
    pthread_mutex_unlock(&G);
    *ph = s;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags) { return cuStreamCreateWithPriority(ph, flags, 0); }

EXPORT CUresult cuStreamDestroy_v2(CUstream h) {
    ENTER();
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    if (!s || s->legacy) {
        pthread_mutex_unlock(&G);
        RET(CUDA_ERROR_INVALID_HANDLE);
    }
    /* pending work still completes; the handle is dead at once */
    s->dead = 1;
    pthread_cond_broadcast(&GC);
    pthread_mutex_unlock(&G);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, int wait) {
    ENTER();
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r = CUDA_SUCCESS;
    if (!s) r = CUDA_ERROR_INVALID_HANDLE;
    else if ((r = held(s, wait ? "cuStreamSynchronize" : "cuStreamQuery")) != CUDA_SUCCESS) {
    } else if (s->cap_status) {
        invalidate(s);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if ((r = unsafe_during_capture()) == CUDA_SUCCESS) {
        /* work enqueued before this call: other threads may add more */
        unsigned long long target = s->enq_seq;
        if (wait) {
            if (s->legacy) /* the legacy stream also waits for blocking streams */
                for (struct CUstream_st *o = streams; o; o = o->next_all)
                    if (!o->dead && o->flags == CU_STREAM_DEFAULT) wait_seq(o, o->enq_seq);
            wait_seq(s, target);
        }
        r = g_sticky ? g_sticky : s->done_seq < target ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT CUresult cuStreamSynchronize(CUstream h) { return stream_sync(h, 1); }
EXPORT CUresult cuStreamQuery(CUstream h) { return stream_sync(h, 0); }

EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags) {
    ENTER();
    if (flags & ~1u) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    struct CUevent_st *e = event_of(ev);
    CUresult r = CUDA_SUCCESS;
    if (!s || !e) r = CUDA_ERROR_INVALID_HANDLE;
    else if ((r = held(s, "cuStreamWaitEvent")) != CUDA_SUCCESS) {
    } else if (s->cap_status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        /* In-capture dependency: recorded work of this capture precedes in
           the node list already (a join when the event is another stream's).
           An event of another capture would cross capture sequences, and
           one recorded outside any capture is no node of this graph (CUDA
           wants CU_EVENT_WAIT_EXTERNAL for that). */
        if (e->cap_id && e->cap_id != s->cap_id) {
            invalidate(s);
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        } else if (e->cap_id && e->cap_src && e->cap_src != s) {
            if (e->cap_work > e->cap_src->cap_joined) e->cap_src->cap_joined = e->cap_work;
        } else if (!e->cap_id && e->rec_gen > 0 && !(flags & 1u)) {
            fprintf(stderr, "[sim-cuda] capturing stream %p waits on event %p recorded outside the capture: capture invalidated\n",
                    (void *)s, (void *)e);
            invalidate(s);
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        }
    } else if (s->cap_status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (e->cap_id) {
        /* a fork: a stream waiting on an event of an active capture joins it */
        struct CUstream_st *origin = NULL;
        for (struct CUstream_st *o = streams; o && !origin; o = o->next_all)
            if (o->cap_status == CU_STREAM_CAPTURE_STATUS_ACTIVE && o->cap_id == e->cap_id) origin = o;
        if (!origin || s->legacy) {
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION; /* waiting on captured work from outside */
        } else {
            s->cap_status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
            s->cap_mode = origin->cap_mode;
            s->cap_thread = origin->cap_thread;
            s->cap_id = origin->cap_id;
            s->cap = origin->cap;
            s->cap->refs++;
            s->forked = 1;
            s->cap_work = s->cap_joined = 0;
        }
    } else if ((r = legacy_use_ok(s)) != CUDA_SUCCESS) {
    } else if (e->rec_gen > e->done_gen) {
        /* waits for the latest record as of now; later records do not count */
        implicit_order(s);
        struct item *it = calloc(1, sizeof *it);
        it->kind = I_WAIT, it->ev = e, it->gen = e->rec_gen;
        push(s, it);
    }
    pthread_mutex_unlock(&G);
    RET(r);
}

EXPORT CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st) {
    ENTER();
    if (!st) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r = CUDA_SUCCESS;
    if (!s) r = CUDA_ERROR_INVALID_HANDLE;
    else *st = (CUstreamCaptureStatus)s->cap_status;
    pthread_mutex_unlock(&G);
    RET(r);
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
    ENTER();
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r = CUDA_SUCCESS;
    if (!s) r = CUDA_ERROR_INVALID_HANDLE;
    else if (s->legacy) r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    else if (s->cap_status) r = CUDA_ERROR_ILLEGAL_STATE;
    else {
        s->cap_status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        s->cap_mode = (int)mode;
        s->cap_thread = pthread_self();
        s->cap_id = ++g_cap_ids;
        s->cap = calloc(1, sizeof *s->cap);
        s->cap->refs = 1;
    }
    pthread_mutex_unlock(&G);
    RET(r);
}

EXPORT CUresult cuStreamEndCapture(CUstream h, CUgraph *ph) {
    ENTER();
    if (!ph) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r = CUDA_SUCCESS;
    struct nodes *ns = NULL;
    if (!s) r = CUDA_ERROR_INVALID_HANDLE;
    else if (!s->cap_status) r = CUDA_ERROR_ILLEGAL_STATE;
    else if (s->forked) r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED; /* a capture ends on the stream that began it */
    else if (s->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(s->cap_thread, pthread_self()))
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    else {
        ns = s->cap;
        r = s->cap_status == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
        /* every forked stream must have been joined back; all leave the capture */
        for (struct CUstream_st *f = streams; f; f = f->next_all) {
            if (f == s || !f->forked || f->cap_id != s->cap_id || f->cap_status == CU_STREAM_CAPTURE_STATUS_NONE) continue;
            if (f->cap_work > f->cap_joined && r == CUDA_SUCCESS) {
                fprintf(stderr, "[sim-cuda] capture ended with forked stream %p not joined back\n", (void *)f);
                r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
            }
            f->cap->refs--; /* the origin's reference keeps the nodes */
            f->cap = NULL, f->forked = 0, f->cap_status = CU_STREAM_CAPTURE_STATUS_NONE;
        }
        s->cap = NULL;
        s->cap_status = CU_STREAM_CAPTURE_STATUS_NONE;
        /* events recorded during the capture stay captured until re-recorded */
    }
    pthread_mutex_unlock(&G);
    if (ns && r != CUDA_SUCCESS) {
        nodes_unref(ns);
        *ph = NULL;
    } else if (ns) {
        struct CUgraph_st *g = calloc(1, sizeof *g);
        g->magic = MAGIC_GRAPH;
        g->nodes = ns;
        pthread_mutex_lock(&G);
        g->next_all = graphs;
        graphs = g;
        pthread_mutex_unlock(&G);
        *ph = g;
    }
    RET(r);
}

struct hostfn {
    CUhostFn fn;
    void *ud;
};
static void call_hostfn(void *p) {
    struct hostfn *h = p;
    tl_in_hostfn = 1; /* host functions must not call CUDA */
    h->fn(h->ud);
    tl_in_hostfn = 0;
}
EXPORT CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *ud) {
    ENTER();
    if (!fn) RET(CUDA_ERROR_INVALID_VALUE);
    struct hostfn *a = malloc(sizeof *a);
    a->fn = fn, a->ud = ud;
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r = s ? enqueue(s, (struct node){call_hostfn, a, free}) : CUDA_ERROR_INVALID_HANDLE;
    if (!s) free(a);
    pthread_mutex_unlock(&G);
    RET(r);
}

EXPORT CUresult simcu_launch(CUstream h, simcu_kernel_fn fn, void *arg, void (*release)(void *)) {
    ENTER();
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r;
    if (!s) {
        r = CUDA_ERROR_INVALID_HANDLE;
        if (release) release(arg);
    } else if (s->legacy && !current()) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        if (release) release(arg);
    } else {
        r = enqueue(s, (struct node){fn, arg, release});
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT int simcu_stream_valid(CUstream h) {
    pthread_mutex_lock(&G);
    int ok = stream_of(h) != NULL;
    pthread_mutex_unlock(&G);
    return ok;
}

/* ---- events ------------------------------------------------------------ */

EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (!ph || (flags & ~7u)) RET(CUDA_ERROR_INVALID_VALUE);
    struct CUevent_st *e = calloc(1, sizeof *e);
    e->magic = MAGIC_EVENT;
    e->flags = flags;
    pthread_mutex_lock(&G);
    e->next_all = events;
    events = e;
    pthread_mutex_unlock(&G);
    *ph = e;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventDestroy_v2(CUevent h) {
    ENTER();
    pthread_mutex_lock(&G);
    struct CUevent_st *e = event_of(h);
    if (e) e->dead = 1; /* kept: a later use is reported, and waits already queued still see it */
    pthread_mutex_unlock(&G);
    RET(e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}
EXPORT CUresult cuEventRecord(CUevent ev, CUstream h) {
    ENTER();
    pthread_mutex_lock(&G);
    struct CUevent_st *e = event_of(ev);
    struct CUstream_st *s = stream_of(h);
    CUresult r = CUDA_SUCCESS;
    if (!e || !s) r = CUDA_ERROR_INVALID_HANDLE;
    else if ((r = held(s, "cuEventRecord")) != CUDA_SUCCESS) {
    } else if (s->cap_status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (s->cap_status == CU_STREAM_CAPTURE_STATUS_ACTIVE) e->cap_id = s->cap_id, e->cap_src = s, e->cap_work = s->cap_work;
    else if (g_sticky) r = g_sticky;
    else if ((r = legacy_use_ok(s)) != CUDA_SUCCESS) {
    } else {
        e->cap_id = 0;
        implicit_order(s);
        struct item *it = calloc(1, sizeof *it);
        it->kind = I_RECORD, it->ev = e, it->gen = ++e->rec_gen;
        push(s, it);
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
static CUresult event_wait(CUevent ev, int wait) {
    ENTER();
    pthread_mutex_lock(&G);
    struct CUevent_st *e = event_of(ev);
    CUresult r = CUDA_SUCCESS;
    if (!e) r = CUDA_ERROR_INVALID_HANDLE;
    else if (e->cap_id) r = CUDA_ERROR_CAPTURED_EVENT;
    else if ((r = unsafe_during_capture()) != CUDA_SUCCESS) {
    } else {
        if (wait)
            while (e->done_gen < e->rec_gen) pthread_cond_wait(&GC, &G);
        r = g_sticky ? g_sticky : e->done_gen < e->rec_gen ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT CUresult cuEventQuery(CUevent ev) { return event_wait(ev, 0); }
EXPORT CUresult cuEventSynchronize(CUevent ev) { return event_wait(ev, 1); }
EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    ENTER();
    if (!ms) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    struct CUevent_st *x = event_of(a), *y = event_of(b);
    CUresult r = CUDA_SUCCESS;
    if (!x || !y || (x->flags | y->flags) & CU_EVENT_DISABLE_TIMING) r = CUDA_ERROR_INVALID_HANDLE;
    else if (x->cap_id || y->cap_id) r = CUDA_ERROR_CAPTURED_EVENT;
    else if (!x->rec_gen || !y->rec_gen) r = CUDA_ERROR_INVALID_HANDLE;
    else if (x->done_gen < x->rec_gen || y->done_gen < y->rec_gen) r = CUDA_ERROR_NOT_READY;
    else *ms = (float)((double)(y->when.tv_sec - x->when.tv_sec) * 1e3 + (double)(y->when.tv_nsec - x->when.tv_nsec) * 1e-6);
    pthread_mutex_unlock(&G);
    RET(r);
}
/* the pre-12.8 symbol, for older callers */
#undef cuEventElapsedTime
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }

/* ---- graphs ------------------------------------------------------------ */

static void run_nodes(void *p) {
    struct nodes *ns = p;
    for (int i = 0; i < ns->n; i++) run_node(&ns->v[i]);
}
static void unref_nodes(void *p) { nodes_unref(p); }

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *ph, CUgraph g, unsigned long long flags) {
    ENTER();
    if (!ph) RET(CUDA_ERROR_INVALID_VALUE);
    (void)flags;
    pthread_mutex_lock(&G);
    CUresult r = CUDA_SUCCESS;
    if (!graph_ok(g)) r = CUDA_ERROR_INVALID_HANDLE;
    else {
        struct CUgraphExec_st *x = calloc(1, sizeof *x);
        x->magic = MAGIC_EXEC;
        x->nodes = g->nodes;
        g->nodes->refs++;
        x->next_all = execs;
        execs = x;
        *ph = x;
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec x, CUstream h) {
    ENTER();
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r;
    if (!exec_ok(x) || !s) r = CUDA_ERROR_INVALID_HANDLE;
    else {
        x->nodes->refs++;
        r = enqueue(s, (struct node){run_nodes, x->nodes, unref_nodes});
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT CUresult cuGraphExecDestroy(CUgraphExec x) {
    ENTER();
    pthread_mutex_lock(&G);
    int ok = exec_ok(x);
    if (ok) x->dead = 1;
    pthread_mutex_unlock(&G);
    if (!ok) RET(CUDA_ERROR_INVALID_HANDLE);
    nodes_unref(x->nodes); /* a launch in flight holds its own reference */
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphDestroy(CUgraph g) {
    ENTER();
    pthread_mutex_lock(&G);
    int ok = graph_ok(g);
    if (ok) g->dead = 1;
    pthread_mutex_unlock(&G);
    if (!ok) RET(CUDA_ERROR_INVALID_HANDLE);
    nodes_unref(g->nodes);
    return CUDA_SUCCESS;
}

/* ---- memory ------------------------------------------------------------ */

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* Under G. */
static CUresult device_alloc_on(void **out, size_t bytes, int tag, int device);
static CUresult device_alloc(void **out, size_t bytes, int tag) {
    return device_alloc_on(out, bytes, tag, current() ? current()->device : 0);
}
static CUresult device_alloc_on(void **out, size_t bytes, int tag, int device) {
    size_t map = page_round(bytes);
    int fd = memfd_create("sim-gpu", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)map) != 0) { close(fd); return CUDA_ERROR_OUT_OF_MEMORY; }
    void *dev = mmap(NULL, map, PROT_NONE, MAP_SHARED, fd, 0);
    void *sh = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (dev == MAP_FAILED || sh == MAP_FAILED) {
        if (dev != MAP_FAILED) munmap(dev, map);
        if (sh != MAP_FAILED) munmap(sh, map);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(sh, 0xa5, map); /* cuMemAlloc does not clear memory */
    struct alloc *a = calloc(1, sizeof *a);
    a->base = (uintptr_t)dev, a->size = bytes, a->map = map, a->shadow = sh, a->kind = M_DEVICE, a->tag = tag;
    a->device = device;
    a->next = allocs;
    allocs = a;
    *out = dev;
    return CUDA_SUCCESS;
}
/* Under G. The range stays reserved (PROT_NONE) so a late use is caught. */
static void device_release(struct alloc *a) {
    munmap(a->shadow, a->map);
    mmap((void *)a->base, a->map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    a->shadow = NULL;
    a->kind = M_FREED;
}
/* Under G: memory is freed after the device finished with it (cuMemFree
   synchronises implicitly). */
static void drain_all(void) {
    for (struct CUstream_st *s = streams; s; s = s->next_all) {
        unsigned long long target = s->enq_seq; /* what was enqueued before the call */
        wait_seq(s, target);
    }
}

EXPORT CUresult simcu_alloc(void **p, size_t bytes, int tag) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (!p || !bytes) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    CUresult r = device_alloc(p, bytes, tag);
    pthread_mutex_unlock(&G);
    RET(r);
}
/* NCCL's own device memory for a connection, allocated on the calling
   thread: a potentially unsafe call under that thread's capture interaction
   mode, exactly as cuMemAlloc (refused, and the capture it disturbs
   invalidated). Released with its comm, without waiting for streams. */
EXPORT CUresult simcu_conn_alloc(void **p, size_t bytes, int device) {
    if (tl_in_hostfn) RET(CUDA_ERROR_NOT_PERMITTED); /* NCCL initialised the driver itself */
    if (!p || !bytes || device < 0 || device >= g_ndev) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    CUresult r = unsafe_during_capture();
    if (r == CUDA_SUCCESS) r = device_alloc_on(p, bytes, SIM_TAG_CONN, device);
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT void simcu_conn_free(void *p) {
    pthread_mutex_lock(&G);
    struct alloc *a = find_base((uintptr_t)p, M_DEVICE);
    if (a && a->tag == SIM_TAG_CONN) device_release(a);
    pthread_mutex_unlock(&G);
}
EXPORT CUresult simcu_free(void *p, int tag) {
    ENTER();
    pthread_mutex_lock(&G);
    struct alloc *a = find_base((uintptr_t)p, M_DEVICE);
    CUresult r = CUDA_SUCCESS;
    if (!a || a->tag != tag) r = CUDA_ERROR_INVALID_VALUE;
    else if ((r = unsafe_during_capture()) == CUDA_SUCCESS) {
        drain_all();
        device_release(a);
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (!dptr || !bytes) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    void *p = NULL;
    CUresult r = unsafe_during_capture();
    if (r == CUDA_SUCCESS) r = device_alloc(&p, bytes, 0);
    pthread_mutex_unlock(&G);
    if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)(uintptr_t)p;
    RET(r);
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr d) {
    if (d == 0) { ENTER(); return CUDA_SUCCESS; }
    return simcu_free((void *)(uintptr_t)d, 0);
}
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (!pp || !bytes || (flags & ~7u)) RET(CUDA_ERROR_INVALID_VALUE);
    void *p = aligned_alloc(4096, page_round(bytes));
    if (!p) RET(CUDA_ERROR_OUT_OF_MEMORY);
    struct alloc *a = calloc(1, sizeof *a);
    a->base = (uintptr_t)p, a->size = bytes, a->map = page_round(bytes), a->kind = M_HOSTALLOC;
    pthread_mutex_lock(&G);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&G);
    *pp = p;
    return CUDA_SUCCESS;
}
/* Under G: unlinks a record. */
static void unlink_alloc(struct alloc *a) {
    for (struct alloc **pp = &allocs; *pp; pp = &(*pp)->next)
        if (*pp == a) { *pp = a->next; return; }
}
EXPORT CUresult cuMemFreeHost(void *p) {
    ENTER();
    pthread_mutex_lock(&G);
    struct alloc *a = find_base((uintptr_t)p, M_HOSTALLOC);
    CUresult r = a ? unsafe_during_capture() : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        drain_all();
        unlink_alloc(a);
    }
    pthread_mutex_unlock(&G);
    if (r == CUDA_SUCCESS) {
        free(p);
        free(a);
    }
    RET(r);
}
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags) {
    ENTER();
    if (!current()) RET(CUDA_ERROR_INVALID_CONTEXT);
    if (!p || !bytes || (flags & ~15u)) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    CUresult r = CUDA_SUCCESS;
    for (struct alloc *a = allocs; a; a = a->next)
        if (a->kind != M_FREED && (uintptr_t)p < a->base + a->size && a->base < (uintptr_t)p + bytes)
            r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (r == CUDA_SUCCESS) {
        struct alloc *a = calloc(1, sizeof *a);
        a->base = (uintptr_t)p, a->size = bytes, a->kind = M_HOSTREG;
        a->next = allocs;
        allocs = a;
    }
    pthread_mutex_unlock(&G);
    RET(r);
}
EXPORT CUresult cuMemHostUnregister(void *p) {
    ENTER();
    pthread_mutex_lock(&G);
    struct alloc *a = find_base((uintptr_t)p, M_HOSTREG);
    if (a) {
        drain_all();
        unlink_alloc(a);
    }
    pthread_mutex_unlock(&G);
    free(a);
    RET(a ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr) {
    ENTER();
    if (!data) RET(CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&G);
    struct alloc *a = find((uintptr_t)ptr);
    if (a && a->kind == M_FREED) a = NULL;
    CUresult r = CUDA_SUCCESS;
    if (!a) r = CUDA_ERROR_INVALID_VALUE; /* memory CUDA never saw */
    else switch (attr) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned *)data = a->kind == M_DEVICE ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a->device; break;
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = &primaries[a->device]; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            if (a->kind == M_DEVICE) r = CUDA_ERROR_INVALID_VALUE;
            else *(void **)data = (void *)(uintptr_t)ptr;
            break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    pthread_mutex_unlock(&G);
    RET(r);
}

/* Under G. */
static int kind_of(const void *addr) {
    struct alloc *a = find((uintptr_t)addr);
    if (!a || a->kind == M_FREED) return a ? -1 : 0;
    return a->kind == M_DEVICE ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
}
EXPORT int simcu_pointer_device(const void *addr) {
    pthread_mutex_lock(&G);
    struct alloc *a = find((uintptr_t)addr);
    int d = a && a->kind == M_DEVICE ? a->device : -1;
    pthread_mutex_unlock(&G);
    return d;
}
EXPORT int simcu_stream_device(CUstream h) {
    pthread_mutex_lock(&G);
    struct CUstream_st *s = h ? h : NULL;
    int d = -1;
    for (struct CUstream_st *k = streams; k && s; k = k->next_all)
        if (k == s && k->magic == MAGIC_STREAM && !k->legacy) d = k->device;
    pthread_mutex_unlock(&G);
    return d;
}
EXPORT int simcu_memory_kind(const void *addr) {
    pthread_mutex_lock(&G);
    int k = kind_of(addr);
    pthread_mutex_unlock(&G);
    return k < 0 ? 0 : k;
}

/* Under G: device view of a range, or NULL; `host_ok` accepts memory CUDA
   does not know (pageable host memory, for copies). */
static char *view(uintptr_t p, size_t n, int host_ok) {
    static char empty;
    if (n == 0) return &empty;
    struct alloc *a = find(p);
    if (!a) {
        /* pageable memory must not overlap anything the driver owns */
        for (struct alloc *b = allocs; b; b = b->next)
            if (p < b->base + b->map && b->base < p + n) return NULL;
        return host_ok ? (char *)p : NULL;
    }
    if (a->kind == M_FREED || p + n > a->base + a->size) return NULL;
    return a->kind == M_DEVICE ? a->shadow + (p - a->base) : (char *)p;
}
EXPORT void *simcu_device_view(const void *addr, size_t bytes) {
    pthread_mutex_lock(&G);
    void *v = view((uintptr_t)addr, bytes, 0);
    pthread_mutex_unlock(&G);
    return v;
}

struct copy {
    uintptr_t dst, src;
    size_t n;
    char *staged; /* pageable source copied at issue time */
    int set;
    unsigned char value;
};
static void do_copy(void *p) {
    struct copy *c = p;
    pthread_mutex_lock(&G);
    char *d = view(c->dst, c->n, 1);
    char *s = c->set || c->staged ? NULL : view(c->src, c->n, 1);
    pthread_mutex_unlock(&G);
    if (!d || (!c->set && !c->staged && !s)) {
        simcu_fault("copy of %zu bytes from %p to %p: an address is not valid (freed, out of range, or partly device memory)",
                    c->n, (void *)c->src, (void *)c->dst);
        return;
    }
    if (c->set) memset(d, c->value, c->n);
    else memmove(d, c->staged ? c->staged : s, c->n);
}
static void free_copy(void *p) {
    struct copy *c = p;
    free(c->staged);
    free(c);
}

/* Enqueues a copy on `h`. `sync`: return once it completed, except that a
   pageable source going to the device is staged and not waited for (as the
   documented synchronisation rules of cuMemcpy allow). */
static CUresult copy(uintptr_t dst, uintptr_t src, size_t n, CUstream h, int sync, int set, unsigned char value) {
    ENTER();
    if (n == 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&G);
    struct CUstream_st *s = stream_of(h);
    CUresult r = CUDA_SUCCESS;
    if (!s) r = CUDA_ERROR_INVALID_HANDLE;
    else if (s->legacy && !current()) r = CUDA_ERROR_INVALID_CONTEXT;
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&G);
        RET(r);
    }
    int dk = kind_of((void *)dst), sk = set ? CU_MEMORYTYPE_DEVICE : kind_of((void *)src);
    if (dk < 0 || sk < 0 || !view(dst, n, 1) || (!set && !view(src, n, 1))) r = CUDA_ERROR_INVALID_VALUE;
    else if (s->cap_status && (dk == 0 || sk == 0)) {
        invalidate(s); /* graphs cannot hold copies of pageable memory */
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&G);
        RET(r);
    }
    struct copy *c = calloc(1, sizeof *c);
    c->dst = dst, c->src = src, c->n = n, c->set = set, c->value = value;
    int staged = !set && sk == 0 && dk == CU_MEMORYTYPE_DEVICE;
    if (staged) {
        c->staged = malloc(n);
        memcpy(c->staged, (void *)src, n);
    }
    /* copies to pageable memory are synchronous even when "async" */
    int wait = (sync && !staged && !(set && dk == CU_MEMORYTYPE_DEVICE)) || (!set && dk == 0 && sk != 0);
    r = enqueue(s, (struct node){do_copy, c, free_copy});
    if (r == CUDA_SUCCESS && wait && !s->cap_status) {
        if ((r = unsafe_during_capture()) == CUDA_SUCCESS) {
            wait_seq(s, s->enq_seq);
            r = g_sticky;
        }
    }
    pthread_mutex_unlock(&G);
    RET(r);
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char uc, size_t n) { return copy(d, 0, n, NULL, 1, 1, uc); }
EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(dst, src, n, NULL, 1, 0, 0); }
EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return copy(dst, src, n, s, 0, 0, 0); }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    return copy(dst, (uintptr_t)src, n, NULL, 1, 0, 0);
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return copy((uintptr_t)dst, src, n, NULL, 1, 0, 0); }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(dst, src, n, NULL, 0, 0, 0); }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return copy(dst, (uintptr_t)src, n, s, 0, 0, 0);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy((uintptr_t)dst, src, n, s, 0, 0, 0);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return copy(dst, src, n, s, 0, 0, 0);
}
