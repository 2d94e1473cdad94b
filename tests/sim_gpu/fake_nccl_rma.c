/* TEST DOUBLE, part of fake_nccl.c (included at its end): windows and the
   host-side one-sided API of NCCL 2.29 (ncclCommWindowRegister 2.27+,
   ncclPutSignal / ncclSignal / ncclWaitSignal 2.29+), written for this
   project from the documented prototypes in nccl.h. What it models:
   - ncclCommWindowRegister is collective: every rank exchanges its window's
     size and flags with the others (so a put past the end of the target's
     window is refused at the origin, as a real one would fault); windows
     are matched across ranks by registration order on the comm;
   - one-sided traffic moves through the job directory as messages on
     channel 'r' (one file per put or signal, in order per pair of ranks);
     each rank with a window runs a service thread that applies arriving
     puts to its window memory and then counts the signal, without any call
     by that rank: the target takes no part, as with real NCCL;
   - every ncclPutSignal raises one signal at its target (sigIdx 0, ctx 0:
     the only values NCCL 2.29 accepts, as are flags 0), ncclSignal raises
     one without data, and ncclWaitSignal waits until the count from each
     described peer reached what earlier waits consumed plus opCnt, then
     consumes it: counts are per comm and per peer, not per window;
   - the source of a put must lie inside a window of this comm registered
     with NCCL_WIN_COLL_SYMMETRIC (NCCL 2.29 refuses others:
     "srcWinHost is not in a valid symmetric window");
   - puts, signals and waits are stream work in stream order (they run on
     the copy engine in NCCL, so they do not hold the device's one kernel
     slot); a put reads its source when it runs and is complete at the
     origin once sent;
   - ncclCommWindowDeregister is collective: it returns once every peer's
     puts issued before its own deregistration were applied here. */
#if HAS(22700)

#define WIN_MAGIC 0x57494e44u
#define NCCL_WIN_COLL_SYMMETRIC 0x01
enum { RMA_PUT = 1, RMA_SIGNAL = 2, RMA_FENCE = 3 };

struct simwin {
    unsigned magic;
    ncclComm_t comm;
    int index, flags, live;
    char *buf;
    size_t size;
    size_t *sizes; /* every rank's window size */
    struct simwin *next;
};

/* A comm's one-sided state, under M. */
struct rma {
    struct simwin *wins;
    int registered, service;
    unsigned long *send_seq, *recv_seq; /* channel 'r' */
    unsigned long *arrived, *consumed;  /* signals per peer */
    unsigned long *fences;              /* deregistrations seen per peer */
    unsigned long deregistered;
};

static struct rma *rma_of(ncclComm_t c) {
    if (!c->rma) {
        size_t n = (size_t)c->nranks;
        struct rma *r = calloc(1, sizeof *r);
        r->send_seq = calloc(n, sizeof(unsigned long)), r->recv_seq = calloc(n, sizeof(unsigned long));
        r->arrived = calloc(n, sizeof(unsigned long)), r->consumed = calloc(n, sizeof(unsigned long));
        r->fences = calloc(n, sizeof(unsigned long));
        c->rma = r;
    }
    return c->rma;
}

/* Under M: the live window `index` of the comm, or NULL. */
static struct simwin *win_at(ncclComm_t c, int index) {
    for (struct simwin *w = c->rma ? c->rma->wins : NULL; w; w = w->next)
        if (w->index == index && w->live) return w;
    return NULL;
}

/* Applies one arriving message from `src` (service thread, without M). */
static void rma_apply(ncclComm_t c, int src, const struct msghdr *h, const char *data) {
    pthread_mutex_lock(&M);
    struct rma *r = c->rma;
    if (h->kind == RMA_FENCE) {
        r->fences[src]++;
    } else {
        if (h->kind == RMA_PUT) {
            struct simwin *w = win_at(c, h->root);
            char *dst = w && h->count + h->bytes <= w->size ? simcu_device_view(w->buf + h->count, h->bytes) : NULL;
            if (dst) memcpy(dst, data, h->bytes);
            else
                simcu_fault("ncclPutSignal from rank %d: %llu bytes at offset %llu of window %d, which rank %d does not have", src,
                            (unsigned long long)h->bytes, (unsigned long long)h->count, h->root, c->rank);
        }
        r->arrived[src]++;
    }
    pthread_cond_broadcast(&MC);
    pthread_mutex_unlock(&M);
}

/* The target's side: applies puts and counts signals as they arrive, in
   order per peer, until the comm is destroyed or aborted. */
