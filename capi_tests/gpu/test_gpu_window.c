/* Windows on the nccl backend (NCCL's host RMA API, 2.29+), N ranks:
   uneven window sizes (rank r registers N*SLOT + BIG + 256*r bytes of
   device memory); every rank puts SLOT bytes to every rank (itself
   included) from a buffer outside its window (NCCL stages it), signals,
   waits for every rank's signal and checks every byte; a 1.5 MiB put to
   the next rank (several staged pieces); puts from inside the window (no
   staging); get from itself works and from a peer is TC_ERR_UNSUPPORTED
   saying NCCL has no get; bad rank, offset past the end of the target's
   (differently sized) window and a second registered window of the comm
   are refused with named errors; an asynchronous wait posted before the
   rank's own puts (a ring); a wait past its timeout. With an NCCL older than 2.29, checks
   instead that tc_window_new is TC_ERR_UNSUPPORTED naming the version.
   Prints "N passed, N failed" on rank 0. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include "scenario.h"

#define SLOT 4096u
#define BIG (3u << 19) /* 1.5 MiB */

static int has(const char *needle) { return strstr(tc_last_error(), needle) != NULL; }
static unsigned char pat(int round, int from, int to, size_t i) { return (unsigned char)(round * 61 + from * 31 + to * 7 + i * 13 + 1); }
static size_t wsize(int r, int n) { return (size_t)n * SLOT + BIG + 256u * (size_t)r; }

static int region_ok(const unsigned char *h, int round, int from, int to, size_t bytes) {
    for (size_t i = 0; i < bytes; i++)
        if (h[i] != pat(round, from, to, i)) {
            fprintf(stderr, "round %d: byte %zu from rank %d at rank %d is %u, want %u\n", round, i, from, to, h[i],
                    pat(round, from, to, i));
            return 0;
        }
    return 1;
}

static void old_nccl(tc_comm_t *comm, const char *version) {
    tc_window_t *win = NULL;
    tc_result_t rc = tc_window_new(comm, &win);
    printf("tc_window_new on %s: %s: %s\n", version, tc_result_string(rc), tc_last_error());
    expect(rc == TC_ERR_UNSUPPORTED, "tc_window_new on NCCL < 2.29 is TC_ERR_UNSUPPORTED");
    expect(has(version + 5) && has("2.29.0") && has("ncclPutSignal"), "the message names the loaded version and what is needed");
    expect(win == NULL, "no window");
}

/* Every rank puts SLOT bytes of `round`'s pattern to every rank at offset
   rank*SLOT, from `src` (outside the window) or from its own slot of the
   window, signals each, then waits for each. */
static void exchange(tc_window_t *win, unsigned char *wbuf, void *src, int round, int R, int N, int from_window) {
    unsigned char *h = malloc(SLOT);
    tc_result_t rc = TC_SUCCESS;
    for (int k = 1; k <= N && rc == TC_SUCCESS; k++) {
        int q = (R + k) % N; /* itself last: from the window, its own slot then keeps its own data */
        for (size_t i = 0; i < SLOT; i++) h[i] = pat(round, R, q, i);
        void *from = from_window ? (void *)(wbuf + (size_t)R * SLOT) : src;
        h2d(from, h, SLOT);
        if (from_window && q == R) continue;
        rc = tc_window_put(win, from, SLOT, q, (size_t)R * SLOT, NULL, NULL);
        if (rc == TC_SUCCESS) rc = tc_window_signal(win, q, NULL, NULL);
    }
    if (rc != TC_SUCCESS) fprintf(stderr, "round %d: %s\n", round, tc_last_error());
    expect(rc == TC_SUCCESS, from_window ? "puts from inside the window and signals" : "staged puts to every rank and signals");
    rc = TC_SUCCESS;
    for (int q = 0; q < N && rc == TC_SUCCESS; q++)
        if (!(from_window && q == R)) rc = tc_window_wait_signal(win, q, NULL, NULL);
    if (rc != TC_SUCCESS) fprintf(stderr, "round %d wait: %s\n", round, tc_last_error());
    expect(rc == TC_SUCCESS, "a signal from every rank");
    unsigned char *all = malloc((size_t)N * SLOT);
    d2h(all, wbuf, (size_t)N * SLOT);
    int ok = 1;
    for (int q = 0; q < N; q++) ok &= region_ok(all + (size_t)q * SLOT, round, q, R, SLOT);
    expect(ok, "every byte from every rank landed at its offset");
    free(all);
    free(h);
}

