/* first_calls: how the first calls of a fresh comm compare with warm ones.
 *
 * Every rank creates a "gloo" comm (timed: tc_comm_new), then makes N calls
 * of one small operation (4 B float32 all_reduce SUM by default) and times
 * each call on its own. Around every call it also reads the CPU the thread
 * runs on (sched_getcpu), its minor page faults and its voluntary and
 * involuntary context switches (getrusage RUSAGE_THREAD), so that a slow
 * call can be told apart: page faults of fresh memory, sleeps (voluntary
 * switches), preemption (involuntary), or ranks sharing a CPU.
 *
 *   tc-run -n 2 -- first_calls [-n CALLS] [-o all_reduce|broadcast|barrier]
 *                              [-v 1] [-b BYTES] [-p same|apart] [-a 1]
 *
 * -p pins every rank, after tc_comm_new, to CPU 0 (same: what the
 * scheduler does when it puts the ranks on one CPU of several) or to CPU
 * rank % CPUs (apart). The library itself sets no affinity; pinning before
 * tc_comm_new would change what it sees (the CPUs it may use).
 *
 * -a 1 aligns the ranks before the first call: each sleeps until the same
 * instant of the host's clock (the next 100 ms boundary at least 50 ms
 * away, timer slack 1 ns), so that the first call measures its own cost,
 * not how much later a peer left tc_comm_new.
 *
 * After the timed calls, "pause" lines: a warm call made after each rank
 * busy-waited (never sleeping) until a common instant 1, 10 or 100 ms
 * away, the median of 5 such calls; and beside it the same for no library
 * at all: a chase through 256 cache lines (16 KiB, the size of a call's
 * footprint) after the same pause, against the same chase back to back.
 * Whatever a pause costs the chase is the machine's, not the library's.
 *
 * Built with -DUSE_MPI (mpicc) it measures Open MPI the same way
 * (MPI_Init in place of tc_comm_new, MPI_Allreduce in place); run it
 * with mpirun.
 *
 * Rank 0 prints, per rank: tc_comm_new's time, the first call, the median
 * of the first 100 calls, the median of the last half (warm), their
 * ratios, the means of the same calls (ranks that share a CPU alternate
 * short and long calls, which medians hide), the faults and switches of
 * the first call and of the rest, and
 * how many calls ran on the same CPU as rank 0's at that call. With -v 1
 * every call of rank 0 is printed. Figures only; it checks the sums.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#ifdef USE_MPI
#include <mpi.h>
#else
#include <torchcomm.h>
#endif

#ifdef USE_MPI
#define TRY(call)                                                   \
    do {                                                            \
        if ((call) != MPI_SUCCESS) {                                \
            fprintf(stderr, "%s failed\n", #call);                   \
            exit(1);                                                \
        }                                                           \
    } while (0)
#else
#define TRY(call)                                                                                 \
    do {                                                                                          \
        tc_result_t rc_ = (call);                                                                 \
        if (rc_ != TC_SUCCESS) {                                                                  \
            fprintf(stderr, "%s failed: %s: %s\n", #call, tc_result_string(rc_), tc_last_error()); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#endif

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Per call: time, CPU, minor faults, voluntary and involuntary switches. */
enum { F_US, F_CPU, F_FLT, F_VCSW, F_IVCSW, FIELDS };

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double mean(const double *v, int n) {
    double t = 0;
    for (int i = 0; i < n; i++) t += v[i];
    return t / n;
}

static double median(const double *v, int n) {
    double *s = malloc((size_t)n * sizeof *s);
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp);
    double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    free(s);
    return m;
}