static void *rma_service(void *arg) {
    ncclComm_t c = arg;
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    for (;;) {
        pthread_mutex_lock(&M);
        int state = c->state;
        size_t need = 0;
        for (struct simwin *w = c->rma->wins; w; w = w->next) need = w->size > need ? w->size : need;
        pthread_mutex_unlock(&M);
        if (state != LIVE && state != FINALIZED) break;
        if (need > cap) buf = realloc(buf, cap = need);
        int any = 0;
        for (int q = 0; q < c->nranks; q++) {
            if (q == c->rank) continue;
            struct msghdr h;
            if (msg_get(c, 'r', q, c->rma->recv_seq[q], &h, buf, cap, 0) != 0) continue;
            c->rma->recv_seq[q]++;
            rma_apply(c, q, &h, buf);
            any = 1;
        }
        if (!any) sleep_us(200);
    }
    free(buf);
    return NULL;
}

/* One put or signal, run on the stream. */
struct rma_op {
    ncclComm_t comm;
    int kind, peer, win;
    const void *src;
    size_t offset, bytes;
};

static void rma_send(void *p) {
    struct rma_op *o = p;
    ncclComm_t c = o->comm;
    pthread_mutex_lock(&M);
    int state = c->state;
    unsigned long seq = state == LIVE || state == FINALIZED ? c->rma->send_seq[o->peer]++ : 0;
    pthread_mutex_unlock(&M);
    if (state != LIVE && state != FINALIZED) return; /* an aborted comm's work stops */
    struct msghdr h = {MSG_MAGIC, o->kind, 0, 0, o->win, 0, o->offset, o->bytes};
    const void *data = o->bytes ? simcu_device_view(o->src, o->bytes) : "";
    if (!data) {
        simcu_fault("ncclPutSignal: source %p (%zu bytes) was freed before the put ran", o->src, o->bytes);
        return;
    }
    if (o->peer == c->rank) {
        rma_apply(c, c->rank, &h, data);
        return;
    }
    if (msg_put(c, 'r', o->peer, seq, &h, data) != 0) simcu_fault("ncclPutSignal: cannot write to %s", c->dir);
}

__attribute__((unused)) static ncclResult_t rma_launch(struct rma_op *o, CUstream stream, const char *fn) {
    struct rma_op *k = malloc(sizeof *k);
    *k = *o;
    CUresult r = simcu_launch(stream, rma_send, k, free);
    return r == CUDA_SUCCESS ? ncclSuccess : fail(ncclUnhandledCudaError, "%s: stream work failed to launch: CUDA error %d", fn, (int)r);
}

/* Sends one control record on channel 'r' from the calling thread. */
static int rma_control(ncclComm_t c, int kind, int peer, int win, uint64_t value) {
    pthread_mutex_lock(&M);
    unsigned long seq = c->rma->send_seq[peer]++;
    pthread_mutex_unlock(&M);
    struct msghdr h = {MSG_MAGIC, kind, 0, 0, win, 0, value, 0};
    return msg_put(c, 'r', peer, seq, &h, "");
}

/* The collective exchange of window sizes and flags (control channel). */
static ncclResult_t win_exchange(ncclComm_t c, struct simwin *w, const char *fn) {
    uint64_t mine[2] = {w->size, (uint64_t)w->flags};
    for (int q = 0; q < c->nranks; q++) {
        if (q == c->rank) continue;
        struct msghdr h = {MSG_MAGIC, 100, 0, 0, w->index, 0, 0, sizeof mine};
        if (msg_put(c, 'c', q, c->csend_seq[q]++, &h, mine) != 0) return fail(ncclSystemError, "%s: cannot write to %s", fn, c->dir);
    }
    long timeout = env_long("TC_SIM_NCCL_INIT_TIMEOUT_MS", 60000);
    for (int q = 0; q < c->nranks; q++) {
        if (q == c->rank) continue;
        uint64_t theirs[2];
        struct msghdr h;
        int rc = msg_get(c, 'c', q, c->crecv_seq[q]++, &h, theirs, sizeof theirs, timeout);
        if (rc == 2) return fail(ncclSystemError, "%s: rank %d did not register its window within %ld ms", fn, q, timeout);
        if (rc != 0 || h.kind != 100 || h.root != w->index)
            return fail(ncclInvalidUsage, "%s: rank %d answered with another call (window registrations in different orders?)", fn, q);
        w->sizes[q] = theirs[0];
    }
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, void **win, int winFlags) {
    const char *fn = "ncclCommWindowRegister";
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) return r;
    if (!win) r = fail(ncclInvalidArgument, "%s: win is NULL", fn);
    else if (!buff || size == 0) r = fail(ncclInvalidArgument, "%s: invalid pointer %p / size %zu", fn, buff, size);
    else if ((r = check_buffer(comm, buff, size, fn, "buff")) == ncclSuccess && simcu_memory_kind(buff) != CU_MEMORYTYPE_DEVICE)
        r = fail(ncclInvalidArgument, "%s: %p is host memory; a window needs device memory", fn, buff);
    struct simwin *w = NULL;
    if (r == ncclSuccess) {
        pthread_mutex_lock(&M);
        struct rma *m = rma_of(comm);
        w = calloc(1, sizeof *w);
        w->magic = WIN_MAGIC, w->comm = comm, w->index = m->registered++, w->flags = winFlags;
        w->buf = buff, w->size = size, w->live = 1;
        w->sizes = calloc((size_t)comm->nranks, sizeof(size_t));
        w->sizes[comm->rank] = size;
        int start = !m->service && comm->nranks > 1;
        m->service |= start;
        pthread_mutex_unlock(&M);
        r = comm->nranks > 1 ? win_exchange(comm, w, fn) : ncclSuccess;
        pthread_t t;
        if (start && pthread_create(&t, NULL, rma_service, comm) == 0) pthread_detach(t);
    }
    pthread_mutex_lock(&M);
    if (w && r == ncclSuccess) {
        w->next = comm->rma->wins;
        comm->rma->wins = w;
        *win = w;
    } else if (w) {
        free(w->sizes), free(w);
    }
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}

EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, void *win) {
    const char *fn = "ncclCommWindowDeregister";
    ncclResult_t r = enter(comm, fn, 1);
    if (r != ncclSuccess) return r;
    pthread_mutex_lock(&M);
    struct simwin *w = comm->rma ? comm->rma->wins : NULL;
    while (w && w != win) w = w->next;
    if (!w || w->magic != WIN_MAGIC || !w->live) r = fail(ncclInvalidArgument, "%s: %p is not a live window of this comm", fn, win);
    unsigned long round = r == ncclSuccess ? ++comm->rma->deregistered : 0;
    pthread_mutex_unlock(&M);
    /* every peer's earlier puts land here before the window goes */
    for (int q = 0; r == ncclSuccess && q < comm->nranks; q++)
        if (q != comm->rank && rma_control(comm, RMA_FENCE, q, w->index, 0) != 0) r = fail(ncclSystemError, "%s: cannot write", fn);
    long timeout = env_long("TC_SIM_NCCL_INIT_TIMEOUT_MS", 60000);
    double until = now_ms() + (double)timeout;
    pthread_mutex_lock(&M);
    for (int q = 0; r == ncclSuccess && q < comm->nranks; q++) {
        while (q != comm->rank && comm->rma->fences[q] < round && (comm->state == LIVE || comm->state == FINALIZED)) {
            if (now_ms() > until) {
                r = fail(ncclSystemError, "%s: rank %d did not deregister within %ld ms", fn, q, timeout);
                break;
            }
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 2000000;
            if (t.tv_nsec >= 1000000000) t.tv_sec++, t.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&MC, &M, &t);
        }
    }
    if (r == ncclSuccess) w->live = 0;
    comm->busy = 0;
    pthread_mutex_unlock(&M);
    return r;
}
#endif

#if HAS(22900)
static ncclResult_t rma_common(ncclComm_t comm, int peer, int sigIdx, int ctx, unsigned flags, const char *fn) {
    if (peer < 0 || peer >= comm->nranks) return fail(ncclInvalidArgument, "%s: peer %d is not a rank of the comm", fn, peer);
    if (ctx != 0) return fail(ncclInvalidArgument, "%s: Context %d is invalid (must be 0)", fn, ctx);
    if (sigIdx != 0) return fail(ncclInvalidArgument, "%s: Signal index %d is invalid (must be 0)", fn, sigIdx);
    if (flags != 0) return fail(ncclInvalidArgument, "%s: Flags %u is invalid (must be 0)", fn, flags);
    return ncclSuccess;
}

/* Under M: whether [p, p + bytes) lies inside a live symmetric window. */
static int in_symmetric_window(ncclComm_t c, const void *p, size_t bytes) {
    for (struct simwin *w = c->rma ? c->rma->wins : NULL; w; w = w->next)
        if (w->live && (w->flags & NCCL_WIN_COLL_SYMMETRIC) && (const char *)p >= w->buf && (const char *)p + bytes <= w->buf + w->size)
            return 1;
    return 0;
}

