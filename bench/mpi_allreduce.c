/* mpi_allreduce: Open MPI's all-reduce on the same sweep as tc-perf and
 * gloo_direct, printed in the same columns, as the figure to beat.
 *
 * One MPI_Allreduce per operation: float32, MPI_SUM, in place (MPI_IN_PLACE),
 * on MPI_COMM_WORLD, blocking, as tc-perf's default mode and gloo_direct do.
 * Time = mean over ranks of elapsed / iterations, after the warm-up and a
 * barrier. With -c 1 (default) every size is checked once more on fresh
 * non-zero data (small integers, exact sums), every element on every rank.
 * The transport is whatever mpirun selects: pass --mca btl self,vader for
 * shared memory or --mca btl self,tcp for TCP loopback; the header names the
 * btl when it was given.
 *
 *   mpirun -np 2 mpi_allreduce [-b 4] [-e 64M] [-f 2] [-n 20] [-w 5] [-c 1]
 *                              [--csv FILE] [--label NAME]
 */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static size_t parse_size(const char *s) {
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    default: break;
  }
  return (size_t)v;
}

/* Element i of rank r's input for check run `seed`: an integer in 1..5. */
static float value(int r, size_t i, uint64_t seed) {
  uint64_t x = ((uint64_t)r << 48) ^ (seed << 32) ^ (uint64_t)i;
  x *= 0x9e3779b97f4a7c15ULL;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 32;
  return (float)(1 + x % 5);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double sum_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

static void usage(void) {
  fprintf(stderr, "usage: mpi_allreduce [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1] "
                  "[--csv FILE] [--label NAME]\n");
}

int main(int argc, char **argv) {
  size_t minb = 4, maxb = (size_t)64 << 20, factor = 2;
  int iters = 20, warmup = 5, check = 1;
  const char *csv_path = NULL, *label = "mpi";
  MPI_Init(&argc, &argv);
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "mpi_allreduce: %s needs a value\n", f);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *v = argv[++i];
    if (!strcmp(f, "-b")) minb = parse_size(v);
    else if (!strcmp(f, "-e")) maxb = parse_size(v);
    else if (!strcmp(f, "-f")) factor = parse_size(v);
    else if (!strcmp(f, "-n")) iters = atoi(v);
    else if (!strcmp(f, "-w")) warmup = atoi(v);
    else if (!strcmp(f, "-c")) check = atoi(v);
    else if (!strcmp(f, "-o")) {
      if (strcmp(v, "all_reduce") != 0) {
        fprintf(stderr, "mpi_allreduce: only all_reduce\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else if (!strcmp(f, "--csv")) csv_path = v;
    else if (!strcmp(f, "--label")) label = v;
    else {
      fprintf(stderr, "mpi_allreduce: unknown flag %s\n", f);
      usage();
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (factor < 2 || iters < 1 || warmup < 0 || minb > maxb || maxb / sizeof(float) > 2147483647u) {
    usage();
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  FILE *csv = NULL;
  if (rank == 0 && csv_path != NULL) {
    struct stat st;
    int fresh = stat(csv_path, &st) != 0 || st.st_size == 0;
    csv = fopen(csv_path, "a");
    if (csv == NULL) {
      perror(csv_path);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (fresh)
      fprintf(csv, "system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong\n");
  }
  if (rank == 0) {
    const char *btl = getenv("OMPI_MCA_btl");
    printf("# mpi_allreduce: all_reduce (MPI_Allreduce, MPI_IN_PLACE, btl %s) %d ranks, iters %d, warm-up %d, check %d\n#\n",
           btl ? btl : "default", size, iters, warmup, check);
    printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "", "", "", "", "", "out-of-place", "", "",
           "", "in-place", "", "", "");
    printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
           "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    printf("# %10s %12s %9s %6s %5s   %9s %7s %7s %6s   %9s %7s %7s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  const double factor_bus = 2.0 * (size - 1) / size;
  double bus_sum = 0;
  int bus_n = 0;
  uint64_t wrong_total = 0, seed = 0;
  size_t last = 0;
  for (size_t s = minb;; s = s * factor < maxb ? s * factor : maxb) {
    size_t count = s / sizeof(float), bytes = count * sizeof(float);
    if (count > 0 && bytes != last) {
      last = bytes;
      float *buf = malloc(bytes);
      if (buf == NULL) {
        fprintf(stderr, "mpi_allreduce: out of memory for %zu bytes\n", bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      seed++;
      for (size_t i = 0; i < count; i++) buf[i] = value(rank, i, seed);
      for (int i = 0; i < warmup; i++)
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_us();
      for (int i = 0; i < iters; i++)
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double us = (now_us() - t0) / iters;
      us = sum_over_ranks(us) / size;
      long long wrong = -1;
      if (check) {
        seed++;
        for (size_t i = 0; i < count; i++) buf[i] = value(rank, i, seed);
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double w = 0;
        for (size_t i = 0; i < count; i++) {
          float want = 0;
          for (int r = 0; r < size; r++) want += value(r, i, seed);
          if (buf[i] != want) w++;
        }
        wrong = (long long)sum_over_ranks(w);
        wrong_total += (uint64_t)wrong;
      }
      free(buf);
      double algbw = (double)bytes / (us * 1e-6) / 1e9, busbw = algbw * factor_bus;
      bus_sum += busbw;
      bus_n++;
      if (rank == 0) {
        char w[32];
        if (wrong >= 0) snprintf(w, sizeof w, "%lld", wrong);
        else snprintf(w, sizeof w, "N/A");
        printf("  %10zu %12zu %9s %6s %5s   %9s %7s %7s %6s   %9.2f %7.3f %7.3f %6s\n", bytes, count, "float32", "sum",
               "-1", "N/A", "N/A", "N/A", "N/A", us, algbw, busbw, w);
        if (csv)
          fprintf(csv, "%s,all_reduce,%d,%zu,%zu,float32,sum,-1,in-place,%.3f,%.6f,%.6f,%lld\n", label, size, bytes,
                  count, us, algbw, busbw, wrong);
      }
    }
    if (s >= maxb) break;
  }
  if (rank == 0) {
    printf("# Out of bounds values : %" PRIu64 " %s\n", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
    if (bus_n > 0) printf("# Avg bus bandwidth    : %.6f \n#\n", bus_sum / bus_n);
    fflush(stdout);
  }
  if (csv) fclose(csv);
  MPI_Finalize();
  return wrong_total == 0 ? 0 : 1;
}
