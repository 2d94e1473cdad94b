/* The main job: every rank joins a host ("gloo") communicator bootstrapped
   from tc-run's environment, and runs a tour of the API on host memory:
   all_reduce, broadcast, all_gather, reduce_scatter, all_to_all, send/recv
   in a ring, an asynchronous operation with a work handle, a split, and
   one-sided puts and signals through a window, then stores through a
   window on shared memory from tc_mem_alloc. Each result is checked; the
   program exits non-zero on the first wrong value. Rank 0 then prints a
   short table of time and algorithm bandwidth per operation on 1 MiB
   buffers, and the tail of its flight recorder. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <torchcomm.h>

#define N 1024

#define TRY(call)                                                                         \
    do {                                                                                  \
        tc_result_t rc_ = (call);                                                         \
        if (rc_ != TC_SUCCESS) {                                                          \
            fprintf(stderr, "%s failed: %s: %s\n", #call, tc_result_string(rc_), tc_last_error()); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static void expect(int ok, const char *what, int rank) {
    if (!ok) {
        fprintf(stderr, "rank %d: wrong result in %s\n", rank, what);
        exit(2);
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_TO_ALL, OP_BROADCAST, OP_COUNT };

/* One operation on `count` floats per rank (buffers sized for every op). */
static void run_op(tc_comm_t *comm, int op, float *in, float *out, size_t count) {
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    switch (op) {
    case OP_ALL_REDUCE: TRY(tc_all_reduce(comm, in, count, TC_FLOAT32, sum, NULL, NULL)); break;
    case OP_ALL_GATHER: TRY(tc_all_gather_single(comm, out, in, count, TC_FLOAT32, NULL, NULL)); break;
    case OP_REDUCE_SCATTER: TRY(tc_reduce_scatter_single(comm, out, in, count, TC_FLOAT32, sum, NULL, NULL)); break;
    case OP_ALL_TO_ALL: TRY(tc_all_to_all_single(comm, out, in, count, TC_FLOAT32, NULL, NULL)); break;
    default: TRY(tc_broadcast(comm, in, count, TC_FLOAT32, 0, NULL, NULL)); break;
    }
}

/* Times each operation on 1 MiB per rank (mean of 5 after 1 warm-up); rank 0
   prints op, bytes, time and algbw (bytes / time, nccl-tests' convention). */
static void print_table(tc_comm_t *comm, int rank, int size) {
    static const char *names[OP_COUNT] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"};
    const size_t count = (1u << 20) / sizeof(float);
    float *in = calloc(count * (size_t)size, sizeof *in), *out = calloc(count * (size_t)size, sizeof *out);
    if (rank == 0) printf("%-16s %12s %12s %12s\n", "op", "bytes", "time(us)", "algbw(GB/s)");
    for (int op = 0; op < OP_COUNT; op++) {
        /* all_reduce and broadcast move `count` elements; the others count
           every rank's block, as nccl-tests does */
        size_t per_call = (op == OP_ALL_REDUCE || op == OP_BROADCAST) ? count : count / (size_t)size;
        size_t bytes = (op == OP_ALL_REDUCE || op == OP_BROADCAST) ? count * sizeof(float) : per_call * (size_t)size * sizeof(float);
        run_op(comm, op, in, out, per_call);
        TRY(tc_barrier(comm, NULL, NULL));
        double t0 = now_us();
        for (int i = 0; i < 5; i++) run_op(comm, op, in, out, per_call);
        double us = (now_us() - t0) / 5;
        if (rank == 0) printf("%-16s %12zu %12.1f %12.3f\n", names[op], bytes, us, bytes / us / 1e3);
    }
    free(in);
    free(out);
}