EXPORT ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer, void *peerWin,
                                  size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, CUstream stream) {
    const char *fn = "ncclPutSignal";
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) return r;
    r = rma_common(comm, peer, sigIdx, ctx, flags, fn);
    size_t bytes = datatype >= 0 && datatype < NUM_TYPES ? count * type_size(datatype) : 0;
    if (r == ncclSuccess && (datatype < 0 || datatype >= NUM_TYPES)) r = fail(ncclInvalidArgument, "%s: invalid data type %d", fn, datatype);
    pthread_mutex_lock(&M);
    struct simwin *w = comm->rma ? comm->rma->wins : NULL;
    while (w && w != peerWin) w = w->next;
    if (r != ncclSuccess) {
    } else if (!peerWin) {
        r = fail(ncclInvalidArgument, "%s: peerWin is NULL", fn);
    } else if (!w || w->magic != WIN_MAGIC || !w->live) {
        r = fail(ncclInvalidArgument, "%s: peerWin %p is not a live window of this comm", fn, peerWin);
    } else if (!localbuff) {
        r = fail(ncclInvalidArgument, "%s: srcBuff is NULL", fn);
    } else if (!in_symmetric_window(comm, localbuff, bytes)) {
        r = fail(ncclInvalidArgument, "%s: srcWinHost is not in a valid symmetric window (%p, %zu bytes)", fn, localbuff, bytes);
    } else if (peerWinOffset > w->sizes[peer] || bytes > w->sizes[peer] - peerWinOffset) {
        fprintf(stderr, "[sim-nccl] %s: %zu bytes at offset %zu pass the end of rank %d's window (%zu bytes)\n", fn, bytes,
                peerWinOffset, peer, w->sizes[peer]);
        r = fail(ncclInvalidArgument, "%s: %zu bytes at offset %zu pass the end of rank %d's window of %zu bytes (a fault)", fn,
                 bytes, peerWinOffset, peer, w->sizes[peer]);
    }
    int index = w ? w->index : -1;
    pthread_mutex_unlock(&M);
    if (r == ncclSuccess && !simcu_stream_valid(stream)) r = fail(ncclUnhandledCudaError, "%s: invalid stream", fn);
    if (r == ncclSuccess) {
        struct rma_op o = {comm, RMA_PUT, peer, index, localbuff, peerWinOffset, bytes};
        r = rma_launch(&o, stream, fn);
    }
    unbusy(comm);
    return r;
}

EXPORT ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, CUstream stream) {
    const char *fn = "ncclSignal";
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) return r;
    r = rma_common(comm, peer, sigIdx, ctx, flags, fn);
    pthread_mutex_lock(&M);
    if (r == ncclSuccess) rma_of(comm);
    pthread_mutex_unlock(&M);
    if (r == ncclSuccess) {
        struct rma_op o = {comm, RMA_SIGNAL, peer, -1, NULL, 0, 0};
        r = rma_launch(&o, stream, fn);
    }
    unbusy(comm);
    return r;
}

typedef struct {
    int opCnt, peer, sigIdx, ctx;
} sim_wait_desc;
struct rma_wait {
    ncclComm_t comm;
    int n;
    sim_wait_desc d[];
};

static void rma_wait_run(void *p) {
    struct rma_wait *k = p;
    ncclComm_t c = k->comm;
    pthread_mutex_lock(&M);
    for (int i = 0; i < k->n; i++) {
        int q = k->d[i].peer;
        unsigned long want = c->rma->consumed[q] + (unsigned long)k->d[i].opCnt;
        while (c->rma->arrived[q] < want && (c->state == LIVE || c->state == FINALIZED)) pthread_cond_wait(&MC, &M);
        if (c->state != LIVE && c->state != FINALIZED) break; /* ncclCommAbort ends the wait */
        c->rma->consumed[q] = want;
    }
    pthread_mutex_unlock(&M);
}

EXPORT ncclResult_t ncclWaitSignal(int nDesc, sim_wait_desc *descs, ncclComm_t comm, CUstream stream) {
    const char *fn = "ncclWaitSignal";
    ncclResult_t r = enter(comm, fn, 0);
    if (r != ncclSuccess) return r;
    if (!descs || nDesc <= 0) r = fail(ncclInvalidArgument, "%s: invalid arguments", fn);
    for (int i = 0; r == ncclSuccess && i < nDesc; i++) {
        if (descs[i].opCnt <= 0) r = fail(ncclInvalidArgument, "%s: descriptor %d has invalid opCnt %d", fn, i, descs[i].opCnt);
        else r = rma_common(comm, descs[i].peer, descs[i].sigIdx, descs[i].ctx, 0, fn);
    }
    if (r == ncclSuccess) {
        pthread_mutex_lock(&M);
        rma_of(comm);
        pthread_mutex_unlock(&M);
        struct rma_wait *k = malloc(sizeof *k + (size_t)nDesc * sizeof *descs);
        k->comm = comm, k->n = nDesc;
        memcpy(k->d, descs, (size_t)nDesc * sizeof *descs);
        CUresult cr = simcu_launch(stream, rma_wait_run, k, free);
        if (cr != CUDA_SUCCESS) r = fail(ncclUnhandledCudaError, "%s: stream work failed to launch: CUDA error %d", fn, (int)cr);
    }
    unbusy(comm);
    return r;
}
#endif
