/* Operation hooks and the NaN check (TORCHCOMM_NAN_CHECK=1) from C, with
   real processes: 2, 3 and 4 ranks forked over a FileStore.
   - hooks: pre and post hooks see every operation (collectives, a p2p
     batch, an uneven all_gather_v, an async broadcast, polled to its end,
     whose post hook runs on the progress thread, the broadcasts of
     tc_broadcast_coalesced) with the right fields in order; removal stops them; a hook cannot issue operations or
     register hooks, but may query the comm;
   - NaN check: a NaN at a given index on a given rank (f32, f16, bf16)
     fails the collective on every rank (TC_ERR_INVALID_ARGUMENT on the
     rank with the NaN, TC_ERR_REMOTE elsewhere) with nothing exchanged,
     post hooks get that status, clean data (and f16 infinities, integer
     data, a broadcast's non-root buffer) passes, and the comm stays usable.
   - windows: put, get, signal and wait_signal through the hooks (2 and 3
     ranks, see window_rank).
   The one-rank part also runs under valgrind. */
#include "capi_util.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/wait.h>

#define MAX_EVENTS 64

typedef struct {
    int phase;
    char op[32];
    uint64_t seq;
    int dtype, root, peer, red_kind, async_op, status, completed;
    size_t num_inputs, num_outputs;
    void *in_ptr, *out_ptr;
    size_t in_count, out_count;
    int in_peer, out_peer;
    uint32_t tag, in_tag, out_tag; /* in_tag / out_tag: 999 when NULL */
    size_t window_offset;
    char message[256];
    pthread_t thread;
} event_t;

typedef struct {
    pthread_mutex_t lock;
    event_t events[MAX_EVENTS];
    int n;
    tc_comm_t *comm; /* for the reentry checks */
    int reentry;     /* 1: the pre hook tries to call into the comm */
    tc_result_t reentry_op_rc, reentry_add_rc, reentry_query_rc;
    tc_window_t *win; /* win_reentry: the pre hook tries a window call */
    int win_reentry;
    tc_result_t reentry_win_rc;
} log_t;

static void record(const tc_op_info_t *info, void *user_data) {
    log_t *log = user_data;
    pthread_mutex_lock(&log->lock);
    if (log->n < MAX_EVENTS && info->struct_size >= sizeof(tc_op_info_t) &&
        info->version == TC_OP_INFO_VERSION) {
        event_t *e = &log->events[log->n++];
        memset(e, 0, sizeof *e);
        e->phase = info->phase;
        snprintf(e->op, sizeof e->op, "%s", info->op_name);
        e->seq = info->seq;
        e->dtype = info->dtype;
        e->root = info->root;
        e->peer = info->peer;
        e->red_kind = info->reduce_op.kind;
        e->async_op = info->async_op;
        e->status = info->status;
        e->completed = info->completed;
        e->num_inputs = info->num_inputs;
        e->num_outputs = info->num_outputs;
        if (info->num_inputs) {
            e->in_ptr = info->inputs[0].ptr;
            e->in_count = info->inputs[0].count;
            e->in_peer = info->inputs[0].peer;
        }
        if (info->num_outputs) {
            e->out_ptr = info->outputs[0].ptr;
            e->out_count = info->outputs[0].count;
            e->out_peer = info->outputs[0].peer;
        }
        e->tag = info->tag;
        e->window_offset = info->window_offset;
        e->in_tag = info->input_tags ? info->input_tags[0] : 999;
        e->out_tag = info->output_tags ? info->output_tags[0] : 999;
        if (info->message) snprintf(e->message, sizeof e->message, "%s", info->message);
        e->thread = pthread_self();
    }
    pthread_mutex_unlock(&log->lock);
    if (log->win_reentry && info->phase == TC_HOOK_PRE) {
        log->reentry_win_rc = tc_window_signal(log->win, 0, NULL, NULL);
        log->win_reentry = 0;
    }
    if (log->reentry && info->phase == TC_HOOK_PRE) {
        float x = 1;
        int rank = -1;
        log->reentry_op_rc = tc_all_reduce(log->comm, &x, 1, TC_FLOAT32, (tc_reduce_op_t)TC_REDUCE_OP(TC_SUM), NULL, NULL);
        log->reentry_add_rc = tc_comm_add_pre_hook(log->comm, record, log, NULL);
        log->reentry_query_rc = tc_comm_get_rank(log->comm, &rank);
        log->reentry = 0;
    }
}

