/* window_bench: one-sided windows through the public C API, run under a
 * launcher (tc-run -n N -- window_bench). Each rank registers a window of the
 * largest size, then per size and iteration puts `size` bytes into the next
 * rank's window, signals it, and waits for the previous rank's signal (a ring
 * of one-sided hops). Prints, on rank 0: size, the time of the put call
 * alone, the time of a whole hop (put + signal + wait), and the put
 * bandwidth; the last hop's data is checked byte by byte.
 *
 * With -m 1 the window's buffer comes from tc_mem_alloc: on gloo, shared
 * memory that the other ranks of the host map, so puts are memory copies.
 *
 * Usage: window_bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-B BACKEND] [-m 0|1] */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <torchcomm.h>

#define TRY(call)                                                                                    \
    do {                                                                                             \
        tc_result_t rc_ = (call);                                                                    \
        if (rc_ != TC_SUCCESS) {                                                                     \
            fprintf(stderr, "%s failed: %s: %s\n", #call, tc_result_string(rc_), tc_last_error());  \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
        case 'K': case 'k': v *= 1024; break;
        case 'M': case 'm': v *= 1024 * 1024; break;
        case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    }
    return (size_t)v;
}

static unsigned char pattern(int rank, size_t i, int round) { return (unsigned char)(rank * 31 + i * 7 + round); }

int main(int argc, char **argv) {
    size_t minb = 8, maxb = 16 << 20, factor = 4;
    int iters = 50, warmup = 5;
    const char *backend = "gloo";
    int shared = 0; /* -m 1: the window's buffer comes from tc_mem_alloc */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b")) minb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-e")) maxb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-f")) factor = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-B")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "-m")) shared = atoi(argv[i + 1]);
        else { fprintf(stderr, "window_bench: unknown option %s\n", argv[i]); return 2; }
    }
    if (minb < 1 || maxb < minb || factor < 2 || iters < 1) { fprintf(stderr, "window_bench: bad sizes\n"); return 2; }

    tc_comm_t *comm = NULL;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    TRY(tc_comm_new(backend, cpu, NULL, &comm));
    int rank, size;
    TRY(tc_comm_get_rank(comm, &rank));
    TRY(tc_comm_get_size(comm, &size));
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;

    tc_window_t *win = NULL;
    TRY(tc_window_new(comm, &win));
    unsigned char *mem = NULL, *src = malloc(maxb);
    if (shared) TRY(tc_mem_alloc(comm, maxb, (void **)&mem));
    else mem = malloc(maxb);
    if (!mem || !src) { fprintf(stderr, "window_bench: out of memory\n"); return 1; }
    memset(mem, 0, maxb);
    TRY(tc_window_register(win, mem, maxb));

    if (rank == 0) {
        printf("# window_bench: %s backend, %d ranks, ring of put + signal + wait, iters %d, warm-up %d, buffer from %s\n",
               backend, size, iters, warmup, shared ? "tc_mem_alloc (shared memory)" : "malloc");
        printf("#%11s %12s %12s %12s %7s\n", "size (B)", "put (us)", "hop (us)", "put (GB/s)", "#wrong");
    }
    long total_wrong = 0;
    for (size_t bytes = minb; bytes <= maxb; bytes *= factor) {
        double put_us = 0, t0 = 0;
        int round = 0;
        for (int it = 0; it < warmup + iters; it++) {
            round = it;
            for (size_t i = 0; i < bytes; i++) src[i] = pattern(rank, i, round);
            if (it == warmup) {
                TRY(tc_barrier(comm, NULL, NULL));
                t0 = now_us();
                put_us = 0;
            }
            double p0 = now_us();
            TRY(tc_window_put(win, src, bytes, next, 0, NULL, NULL));
            put_us += now_us() - p0;
            TRY(tc_window_signal(win, next, NULL, NULL));
            TRY(tc_window_wait_signal(win, prev, NULL, NULL));
        }
        double hop_us = (now_us() - t0) / iters;
        put_us /= iters;
        long wrong = 0;
        for (size_t i = 0; i < bytes; i++) wrong += mem[i] != pattern(prev, i, round);
        /* Nobody starts the next size (overwriting this one's data) before
           every rank has checked. */
        TRY(tc_barrier(comm, NULL, NULL));
        int64_t all_wrong = wrong;
        tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
        TRY(tc_all_reduce(comm, &all_wrong, 1, TC_INT64, sum, NULL, NULL));
        total_wrong += all_wrong;
        if (rank == 0)
            printf("%12zu %12.2f %12.2f %12.3f %7lld\n", bytes, put_us, hop_us, bytes / put_us / 1e3, (long long)all_wrong);
        if (bytes > maxb / factor) break;
    }
    TRY(tc_window_deregister(win));
    tc_window_free(win);
    if (shared) TRY(tc_mem_free(comm, mem));
    else free(mem);
    TRY(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    free(src);
    if (rank == 0) printf("# wrong bytes: %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    return total_wrong != 0;
}
