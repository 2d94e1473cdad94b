/* The floor of a 2-process shared-memory exchange, by how many cache lines
 * a sync moves: each round, both processes write a 4-byte value and a
 * 3-word fingerprint, publish the round's number, wait for the other's,
 * check its fingerprint and read its value, as the shared-memory
 * collectives' one-sync all_reduce does, with no library in between.
 *
 *   layout 1: number, fingerprint and value in one line per parity of the
 *             round (the sync lines of src/backends/gloo/shared_memory/engine)
 *   layout 2: number and both parities' fingerprints in one line, the value
 *             in a line of its own per parity
 *   layout 3: number, fingerprints and values in three lines (the layout
 *             before the sync lines)
 *
 *   cc -O2 bench/sync_lines.c -o sync_lines && ./sync_lines ROUNDS [LAYOUT...]
 *
 * Pins the two processes to CPUs 0 and 1; prints ns per round, layouts
 * interleaved 5 times (median [min, max]). */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SEG 65536

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static _Atomic uint64_t *word(char *seg, size_t at) { return (_Atomic uint64_t *)(seg + at); }

/* Where round i's number, fingerprint and value live in a segment. */
static void places(int layout, uint64_t i, size_t *num, size_t *fp, size_t *val) {
  int h = i & 1;
  switch (layout) {
  case 1: *num = h * 64; *fp = h * 64 + 8; *val = h * 64 + 32; break;
  case 2: *num = 0; *fp = 16 + h * 24; *val = 4096 + h * 2048; break;
  default: *num = 0; *fp = 64 + h * 32; *val = 4096 + h * 2048; break;
  }
}

/* One process's side of `rounds` rounds; ns per round (after 1,000). */
static double side(int layout, char *mine, char *theirs, long rounds) {
  double t0 = 0;
  volatile float acc = 0;
  for (uint64_t i = 1; i <= (uint64_t)rounds; i++) {
    if (i == 1000) t0 = now_ns();
    size_t num, fp, val;
    places(layout, i, &num, &fp, &val);
    float x = (float)i;
    memcpy(mine + val, &x, 4);
    for (int k = 0; k < 3; k++) atomic_store_explicit(word(mine, fp + 8 * k), i + k, memory_order_relaxed);
    atomic_store_explicit(word(mine, num), i, memory_order_seq_cst);
    while (atomic_load_explicit(word(theirs, num), memory_order_acquire) < i) __builtin_ia32_pause();
    if (atomic_load_explicit(word(theirs, fp), memory_order_relaxed) != i) {
      fprintf(stderr, "round %lu: the other's fingerprint is not this round's\n", (unsigned long)i);
      exit(1);
    }
    float y;
    memcpy(&y, theirs + val, 4);
    acc += y;
  }
  return (now_ns() - t0) / (rounds - 999);
}

static double run(int layout, long rounds) {
  char *mem = mmap(NULL, 2 * SEG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) { perror("mmap"); exit(1); }
  memset(mem, 0, 2 * SEG);
  pid_t pid = fork();
  int me = pid == 0;
  alarm(120); /* a side that failed leaves the other waiting: end it */
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(me, &cpus);
  sched_setaffinity(0, sizeof cpus, &cpus);
  double ns = side(layout, mem + me * SEG, mem + (1 - me) * SEG, rounds);
  if (me) _exit(0);
  int status;
  waitpid(pid, &status, 0);
  munmap(mem, 2 * SEG);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) exit(1);
  return ns;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s ROUNDS [LAYOUT...]\n", argv[0]);
    return 2;
  }
  long rounds = atol(argv[1]);
  int layouts[3] = {1, 2, 3}, n = 3;
  if (argc > 2) {
    n = 0;
    for (int i = 2; i < argc && n < 3; i++) layouts[n++] = atoi(argv[i]);
  }
  double t[3][5];
  for (int k = 0; k < 5; k++)
    for (int j = 0; j < n; j++) t[j][k] = run(layouts[j], rounds);
  for (int j = 0; j < n; j++) {
    qsort(t[j], 5, sizeof(double), by_value);
    printf("layout %d: %.1f ns per round [%.1f, %.1f]\n", layouts[j], t[j][2], t[j][0], t[j][4]);
  }
  return 0;
}