static tc_comm_t *make_comm(const char *name, const char *path, int rank, int size) {
    tc_store_t *store = NULL;
    EXPECT_OK(tc_store_file_new(path, size, &store));
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = name;
    o.rank = rank;
    o.world_size = size;
    o.store = store;
    o.abort_on_error = 0;
    o.timeout_ms = 60000;
    tc_comm_t *comm = NULL;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &comm));
    tc_store_free(store);
    return comm;
}

/* Events i (pre) and i + 1 (post) describe one operation `op`. */
static void expect_pair(const log_t *log, int i, const char *op, uint64_t seq) {
    CHECK(log->n > i + 1);
    if (log->n <= i + 1) return;
    const event_t *pre = &log->events[i], *post = &log->events[i + 1];
    if (strcmp(pre->op, op) != 0 || strcmp(post->op, op) != 0 || pre->phase != TC_HOOK_PRE ||
        post->phase != TC_HOOK_POST || pre->seq != seq || post->seq != seq) {
        fprintf(stderr, "event %d: expected %s seq %llu pre+post, got %s/%d seq %llu, %s/%d seq %llu\n",
                i, op, (unsigned long long)seq, pre->op, pre->phase, (unsigned long long)pre->seq,
                post->op, post->phase, (unsigned long long)post->seq);
        capi_failures++;
    }
}

/* Waits for `w` by polling (tc_work_is_completed runs nothing itself). */
static void wait_polling(const tc_work_t *w) {
    int done = 0;
    while (tc_work_is_completed(w, &done) == TC_SUCCESS && !done) sched_yield();
}