static void errors(tc_comm_t *comm, tc_window_t *win, void *src, int R, int N) {
    int peer = (R + 1) % N;
    tc_result_t rc = tc_window_put(win, src, 64, N, 0, NULL, NULL);
    expect(rc == TC_ERR_INVALID_ARGUMENT && has("dst_rank"), "put to rank N names dst_rank");
    size_t end = wsize(peer, N);
    rc = tc_window_put(win, src, 64, peer, end - 63, NULL, NULL);
    char want[64];
    snprintf(want, sizeof want, "window of %zu bytes", end);
    printf("put past the end: %s: %s\n", tc_result_string(rc), tc_last_error());
    expect(rc == TC_ERR_INVALID_ARGUMENT && has("dst_offset") && has(want), "put past the end of the target's window names it and its size");
    expect(tc_window_signal(win, -1, NULL, NULL) == TC_ERR_INVALID_ARGUMENT && has("peer"), "signal to rank -1 names peer");
    rc = tc_window_get(win, src, 64, peer, 0, NULL, NULL);
    printf("get from a peer: %s: %s\n", tc_result_string(rc), tc_last_error());
    expect(N == 1 || (rc == TC_ERR_UNSUPPORTED && has("no get") && has("src_rank")), "get from a peer: UNSUPPORTED, saying NCCL has no get");
    tc_window_t *second = NULL;
    expect(tc_window_new(comm, &second) == TC_SUCCESS, "a second window of the comm");
    void *other = dalloc(SLOT);
    rc = tc_window_register(second, other, SLOT);
    expect(rc == TC_ERR_INVALID_USAGE && has("per comm"), "registering it while the first is registered is refused, saying why");
    tc_window_free(second);
    dfree(other);
}

/* Every rank first posts an asynchronous wait for the previous rank's
   signal, then puts to the next rank and signals it: an outstanding wait
   must not hold up the rank's own puts (a ring of waits would deadlock). */
static void async_ring(tc_window_t *win, unsigned char *wbuf, void *src, int R, int N) {
    int next = (R + 1) % N, prev = (R + N - 1) % N;
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.async_op = 1;
    tc_work_t *w = NULL;
    tc_result_t rc = tc_window_wait_signal(win, prev, &o, &w);
    unsigned char *h = malloc(SLOT);
    for (size_t i = 0; i < SLOT; i++) h[i] = pat(4, R, next, i);
    h2d(src, h, SLOT);
    if (rc == TC_SUCCESS) rc = tc_window_put(win, src, SLOT, next, (size_t)R * SLOT, NULL, NULL);
    if (rc == TC_SUCCESS) rc = tc_window_signal(win, next, NULL, NULL);
    if (rc == TC_SUCCESS) rc = tc_work_wait_blocking(w);
    if (rc != TC_SUCCESS) fprintf(stderr, "async ring: %s\n", tc_last_error());
    expect(rc == TC_SUCCESS, "asynchronous wait posted before this rank's put and signal completes");
    tc_work_free(w);
    d2h(h, wbuf + (size_t)prev * SLOT, SLOT);
    expect(region_ok(h, 4, prev, R, SLOT), "every byte of the previous rank's put");
    free(h);
}

/* Rank 0 waits for a signal rank 1 sends only later: TC_ERR_TIMEOUT naming
   the call; NCCL's wait is still queued then, so a later wait on rank 0 is
   refused, saying why. */
