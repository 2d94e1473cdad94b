/* async_under_compute: how long an asynchronous all_reduce takes to be seen
 * complete while its caller computes, polling tc_work_is_completed every
 * 50 us of computation (a CPU backward beside the exchange, in miniature).
 * Each of CALLS rounds starts after a barrier; rank 0 prints the spread
 * of the times until completion was seen.
 *
 *   cc -O2 -Iinclude bench/async_under_compute.c -Ltarget/release -ltorchcomm \
 *      -Wl,-rpath,$PWD/target/release -o build/async_under_compute
 *   TORCHCOMM_GLOO_SHM=0 tc-run -n 2 [--bind-to core] -- build/async_under_compute [CALLS] [COUNT]
 *
 * docs/performance.md, "Gloo's network thread under SCHED_BATCH on one CPU".
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <torchcomm.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static volatile double sink;

/* Floating-point work for `us` microseconds. */
static void compute(double us) {
  double t = now_us(), x = 1;
  while (now_us() - t < us)
    for (int i = 0; i < 200; i++) x = x * 1.0000001 + 1e-9;
  sink = x;
}

int main(int argc, char **argv) {
  int calls = argc > 1 ? atoi(argv[1]) : 100;
  size_t count = argc > 2 ? (size_t)atol(argv[2]) : 1;
  if (calls < 1 || calls > 100000 || count < 1) {
    fprintf(stderr, "usage: async_under_compute [CALLS (1..100000)] [COUNT (>= 1)]\n");
    return 2;
  }
  tc_comm_options_t copts = TC_COMM_OPTIONS_INIT;
  copts.name = "async_under_compute";
  tc_device_t cpu = {TC_DEVICE_CPU, 0};
  tc_comm_t *comm;
  if (tc_comm_new("gloo", cpu, &copts, &comm) != TC_SUCCESS) {
    fprintf(stderr, "tc_comm_new: %s\n", tc_last_error());
    return 1;
  }
  int rank;
  tc_comm_get_rank(comm, &rank);
  float *x = calloc(count, sizeof(float));
  double *t = calloc((size_t)calls, sizeof(double));
  if (x == NULL || t == NULL) return 1;
  tc_op_options_t async = TC_OP_OPTIONS_INIT;
  async.async_op = 1;
  tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
  for (int i = 0; i < calls; i++) {
    tc_work_t *work;
    if (tc_barrier(comm, NULL, NULL) != TC_SUCCESS ||
        tc_all_reduce(comm, x, count, TC_FLOAT32, sum, &async, &work) != TC_SUCCESS) {
      fprintf(stderr, "rank %d: %s\n", rank, tc_last_error());
      return 1;
    }
    double t0 = now_us();
    int done = 0;
    while (!done) {
      compute(50);
      tc_work_is_completed(work, &done);
    }
    t[i] = now_us() - t0;
    tc_work_free(work);
  }
  qsort(t, (size_t)calls, sizeof(double), by_value);
  if (rank == 0)
    printf("async all_reduce of %zu floats under computation, us until seen complete: "
           "p10 %.0f, median %.0f, p90 %.0f, max %.0f\n",
           count, t[calls / 10], t[calls / 2], t[9 * calls / 10], t[calls - 1]);
  free(x);
  free(t);
  tc_comm_finalize(comm);
  tc_comm_destroy(comm);
  return 0;
}