static int hooks_rank(const char *path, int rank, int size) {
    tc_comm_t *comm = make_comm("hooks", path, rank, size);
    if (comm == NULL) return 1;
    static log_t pre, post;
    pthread_mutex_init(&pre.lock, NULL);
    pthread_mutex_init(&post.lock, NULL);
    uint64_t pre_id = 0, post_id = 0;
    EXPECT_OK(tc_comm_add_pre_hook(comm, record, &pre, &pre_id));
    EXPECT_OK(tc_comm_add_post_hook(comm, record, &post, &post_id));
    CHECK(pre_id != 0 && post_id != 0 && pre_id != post_id);

    /* 1: blocking all_reduce, f32, 5 elements, in place. */
    float x[5] = {1, 2, 3, 4, (float)rank};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    EXPECT_OK(tc_all_reduce(comm, x, 5, TC_FLOAT32, sum, NULL, NULL));
    CHECK(x[0] == (float)size && x[4] == (float)(size * (size - 1) / 2));
    /* 2: async broadcast from root 1 of 3 int32. */
    int32_t b[3] = {rank, rank, rank};
    tc_op_options_t async = TC_OP_OPTIONS_INIT;
    async.async_op = 1;
    tc_work_t *w = NULL;
    EXPECT_OK(tc_broadcast(comm, b, 3, TC_INT32, 1, &async, &w));
    /* Polled, not waited for: a thread in tc_work_wait may run a queued
       operation itself, which would put its hook on this thread. */
    wait_polling(w);
    EXPECT_OK(tc_work_wait(w, NULL));
    /* The post hook ran before the work reported completion. */
    pthread_mutex_lock(&post.lock);
    int posts_after_wait = post.n;
    pthread_mutex_unlock(&post.lock);
    CHECK(posts_after_wait == 2);
    tc_work_free(w);
    CHECK(b[2] == 1);
    /* 3: a ring of send + recv in one batch, tagged 10 + the sender. */
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    double out_d = rank, in_d = -1;
    tc_batch_t *batch = NULL;
    EXPECT_OK(tc_batch_begin(comm, &batch));
    EXPECT_OK(tc_batch_send_tagged(batch, &out_d, 1, TC_FLOAT64, next, 10 + (uint32_t)rank));
    EXPECT_OK(tc_batch_recv_tagged(batch, &in_d, 1, TC_FLOAT64, prev, 10 + (uint32_t)prev));
    EXPECT_OK(tc_batch_issue(batch, NULL, NULL));
    tc_batch_free(batch);
    CHECK(in_d == (double)prev);
    /* 4: uneven all_gather_v: rank r contributes r + 1 elements. */
    size_t counts[4] = {1, 2, 3, 4}, total = 0;
    for (int r = 0; r < size; r++) total += counts[r];
    int64_t mine[4] = {rank, rank, rank, rank}, all[10] = {0};
    EXPECT_OK(tc_all_gather_v(comm, all, counts, mine, TC_INT64, NULL, NULL));
    CHECK(all[total - 1] == size - 1);
    /* 5: a pre hook that calls into the comm from inside. */
    pre.comm = comm;
    pre.reentry = 1;
    EXPECT_OK(tc_barrier(comm, NULL, NULL));
    CHECK(pre.reentry_op_rc == TC_ERR_INVALID_USAGE);
    CHECK(pre.reentry_add_rc == TC_ERR_INVALID_USAGE);
    CHECK(pre.reentry_query_rc == TC_SUCCESS);

    /* Check the log: pre and post logs interleaved per operation. */
    CHECK(pre.n == 5 && post.n == 5);
    log_t both = {.n = 0};
    for (int i = 0; i < 5 && i < pre.n && i < post.n; i++) {
        both.events[both.n++] = pre.events[i];
        both.events[both.n++] = post.events[i];
    }
    uint64_t s0 = pre.events[0].seq;
    const char *names[5] = {"all_reduce", "broadcast", "batch_p2p", "all_gather_v", "barrier"};
    for (int i = 0; i < 5; i++) expect_pair(&both, 2 * i, names[i], s0 + (uint64_t)i);
    const event_t *ar = &pre.events[0], *ar_post = &post.events[0];
    CHECK(ar->dtype == TC_FLOAT32 && ar->red_kind == TC_SUM && ar->root == -1 && ar->peer == -1);
    CHECK(ar->num_inputs == 1 && ar->num_outputs == 1 && ar->in_ptr == (void *)x && ar->in_count == 5);
    CHECK(ar->async_op == 0 && ar_post->status == TC_SUCCESS && ar_post->completed == 1);
    CHECK(pthread_equal(ar_post->thread, pthread_self()));
    const event_t *bc = &pre.events[1], *bc_post = &post.events[1];
    CHECK(bc->dtype == TC_INT32 && bc->root == 1 && bc->async_op == 1 && bc->in_count == 3 && bc->red_kind == -1);
    /* An async host operation completes on the comm's progress thread. */
    CHECK(!pthread_equal(bc_post->thread, pthread_self()) && bc_post->completed == 1);
    const event_t *bp = &pre.events[2];
    CHECK(bp->dtype == TC_FLOAT64 && bp->num_inputs == 1 && bp->num_outputs == 1);
    CHECK(bp->in_ptr == (void *)&out_d && bp->in_peer == next && bp->out_ptr == (void *)&in_d && bp->out_peer == prev);
    CHECK(bp->tag == 0 && bp->in_tag == 10 + (uint32_t)rank && bp->out_tag == 10 + (uint32_t)prev);
    CHECK(ar->tag == 0 && ar->in_tag == 999 && ar->out_tag == 999); /* a collective has no tags */
    const event_t *agv = &pre.events[3];
    CHECK(agv->in_count == counts[rank] && agv->out_count == total && agv->out_ptr == (void *)all);
    CHECK(pre.events[4].dtype == -1 && pre.events[4].num_inputs == 0);
    /* Every rank numbered the collectives alike. */
    uint64_t seqs[4] = {0};
    /* (this all_gather is operation 6; the hooks see it too) */
    EXPECT_OK(tc_all_gather_single(comm, seqs, &s0, 1, TC_UINT64, NULL, NULL));
    for (int r = 0; r < size; r++) CHECK(seqs[r] == s0);
    /* 7, 8: a tagged send (async) and its ring's tagged recv; the hooks see
       each one's tag (20 + the sender). */
    tc_op_options_t tagged = TC_OP_OPTIONS_INIT;
    tagged.async_op = 1;
    tagged.tag = 20 + (uint32_t)rank;
    float sent = (float)rank, got = -1;
    tc_work_t *sw = NULL;
    EXPECT_OK(tc_send(comm, &sent, 1, TC_FLOAT32, next, &tagged, &sw));
    tagged.async_op = 0;
    tagged.tag = 20 + (uint32_t)prev;
    EXPECT_OK(tc_recv(comm, &got, 1, TC_FLOAT32, prev, &tagged, NULL));
    EXPECT_OK(tc_work_wait(sw, NULL));
    tc_work_free(sw);
    CHECK(got == (float)prev && pre.n == 8);
    if (pre.n == 8) {
        const event_t *send = &pre.events[6], *recv = &pre.events[7];
        CHECK(strcmp(send->op, "send") == 0 && send->peer == next && send->tag == 20 + (uint32_t)rank);
        CHECK(send->in_tag == 20 + (uint32_t)rank && send->out_tag == 999 && send->in_ptr == (void *)&sent);
        CHECK(strcmp(recv->op, "recv") == 0 && recv->peer == prev && recv->tag == 20 + (uint32_t)prev);
        CHECK(recv->out_tag == 20 + (uint32_t)prev && recv->in_tag == 999);
    }

    /* Removal: pre hook gone, post still there; then both gone. */
    EXPECT_OK(tc_comm_remove_hook(comm, pre_id));
    EXPECT_RC(tc_comm_remove_hook(comm, pre_id), TC_ERR_NOT_FOUND, "no hook");
    int pre_before = pre.n, post_before = post.n;
    EXPECT_OK(tc_barrier(comm, NULL, NULL));
    CHECK(pre.n == pre_before && post.n == post_before + 1);
    EXPECT_OK(tc_comm_remove_hook(comm, post_id));
    EXPECT_OK(tc_barrier(comm, NULL, NULL));
    CHECK(post.n == post_before + 1);
    /* The coalesced API issues through the comm too: its broadcasts are seen. */
    static log_t coalesced;
    pthread_mutex_init(&coalesced.lock, NULL);
    EXPECT_OK(tc_comm_add_post_hook(comm, record, &coalesced, NULL));
    float c1[3] = {(float)rank, 0, 0};
    int64_t c2[2] = {rank, rank};
    void *bufs[2] = {c1, c2};
    size_t ccounts[2] = {3, 2};
    tc_dtype_t cdtypes[2] = {TC_FLOAT32, TC_INT64};
    EXPECT_OK(tc_broadcast_coalesced(comm, bufs, ccounts, cdtypes, 2, 1 << 20, 0, NULL, NULL));
    CHECK(c1[0] == 0 && c2[1] == 0);
    int broadcasts = 0; /* (it agrees on the plan in an all_reduce first) */
    for (int i = 0; i < coalesced.n; i++)
        broadcasts += strcmp(coalesced.events[i].op, "broadcast") == 0 && coalesced.events[i].root == 0;
    CHECK(broadcasts >= 1);
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);

    /* An operation that fails while running (rank 0 passes another count:
       every rank's check of the collective fails it) gives its post hook,
       on the progress thread, the code the wait returns. */
    char fail_path[64]; /* a store of its own: the first one is gone with its comm */
    snprintf(fail_path, sizeof fail_path, "%s.fail", path);
    tc_comm_t *failing = make_comm("hooks-fail", fail_path, rank, size);
    if (failing == NULL) return 1;
    static log_t fails;
    pthread_mutex_init(&fails.lock, NULL);
    EXPECT_OK(tc_comm_add_post_hook(failing, record, &fails, NULL));
    float y[3] = {1, 1, 1};
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.async_op = 1;
    o.timeout_ms = 30000;
    tc_work_t *fw = NULL;
    EXPECT_OK(tc_all_reduce(failing, y, rank == 0 ? 2 : 3, TC_FLOAT32, sum, &o, &fw));
    wait_polling(fw); /* so that the progress thread runs it (see 2 above) */
    tc_result_t wrc = tc_work_wait(fw, NULL);
    tc_work_free(fw);
    CHECK(wrc != TC_SUCCESS);
    CHECK(fails.n == 1);
    if (fails.n == 1) {
        const event_t *f = &fails.events[0];
        CHECK(f->status == wrc && f->completed == 1 && f->message[0] != '\0');
        CHECK(!pthread_equal(f->thread, pthread_self()));
    }
    CHECK(tc_comm_finalize(failing) != TC_SUCCESS); /* it reports the failed operation */
    tc_comm_destroy(failing);
    return capi_failures != 0;
}