/* The library under test: start, one call, everything to rank 0, end. */
#ifdef USE_MPI
static void start(int *argc, char ***argv, int *rank, int *size) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
}
static void one_call(const char *op, float *x, size_t count) {
    if (!strcmp(op, "barrier")) TRY(MPI_Barrier(MPI_COMM_WORLD));
    else if (!strcmp(op, "broadcast")) TRY(MPI_Bcast(x, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD));
    else TRY(MPI_Allreduce(MPI_IN_PLACE, x, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
}
static void gather(double *all, double *mine, size_t n) {
    TRY(MPI_Allgather(mine, (int)n, MPI_DOUBLE, all, (int)n, MPI_DOUBLE, MPI_COMM_WORLD));
}
static void finish(void) { MPI_Finalize(); }
#else
static tc_comm_t *comm;
static void start(int *argc, char ***argv, int *rank, int *size) {
    (void)argc, (void)argv;
    tc_comm_options_t copts = TC_COMM_OPTIONS_INIT;
    copts.name = "first_calls";
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    TRY(tc_comm_new("gloo", cpu, &copts, &comm));
    TRY(tc_comm_get_rank(comm, rank));
    TRY(tc_comm_get_size(comm, size));
}
static void one_call(const char *op, float *x, size_t count) {
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    if (!strcmp(op, "barrier")) TRY(tc_barrier(comm, NULL, NULL));
    else if (!strcmp(op, "broadcast")) TRY(tc_broadcast(comm, x, count, TC_FLOAT32, 0, NULL, NULL));
    else TRY(tc_all_reduce(comm, x, count, TC_FLOAT32, sum, NULL, NULL));
}
static void gather(double *all, double *mine, size_t n) {
    TRY(tc_all_gather_single(comm, all, mine, n, TC_FLOAT64, NULL, NULL));
}
static void finish(void) { tc_comm_destroy(comm); }
#endif

/* The next instant of the host's clock that is a multiple of `period_ns`
 * and at least half a period away: every rank computes the same one. */
static struct timespec common_instant(long long period_ns) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long ns = (long long)t.tv_sec * 1000000000LL + t.tv_nsec + period_ns / 2;
    ns = (ns / period_ns + 1) * period_ns;
    t.tv_sec = (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    return t;
}

static int before(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Busy-waits (never yielding the CPU) until `t`. */
static void spin_until(const struct timespec *t) {
    struct timespec now;
    do clock_gettime(CLOCK_REALTIME, &now);
    while (before(&now, t));
}

/* The library-free control: a dependent walk through CHASE_LINES cache
 * lines spread over 8 times the space (no prefetcher help). */
enum { CHASE_LINES = 256 };
static size_t *chase_ring(void) {
    size_t stride = 64 / sizeof(size_t) * 8, *ring = aligned_alloc(64, CHASE_LINES * stride * sizeof(size_t));
    size_t order[CHASE_LINES];
    for (size_t i = 0; i < CHASE_LINES; i++) order[i] = i * stride;
    srand(1);
    for (size_t i = CHASE_LINES - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < CHASE_LINES; i++) ring[order[i]] = order[(i + 1) % CHASE_LINES];
    return ring;
}
static double chase_us(const size_t *ring) {
    double s = now_us();
    volatile size_t p = 0;
    size_t q = p;
    for (int i = 0; i < CHASE_LINES; i++) q = ring[q];
    p = q;
    return now_us() - s;
}

/* Rank 0's "pause" lines: median of 5 of a warm call, and of the chase,
 * each after a busy-waited pause, against the same back to back. */
static void pauses(int rank, const char *op, float *x, size_t count) {
    static const long long pause_ms[] = {1, 10, 100};
    size_t *ring = chase_ring();
    double call[5], next[5], chase[5], again[5];
    for (size_t p = 0; p < sizeof pause_ms / sizeof *pause_ms; p++) {
        for (int rep = 0; rep < 5; rep++) {
            struct timespec t = common_instant(pause_ms[p] * 1000000LL);
            spin_until(&t);
            double s = now_us();
            one_call(op, x, count);
            double m = now_us();
            one_call(op, x, count);
            next[rep] = now_us() - m;
            call[rep] = m - s;
            t = common_instant(pause_ms[p] * 1000000LL);
            spin_until(&t);
            chase[rep] = chase_us(ring);
            again[rep] = chase_us(ring);
        }
        if (rank == 0)
            printf("# pause %4lld ms: warm call after it %8.2f us, the next %6.2f us; no library: %d-line chase after "
                   "it %7.2f us, back to back %5.2f us\n",
                   pause_ms[p], median(call, 5), median(next, 5), CHASE_LINES, median(chase, 5), median(again, 5));
    }
    free(ring);
}

int main(int argc, char **argv) {
    int calls = 400, verbose = 0, align = 0;
    size_t bytes = 4;
    const char *op = "all_reduce", *pin = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) calls = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-o")) op = argv[i + 1];
        else if (!strcmp(argv[i], "-v")) verbose = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-b")) bytes = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "-p")) pin = argv[i + 1];
        else if (!strcmp(argv[i], "-a")) align = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: first_calls [-n CALLS] [-o all_reduce|broadcast|barrier] [-v 1] [-b BYTES] [-p same|apart] [-a 1]\n");
            return 2;
        }
    }
    if (calls < 4) calls = 4;
    size_t count = bytes / sizeof(float) ? bytes / sizeof(float) : 1;
    int rank, size;
    double t0 = now_us();
    start(&argc, &argv, &rank, &size);
    double new_us = now_us() - t0;
    if (pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        CPU_SET(!strcmp(pin, "same") ? 0 : (int)(rank % (cpus > 0 ? cpus : 1)), &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
            perror("sched_setaffinity");
            return 2;
        }
    }
    float *x = malloc(count * sizeof *x);
    if (align) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        struct timespec t = common_instant(100000000LL);
        clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &t, NULL);
    }
    double *rec = calloc((size_t)calls * FIELDS, sizeof *rec);
    for (int c = 0; c < calls; c++) {
        for (size_t i = 0; i < count; i++) x[i] = (float)(rank + 1);
        struct rusage r0, r1;
        getrusage(RUSAGE_THREAD, &r0);
        int where = sched_getcpu();
        double s = now_us();
        one_call(op, x, count);
        double us = now_us() - s;
        getrusage(RUSAGE_THREAD, &r1);
        double *f = rec + (size_t)c * FIELDS;
        f[F_US] = us;
        f[F_CPU] = where;
        f[F_FLT] = (double)(r1.ru_minflt - r0.ru_minflt);
        f[F_VCSW] = (double)(r1.ru_nvcsw - r0.ru_nvcsw);
        f[F_IVCSW] = (double)(r1.ru_nivcsw - r0.ru_nivcsw);
        float want = !strcmp(op, "all_reduce") ? (float)(size * (size + 1) / 2) : 1.0f;
        if (strcmp(op, "barrier") && x[0] != want) {
            fprintf(stderr, "rank %d: call %d: got %g, want %g\n", rank, c, x[0], want);
            return 3;
        }
    }
    /* Everything to rank 0 through the comm itself (after the timed calls). */
    size_t per_rank = (size_t)calls * FIELDS + 1;
    double *mine = malloc(per_rank * sizeof *mine);
    memcpy(mine, rec, (size_t)calls * FIELDS * sizeof *mine);
    mine[per_rank - 1] = new_us;
    double *all = malloc(per_rank * (size_t)size * sizeof *all);
    gather(all, mine, per_rank);
    if (rank == 0) {
        printf("# first_calls: %s of %zu B, %d ranks, %d calls each; times in microseconds\n", op, count * sizeof(float),
               size, calls);
        printf("# rank  comm_new  first  med_first100  med_warm  first/warm  med100/warm  mean_first100  mean_warm  "
               "flt_first  flt_rest  vcsw_rest  ivcsw_rest  same_cpu_as_0\n");
        double *us = malloc((size_t)calls * sizeof *us);
        for (int r = 0; r < size; r++) {
            double *rr = all + (size_t)r * per_rank, *r0 = all;
            for (int c = 0; c < calls; c++) us[c] = rr[(size_t)c * FIELDS + F_US];
            int first100 = calls < 100 ? calls : 100;
            double warm = median(us + calls / 2, calls - calls / 2);
            double m100 = median(us, first100);
            double flt_rest = 0, vcsw = 0, ivcsw = 0;
            int same = 0;
            for (int c = 1; c < calls; c++) {
                flt_rest += rr[(size_t)c * FIELDS + F_FLT];
                vcsw += rr[(size_t)c * FIELDS + F_VCSW];
                ivcsw += rr[(size_t)c * FIELDS + F_IVCSW];
            }
            for (int c = 0; c < calls; c++) same += rr[(size_t)c * FIELDS + F_CPU] == r0[(size_t)c * FIELDS + F_CPU];
            printf("%6d %9.0f %6.1f %13.2f %9.2f %11.1f %12.2f %14.2f %10.2f %10.0f %9.0f %10.0f %11.0f %8d/%d\n", r,
                   rr[per_rank - 1], us[0], m100, warm, us[0] / warm, m100 / warm, mean(us, first100),
                   mean(us + calls / 2, calls - calls / 2), rr[F_FLT], flt_rest, vcsw, ivcsw, same, calls);
        }
        if (verbose) {
            printf("# call  us  cpu  flt  vcsw  ivcsw (rank 0)\n");
            for (int c = 0; c < calls; c++) {
                double *f = all + (size_t)c * FIELDS;
                printf("%5d %8.2f %3.0f %3.0f %3.0f %3.0f\n", c, f[F_US], f[F_CPU], f[F_FLT], f[F_VCSW], f[F_IVCSW]);
            }
        }
        free(us);
    }
    free(all);
    free(mine);
    free(rec);
    pauses(rank, op, x, count);
    free(x);
    finish();
    return 0;
}