int main(void) {
    tc_comm_t *comm = NULL;
    tc_comm_options_t copts = TC_COMM_OPTIONS_INIT;
    copts.name = "demo";
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    TRY(tc_comm_new("gloo", cpu, &copts, &comm));
    int rank, size;
    TRY(tc_comm_get_rank(comm, &rank));
    TRY(tc_comm_get_size(comm, &size));

    /* all_reduce: sum of (rank + 1) over ranks, in place */
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = (float)(rank + 1);
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    TRY(tc_all_reduce(comm, x, N, TC_FLOAT32, sum, NULL, NULL));
    expect(x[0] == size * (size + 1) / 2.0f && x[N - 1] == x[0], "all_reduce", rank);

    /* broadcast from the last rank */
    int64_t token = rank == size - 1 ? 424242 : -1;
    TRY(tc_broadcast(comm, &token, 1, TC_INT64, size - 1, NULL, NULL));
    expect(token == 424242, "broadcast", rank);

    /* all_gather_single of each rank's id */
    int32_t me = rank * 10, *all = calloc((size_t)size, sizeof *all);
    TRY(tc_all_gather_single(comm, all, &me, 1, TC_INT32, NULL, NULL));
    for (int r = 0; r < size; r++) expect(all[r] == r * 10, "all_gather_single", rank);

    /* reduce_scatter_single: block r of every rank's input is (r + 1) */
    double *in = malloc((size_t)size * 4 * sizeof *in), out[4];
    for (int i = 0; i < size * 4; i++) in[i] = i / 4 + 1;
    TRY(tc_reduce_scatter_single(comm, out, in, 4, TC_FLOAT64, sum, NULL, NULL));
    for (int i = 0; i < 4; i++) expect(out[i] == (double)size * (rank + 1), "reduce_scatter_single", rank);

    /* all_to_all_single: rank r sends r * 100 + dst to dst */
    int32_t *a2a_in = malloc((size_t)size * sizeof *a2a_in), *a2a_out = malloc((size_t)size * sizeof *a2a_out);
    for (int d = 0; d < size; d++) a2a_in[d] = rank * 100 + d;
    TRY(tc_all_to_all_single(comm, a2a_out, a2a_in, 1, TC_INT32, NULL, NULL));
    for (int s = 0; s < size; s++) expect(a2a_out[s] == s * 100 + rank, "all_to_all_single", rank);

    /* a ring of sends and receives, batched so that nobody waits on order */
    int32_t send_val = rank, recv_val = -1;
    tc_batch_t *batch = NULL;
    TRY(tc_batch_begin(comm, &batch));
    TRY(tc_batch_send(batch, &send_val, 1, TC_INT32, (rank + 1) % size));
    TRY(tc_batch_recv(batch, &recv_val, 1, TC_INT32, (rank + size - 1) % size));
    TRY(tc_batch_issue(batch, NULL, NULL));
    tc_batch_free(batch);
    expect(recv_val == (rank + size - 1) % size, "batched ring send/recv", rank);

    /* an asynchronous all_reduce with MAX, waited on through its work */
    tc_op_options_t async = TC_OP_OPTIONS_INIT;
    async.async_op = 1;
    tc_work_t *work = NULL;
    int32_t biggest = rank;
    tc_reduce_op_t max = TC_REDUCE_OP(TC_MAX);
    TRY(tc_all_reduce(comm, &biggest, 1, TC_INT32, max, &async, &work));
    TRY(tc_work_wait(work, NULL));
    int32_t status = -1;
    TRY(tc_work_status(work, &status));
    expect(status == TC_WORK_COMPLETED && biggest == size - 1, "async all_reduce", rank);
    tc_work_free(work);

    /* split off the even ranks; odd ranks opt out with an empty list */
    int evens[64], n_evens = 0;
    for (int r = 0; r < size && n_evens < 64; r += 2) evens[n_evens++] = r;
    tc_comm_t *even = NULL;
    TRY(tc_comm_split(comm, evens, rank % 2 == 0 ? (size_t)n_evens : 0, "demo-even", NULL, &even));
    if (even) {
        int erank, esize;
        TRY(tc_comm_get_rank(even, &erank));
        TRY(tc_comm_get_size(even, &esize));
        int32_t one = 1;
        TRY(tc_all_reduce(even, &one, 1, TC_INT32, sum, NULL, NULL));
        expect(erank == rank / 2 && one == esize, "split all_reduce", rank);
        TRY(tc_comm_finalize(even));
        tc_comm_destroy(even);
    }

    /* a one-sided window: each rank writes its block into the next rank's
       window and signals it; the next rank waits and reads it */
    tc_window_t *win = NULL;
    TRY(tc_window_new(comm, &win));
    int32_t *window_mem = calloc((size_t)size * 4, sizeof(int32_t));
    TRY(tc_window_register(win, window_mem, (size_t)size * 4 * sizeof(int32_t)));
    int32_t block[4] = {rank, rank * 10, rank * 100, -rank};
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    TRY(tc_window_put(win, block, sizeof block, next, (size_t)rank * sizeof block, NULL, NULL));
    TRY(tc_window_signal(win, next, NULL, NULL));
    TRY(tc_window_wait_signal(win, prev, NULL, NULL));
    const int32_t *got = window_mem + prev * 4;
    expect(got[0] == prev && got[1] == prev * 10 && got[2] == prev * 100 && got[3] == -prev, "window put", rank);
    TRY(tc_window_deregister(win));
    tc_window_free(win);
    free(window_mem);

    /* the same through memory from tc_mem_alloc: shared between the ranks
       of this host, so the next rank's buffer can be written directly
       through tc_window_map_remote (ranks on other hosts would get
       TC_ERR_UNSUPPORTED there and use tc_window_put) */
    int32_t *shared = NULL;
    TRY(tc_mem_alloc(comm, (size_t)size * 4 * sizeof(int32_t), (void **)&shared));
    TRY(tc_window_new(comm, &win));
    TRY(tc_window_register(win, shared, (size_t)size * 4 * sizeof(int32_t)));
    void *remote = NULL;
    if (tc_window_map_remote(win, next, &remote) == TC_SUCCESS) {
        memcpy((int32_t *)remote + rank * 4, block, sizeof block);
    } else {
        TRY(tc_window_put(win, block, sizeof block, next, (size_t)rank * sizeof block, NULL, NULL));
    }
    TRY(tc_window_signal(win, next, NULL, NULL));
    TRY(tc_window_wait_signal(win, prev, NULL, NULL));
    got = shared + prev * 4;
    expect(got[0] == prev && got[1] == prev * 10 && got[2] == prev * 100 && got[3] == -prev, "shared window store", rank);
    TRY(tc_window_deregister(win));
    tc_window_free(win);
    TRY(tc_mem_free(comm, shared));

    print_table(comm, rank, size);

    /* the flight recorder: the comm's recent operations, as a hang
       diagnosis would read them (here: the last three) */
    if (rank == 0) {
        enum { SHOWN = 3 };
        char *recent = NULL;
        TRY(tc_comm_dump_flight_recorder(comm, &recent));
        /* a title line, the column names, then one line per operation */
        const char *title_end = strchr(recent, '\n');
        if (!title_end) title_end = recent + strlen(recent) - 1; /* never: it ends in a newline */
        const char *rows_start = strchr(title_end + 1, '\n');
        rows_start = rows_start ? rows_start + 1 : recent + strlen(recent);
        const char *tail = recent + strlen(recent);
        int rows = 0;
        for (; rows < SHOWN && tail > rows_start; rows++)
            for (tail--; tail > rows_start && tail[-1] != '\n'; tail--) {}
        /* The title says how many operations the recorder keeps ("last K of
           N operations"); say how many of them are printed here instead. */
        const char *last = strstr(recent, ": last ");
        const char *of = last && last < title_end ? strstr(last, " of ") : NULL;
        if (of && of < title_end)
            printf("%.*s: last %d%.*s\n", (int)(last - recent), recent, rows, (int)(title_end - of), of);
        else
            printf("%.*s\n", (int)(rows_start - recent - 1), recent);
        printf("%.*s%s", (int)(rows_start - title_end - 1), title_end + 1, tail);
        tc_free(recent);
    }

    TRY(tc_barrier(comm, NULL, NULL));
    if (rank == 0)
        printf("demo: %d ranks: all_reduce, broadcast, all_gather, reduce_scatter, all_to_all, "
               "batched send/recv, async work, split, window put/signal (messages and shared memory): all results "
               "correct\n", size);
    TRY(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    free(x); free(all); free(in); free(a2a_in); free(a2a_out);
    return 0;
}