/* Window calls through the hooks: a put (async), signal, wait_signal and
   get, each seen once before and once after with its target rank, offset
   and bytes; numbered apart from the collectives (rank 0 makes one more
   window call, and the next barrier still has the same number everywhere);
   a window call from inside a hook refused; calls discarded by the
   window's free get their post hooks with TC_ERR_ABORTED. */
static int window_rank(const char *path, int rank, int size) {
    tc_comm_t *comm = make_comm("hooks-window", path, rank, size);
    if (comm == NULL) return 1;
    tc_window_t *win = NULL;
    EXPECT_OK(tc_window_new(comm, &win));
    int64_t mem[8] = {0};
    EXPECT_OK(tc_window_register(win, mem, sizeof mem));
    static log_t pre, post;
    pthread_mutex_init(&pre.lock, NULL);
    pthread_mutex_init(&post.lock, NULL);
    EXPECT_OK(tc_comm_add_pre_hook(comm, record, &pre, NULL));
    EXPECT_OK(tc_comm_add_post_hook(comm, record, &post, NULL));
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int64_t val[2] = {100 + rank, 200 + rank}, got = -1;
    tc_op_options_t async = TC_OP_OPTIONS_INIT;
    async.async_op = 1;
    tc_work_t *w = NULL;
    EXPECT_OK(tc_window_put(win, val, sizeof val, next, 16, &async, &w));
    EXPECT_OK(tc_work_wait(w, NULL));
    tc_work_free(w);
    CHECK(post.n == 1); /* before the wait returned */
    EXPECT_OK(tc_window_signal(win, next, NULL, NULL));
    EXPECT_OK(tc_window_wait_signal(win, prev, NULL, NULL));
    CHECK(mem[2] == 100 + prev && mem[3] == 200 + prev);
    EXPECT_OK(tc_window_get(win, &got, 8, next, 24, NULL, NULL)); /* after my put there */
    CHECK(got == 200 + rank);
    /* Neither a zero-byte put nor one refused by its checks runs a hook. */
    EXPECT_OK(tc_window_put(win, val, 0, next, 0, NULL, NULL));
    EXPECT_RC(tc_window_put(win, val, 8, next, 64, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "dst_offset");
    CHECK(pre.n == 4 && post.n == 4);
    const char *names[4] = {"window_put", "window_signal", "window_wait_signal", "window_get"};
    const int peers[4] = {next, next, prev, next};
    log_t both = {.n = 0};
    for (int i = 0; i < 4 && i < pre.n && i < post.n; i++) {
        both.events[both.n++] = pre.events[i];
        both.events[both.n++] = post.events[i];
        CHECK(pre.events[i].peer == peers[i] && post.events[i].status == TC_SUCCESS && post.events[i].completed == 1);
    }
    for (int i = 0; i < 4; i++) expect_pair(&both, 2 * i, names[i], (uint64_t)i + 1);
    const event_t *put = &pre.events[0], *get = &pre.events[3];
    CHECK(put->async_op == 1 && put->window_offset == 16 && put->dtype == TC_UINT8);
    CHECK(put->num_inputs == 1 && put->num_outputs == 0 && put->in_ptr == (void *)val && put->in_count == 16);
    CHECK(!pthread_equal(post.events[0].thread, pthread_self())); /* the window's worker thread */
    CHECK(pre.events[1].num_inputs == 0 && pre.events[1].dtype == -1 && pre.events[1].window_offset == 0);
    CHECK(pthread_equal(post.events[2].thread, pthread_self())); /* a blocking wait runs inline */
    CHECK(get->num_outputs == 1 && get->out_ptr == (void *)&got && get->out_count == 8 && get->window_offset == 24);
    /* One-sided calls do not shift the collectives' numbers. */
    if (rank == 0) EXPECT_OK(tc_window_get(win, &got, 8, 0, 0, NULL, NULL));
    EXPECT_OK(tc_barrier(comm, NULL, NULL));
    uint64_t barrier_seq = pre.events[pre.n - 1].seq, seqs[4] = {0};
    CHECK(strcmp(pre.events[pre.n - 1].op, "barrier") == 0);
    EXPECT_OK(tc_all_gather_single(comm, seqs, &barrier_seq, 1, TC_UINT64, NULL, NULL));
    for (int r = 0; r < size; r++) CHECK(seqs[r] == barrier_seq);
    /* A window call from inside a hook is refused. */
    pre.win = win;
    pre.win_reentry = 1;
    EXPECT_OK(tc_window_signal(win, next, NULL, NULL));
    EXPECT_OK(tc_window_wait_signal(win, prev, NULL, NULL));
    CHECK(pre.reentry_win_rc == TC_ERR_INVALID_USAGE);
    /* Two waits for a signal that never comes: the first runs, the second
       is queued; the free ends one and discards the other. */
    EXPECT_OK(tc_barrier(comm, NULL, NULL));
    int posts = post.n;
    tc_work_t *w1 = NULL, *w2 = NULL;
    EXPECT_OK(tc_window_wait_signal(win, prev, &async, &w1));
    EXPECT_OK(tc_window_wait_signal(win, prev, &async, &w2));
    tc_window_free(win);
    CHECK(tc_work_wait(w1, NULL) == TC_ERR_ABORTED && tc_work_wait(w2, NULL) == TC_ERR_ABORTED);
    tc_work_free(w1);
    tc_work_free(w2);
    CHECK(post.n == posts + 2);
    for (int i = posts; i < post.n; i++)
        CHECK(strcmp(post.events[i].op, "window_wait_signal") == 0 && post.events[i].status == TC_ERR_ABORTED);
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    return capi_failures != 0;
}

/* f16 / bf16 bit patterns. */
#define F16_ONE 0x3c00
#define F16_INF 0x7c00
#define F16_NAN 0x7e00
#define BF16_ONE 0x3f80
#define BF16_NAN 0x7fc0

/* Runs `call`; the rank with the NaN gets INVALID_ARGUMENT naming op, rank
   and index, the others REMOTE naming the rank and index. */
#define EXPECT_NAN(call, bad_rank, op, index_text)                                       \
    do {                                                                                 \
        char rank_text_[32];                                                             \
        snprintf(rank_text_, sizeof rank_text_, "rank %d", bad_rank);                    \
        tc_result_t want_ = rank == (bad_rank) ? TC_ERR_INVALID_ARGUMENT : TC_ERR_REMOTE; \
        EXPECT_RC(call, want_, op);                                                      \
        CHECK(capi_last_error_mentions(rank_text_) && capi_last_error_mentions(index_text)); \
    } while (0)

static int nan_rank(const char *path, int rank, int size) {
    setenv("TORCHCOMM_NAN_CHECK", "1", 1);
    tc_comm_t *comm = make_comm("nan", path, rank, size);
    if (comm == NULL) return 1;
    static log_t post;
    pthread_mutex_init(&post.lock, NULL);
    EXPECT_OK(tc_comm_add_post_hook(comm, record, &post, NULL));
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    int bad = size - 1;

    /* Clean f32 passes and sums. */
    float x[8];
    for (int i = 0; i < 8; i++) x[i] = 1;
    EXPECT_OK(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, NULL, NULL));
    CHECK(x[7] == (float)size);
    /* A NaN at element 3 on the last rank: refused everywhere, nothing sent. */
    for (int i = 0; i < 8; i++) x[i] = (float)(rank + 1);
    if (rank == bad) x[3] = (float)NAN;
    EXPECT_NAN(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, NULL, NULL), bad, "all_reduce", "element 3");
    CHECK(x[0] == (float)(rank + 1) && x[7] == (float)(rank + 1));
    /* The post hook saw the failure with its code and message. */
    CHECK(post.n == 2);
    if (post.n == 2) {
        tc_result_t want = rank == bad ? TC_ERR_INVALID_ARGUMENT : TC_ERR_REMOTE;
        CHECK(post.events[0].status == TC_SUCCESS && post.events[1].status == want);
        CHECK(strstr(post.events[1].message, "NaN") != NULL && post.events[1].completed == 1);
    }
    /* f16: a NaN at element 1 on rank 0; infinities are not NaN. */
    uint16_t h[4] = {F16_ONE, F16_INF, F16_ONE, F16_ONE};
    EXPECT_OK(tc_all_reduce(comm, h, 4, TC_FLOAT16, sum, NULL, NULL));
    if (rank == 0) h[1] = F16_NAN;
    EXPECT_NAN(tc_all_reduce(comm, h, 4, TC_FLOAT16, sum, NULL, NULL), 0, "all_reduce", "element 1");
    /* bf16 in an all_gather_single input: element 2 on rank 1. */
    uint16_t bf_in[3] = {BF16_ONE, BF16_ONE, BF16_ONE}, bf_out[12] = {0};
    if (rank == 1) bf_in[2] = BF16_NAN;
    EXPECT_NAN(tc_all_gather_single(comm, bf_out, bf_in, 3, TC_BFLOAT16, NULL, NULL), 1,
               "all_gather_single", "element 2");
    CHECK(bf_out[0] == 0);
    /* A NaN in a broadcast's non-root buffer is not an input: passes. */
    float bcast[2] = {(float)NAN, (float)NAN};
    if (rank == 0) bcast[0] = bcast[1] = 5;
    EXPECT_OK(tc_broadcast(comm, bcast, 2, TC_FLOAT32, 0, NULL, NULL));
    CHECK(bcast[1] == 5);
    /* Integer data is not checked (all bits set would be a NaN as f32). */
    int32_t ints[2] = {-1, -1};
    EXPECT_OK(tc_all_reduce(comm, ints, 2, TC_INT32, sum, NULL, NULL));
    CHECK(ints[0] == -size);
    /* The comm is still usable. */
    for (int i = 0; i < 8; i++) x[i] = 2;
    EXPECT_OK(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, NULL, NULL));
    CHECK(x[5] == (float)(2 * size));
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    return capi_failures != 0;
}