static void timed_out_wait(tc_comm_t *comm, tc_window_t *win, int R) {
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.timeout_ms = 300;
    if (R == 0) {
        tc_result_t rc = tc_window_wait_signal(win, 1, &o, NULL);
        printf("wait for a signal not sent: %s: %s\n", tc_result_string(rc), tc_last_error());
        expect(rc == TC_ERR_TIMEOUT && has("wait_signal") && has("300 ms"), "a wait past its timeout: TC_ERR_TIMEOUT naming it");
    }
    expect(tc_barrier(comm, NULL, NULL) == TC_SUCCESS, "barrier after the timed-out wait");
    if (R == 1) expect(tc_window_signal(win, 0, NULL, NULL) == TC_SUCCESS, "the late signal");
    expect(tc_barrier(comm, NULL, NULL) == TC_SUCCESS, "barrier after the late signal");
    if (R == 0) {
        tc_result_t rc = tc_window_wait_signal(win, 1, &o, NULL);
        printf("wait after a timed-out wait: %s: %s\n", tc_result_string(rc), tc_last_error());
        expect(rc == TC_ERR_INVALID_USAGE && has("can no longer be matched"), "a wait after it is refused, saying why");
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    tc_comm_t *comm = scenario_comm("gpu_window");
    int R, N;
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    const char *version = "";
    tc_comm_get_backend_version(comm, &version);
    int major = 0, minor = 0;
    sscanf(version, "nccl %d.%d", &major, &minor);
    if (major * 100 + minor < 229) {
        old_nccl(comm, version);
    } else {
        tc_window_t *win = NULL;
        expect(tc_window_new(comm, &win) == TC_SUCCESS, "tc_window_new");
        if (win == NULL) {
            printf("rank %d: %d passed, %d failed\n", R, passed, failed);
            if (R == 0) printf("%d passed, %d failed\n", passed, failed);
            return 1;
        }
        size_t bytes = wsize(R, N);
        unsigned char *wbuf = dalloc(bytes);
        void *src = dalloc(BIG);
        tc_result_t rc = tc_window_register(win, wbuf, bytes);
        if (rc != TC_SUCCESS) fprintf(stderr, "register: %s\n", tc_last_error());
        expect(rc == TC_SUCCESS, "register (collective, uneven sizes)");
        exchange(win, wbuf, src, 1, R, N, 0);
        /* a large put to the next rank, in several staged pieces */
        unsigned char *h = malloc(BIG);
        int next = (R + 1) % N, prev = (R + N - 1) % N;
        for (size_t i = 0; i < BIG; i++) h[i] = pat(2, R, next, i);
        h2d(src, h, BIG);
        rc = tc_window_put(win, src, BIG, next, (size_t)N * SLOT, NULL, NULL);
        if (rc == TC_SUCCESS) rc = tc_window_signal(win, next, NULL, NULL);
        if (rc == TC_SUCCESS) rc = tc_window_wait_signal(win, prev, NULL, NULL);
        expect(rc == TC_SUCCESS, "1.5 MiB put to the next rank, signal, wait");
        d2h(h, wbuf + (size_t)N * SLOT, BIG);
        expect(region_ok(h, 2, prev, R, BIG), "every byte of the 1.5 MiB put");
        /* nobody overwrites a slot before its owner checked it */
        expect(tc_barrier(comm, NULL, NULL) == TC_SUCCESS, "barrier");
        exchange(win, wbuf, src, 3, R, N, 1);
        rc = tc_window_get(win, h, SLOT, R, (size_t)prev * SLOT, NULL, NULL);
        expect(rc == TC_SUCCESS && region_ok(h, 3, prev, R, SLOT), "get from its own window");
        expect(tc_barrier(comm, NULL, NULL) == TC_SUCCESS, "barrier");
        async_ring(win, wbuf, src, R, N);
        errors(comm, win, src, R, N);
        if (N > 1) timed_out_wait(comm, win, R);
        expect(tc_barrier(comm, NULL, NULL) == TC_SUCCESS, "barrier");
        expect(tc_window_deregister(win) == TC_SUCCESS, "deregister (collective)");
        tc_window_free(win);
        free(h);
        dfree(src);
        dfree(wbuf);
    }
    expect(tc_comm_finalize(comm) == TC_SUCCESS, "finalize");
    tc_comm_destroy(comm);
    printf("rank %d: %d passed, %d failed\n", R, passed, failed);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
