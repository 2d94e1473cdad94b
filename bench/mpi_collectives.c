/* mpi_collectives: Open MPI's time per call of one collective over a sweep
 * of sizes, measured as tc-perf measures ours, for side-by-side tables
 * (scripts/bench-small-collectives.sh).
 *
 *   mpirun -np N mpi_collectives -o OP [-b 4] [-e 4K] [-f 4] [-n 1000] [-w 50]
 *
 * OP: all_reduce, broadcast, reduce (float32 SUM, in place, root 0),
 * all_gather, reduce_scatter (out of place; the size is the whole n-rank
 * buffer, each rank holding size / n, as tc-perf and nccl-tests count it),
 * barrier (one line, size 0); their per-rank count is rounded down (a
 * size with none left is skipped) and the size printed is what is moved,
 * as tc-perf does. Time = mean over ranks of elapsed /
 * iterations, after the warm-up and a barrier. Rank 0 prints one line per
 * size: "OP SIZE_BYTES MICROSECONDS". Every size is checked once on small
 * integers (exact sums); a wrong element fails the run.
 */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum op { ALL_REDUCE, BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, BARRIER };
static const char *const NAMES[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier"};

static size_t parse_size(const char *s) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    default: break;
    }
    return (size_t)v;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* One call of `op`: `in` holds `per_rank` elements of this rank, `out`
 * `per_rank * size` (all_gather) or `per_rank` (the others). */
static void call(enum op op, float *in, float *out, int per_rank, int size) {
    switch (op) {
    case ALL_REDUCE: MPI_Allreduce(MPI_IN_PLACE, in, per_rank, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case BROADCAST: MPI_Bcast(in, per_rank, MPI_FLOAT, 0, MPI_COMM_WORLD); break;
    case REDUCE: {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Reduce(rank == 0 ? MPI_IN_PLACE : in, in, per_rank, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
        break;
    }
    case ALL_GATHER: MPI_Allgather(in, per_rank, MPI_FLOAT, out, per_rank, MPI_FLOAT, MPI_COMM_WORLD); break;
    case REDUCE_SCATTER:
        (void)size;
        MPI_Reduce_scatter_block(in, out, per_rank, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BARRIER: MPI_Barrier(MPI_COMM_WORLD); break;
    }
}

/* Checks one call on fresh data: rank r's element i is 1 + (r + i) % 3. */
static int wrong_after_check(enum op op, float *in, float *out, int per_rank, int size, int rank) {
    int n_in = op == REDUCE_SCATTER ? per_rank * size : per_rank;
    for (int i = 0; i < n_in; i++) in[i] = (float)(1 + (rank + i) % 3);
    call(op, in, out, per_rank, size);
    int wrong = 0;
    for (int i = 0; i < per_rank; i++) {
        float sum = 0;
        for (int r = 0; r < size; r++) sum += (float)(1 + (r + i) % 3);
        switch (op) {
        case ALL_REDUCE: wrong += in[i] != sum; break;
        case REDUCE: wrong += rank == 0 && in[i] != sum; break;
        case BROADCAST: wrong += in[i] != (float)(1 + i % 3); break;
        case ALL_GATHER:
            for (int r = 0; r < size; r++) wrong += out[r * per_rank + i] != (float)(1 + (r + i) % 3);
            break;
        case REDUCE_SCATTER: {
            float s = 0;
            for (int r = 0; r < size; r++) s += (float)(1 + (r + rank * per_rank + i) % 3);
            wrong += out[i] != s;
            break;
        }
        case BARRIER: break;
        }
    }
    return wrong;
}

int main(int argc, char **argv) {
    size_t minb = 4, maxb = 4096, factor = 4;
    int iters = 1000, warmup = 50, op = -1;
    MPI_Init(&argc, &argv);
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "-b")) minb = parse_size(v);
        else if (!strcmp(f, "-e")) maxb = parse_size(v);
        else if (!strcmp(f, "-f")) factor = parse_size(v);
        else if (!strcmp(f, "-n")) iters = atoi(v);
        else if (!strcmp(f, "-w")) warmup = atoi(v);
        else if (!strcmp(f, "-o")) {
            for (int k = 0; k <= BARRIER; k++)
                if (!strcmp(v, NAMES[k])) op = k;
        } else {
            fprintf(stderr, "mpi_collectives: unknown flag %s\n", f);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (op < 0 || factor < 2 || iters < 1 || warmup < 0 || minb > maxb || maxb > (1u << 30)) {
        fprintf(stderr, "usage: mpi_collectives -o all_reduce|broadcast|reduce|all_gather|reduce_scatter|barrier "
                        "[-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int total = op == ALL_GATHER || op == REDUCE_SCATTER;
    size_t last = (size_t)-1;
    for (size_t s = op == BARRIER ? 0 : minb;; s *= factor) {
        size_t elems = s / sizeof(float);
        int per_rank = (int)(total ? elems / (size_t)size : elems);
        size_t moved = op == BARRIER ? 0 : (size_t)per_rank * (total ? (size_t)size : 1) * sizeof(float);
        if ((op != BARRIER && per_rank == 0) || moved == last) {
            if (s >= maxb) break;
            continue;
        }
        last = moved;
        size_t n_in = (size_t)per_rank * (size_t)(op == REDUCE_SCATTER ? size : 1);
        size_t n_out = (size_t)per_rank * (size_t)(op == ALL_GATHER ? size : 1);
        float *in = calloc(n_in + 1, sizeof *in), *out = calloc(n_out + 1, sizeof *out);
        if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 1);
        int wrong = wrong_after_check((enum op)op, in, out, per_rank, size, rank), wrong_all = 0;
        MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (wrong_all) {
            if (rank == 0) fprintf(stderr, "mpi_collectives: %s of %zu B: %d wrong elements\n", NAMES[op], moved, wrong_all);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        for (int i = 0; i < warmup; i++) call((enum op)op, in, out, per_rank, size);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_us();
        for (int i = 0; i < iters; i++) call((enum op)op, in, out, per_rank, size);
        double us = (now_us() - t0) / iters, sum = 0;
        MPI_Allreduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0) printf("%s %zu %.3f\n", NAMES[op], moved, sum / size);
        free(in);
        free(out);
        if (op == BARRIER || s >= maxb) break;
    }
    MPI_Finalize();
    return 0;
}