static void run_ranks(int size, int (*rank_main)(const char *, int, int), const char *what) {
    char path[32];
    char name[64];
    snprintf(name, sizeof name, "test_hooks: %s", what);
    capi_run_ranks(name, size, rank_main, path);
    char fail_path[64];
    snprintf(fail_path, sizeof fail_path, "%s.fail", path);
    unlink(fail_path);
}

/* One rank, in this process (also under valgrind): argument checks, a hook
   on a one-rank comm, removal from another comm refused. */
static void one_rank(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *comm = capi_one_rank_comm("hooks-one", store);
    if (comm == NULL) return;
    static log_t log;
    pthread_mutex_init(&log.lock, NULL);
    EXPECT_RC(tc_comm_add_pre_hook(comm, NULL, NULL, NULL), TC_ERR_NULL_ARGUMENT, "hook");
    EXPECT_RC(tc_comm_add_post_hook(NULL, record, &log, NULL), TC_ERR_NULL_ARGUMENT, "comm");
    EXPECT_RC(tc_comm_remove_hook(NULL, 1), TC_ERR_NULL_ARGUMENT, "comm");
    EXPECT_OK(tc_comm_add_post_hook(comm, record, &log, NULL)); /* id not wanted */
    float x[2] = {1, 2};
    EXPECT_OK(tc_all_reduce(comm, x, 2, TC_FLOAT32, (tc_reduce_op_t)TC_REDUCE_OP(TC_MAX), NULL, NULL));
    CHECK(log.n == 1 && log.events[0].red_kind == TC_MAX && log.events[0].status == TC_SUCCESS);
    /* Refused by validation: no hook runs. */
    EXPECT_RC(tc_all_reduce(comm, NULL, 2, TC_FLOAT32, (tc_reduce_op_t)TC_REDUCE_OP(TC_SUM), NULL, NULL),
              TC_ERR_NULL_ARGUMENT, NULL);
    CHECK(log.n == 1);
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    tc_store_free(store);
    unlink(path);
}

int main(void) {
    one_rank();
    if (getenv("TC_UNDER_VALGRIND") == NULL) {
        for (int size = 2; size <= 4; size++) {
            run_ranks(size, hooks_rank, "hooks");
            run_ranks(size, nan_rank, "nan check");
            if (size <= 3) run_ranks(size, window_rank, "windows");
        }
    } else {
        fprintf(stderr, "test_hooks: multi-process part SKIPPED under valgrind (forked ranks)\n");
    }
    CAPI_DONE("test_hooks");
}
