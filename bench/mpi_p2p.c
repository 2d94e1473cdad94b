/* mpi_p2p: Open MPI point-to-point between ranks 0 and 1, OSU-style, the
 * same method, sizes, counts and units as tc-osu's shared-memory column (and
 * bench/torch_p2p.py): latency = half a ping-pong round trip
 * (MPI_Send/MPI_Recv, microseconds), bandwidth = a window of
 * MPI_Isend/MPI_Irecv of one buffer closed by a 4-byte reply
 * (MB/s = 10^6 bytes/s); each value is the median of the rounds. Before the
 * timed loops of a size, rank 1 checks every byte of one patterned message.
 * Rank 0 writes `size value` lines to LAT and BW (tc-osu --extra reads
 * them). The transport is whatever mpirun selects (scripts/bench-p2p.sh
 * passes --mca btl self,vader: shared memory).
 *
 *   mpirun -np 2 mpi_p2p [-b 1] [-e 16M] [-r 3] LAT BW
 */
#define _POSIX_C_SOURCE 200809L

#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static size_t clamp(size_t v, size_t lo, size_t hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* Ping-pongs per round, as tc-osu's shared-memory path. */
static size_t pingpongs(size_t len) {
  return clamp((32u << 20) / (len > 4096 ? len : 4096), 20, 2000);
}

static void die(const char *what) {
  fprintf(stderr, "mpi_p2p: %s\n", what);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Rank 0 sends one message of pattern bytes; rank 1 checks every byte. */
static void check_exchange(unsigned char *buf, size_t len, int rank) {
  if (rank == 0) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 7 + 3);
    MPI_Send(buf, (int)len, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
    return;
  }
  memset(buf, 0, len);
  MPI_Recv(buf, (int)len, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  for (size_t i = 0; i < len; i++)
    if (buf[i] != (unsigned char)(i * 7 + 3)) die("received data is wrong");
}

/* Half the round trip, microseconds (meaningful on rank 0). */
static double latency(unsigned char *buf, size_t len, int rank) {
  size_t n = pingpongs(len), warm = n / 10 > 2 ? n / 10 : 2;
  int peer = 1 - rank;
  double t0 = 0;
  for (size_t i = 0; i < warm + n; i++) {
    if (i == warm) t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
      MPI_Recv(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
    }
  }
  return (MPI_Wtime() - t0) * 1e6 / (2.0 * (double)n);
}

/* MB/s over windows of non-blocking sends of one buffer (meaningful on rank
 * 0); window, window count and warm-up windows as tc-osu's shared-memory
 * path. */
static double bandwidth(unsigned char *buf, size_t len, int rank) {
  size_t window = clamp((64u << 20) / len, 2, 64);
  size_t windows = clamp((256u << 20) / (window * len), 2, 100);
  size_t warm = clamp(windows / 10, 1, 10);
  MPI_Request reqs[64];
  unsigned char ack[4] = {0};
  int peer = 1 - rank;
  double t0 = 0;
  for (size_t w = 0; w < windows + warm; w++) {
    if (w == warm) t0 = MPI_Wtime();
    for (size_t k = 0; k < window; k++) {
      if (rank == 0)
        MPI_Isend(buf, (int)len, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &reqs[k]);
      else
        MPI_Irecv(buf, (int)len, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &reqs[k]);
    }
    MPI_Waitall((int)window, reqs, MPI_STATUSES_IGNORE);
    if (rank == 0)
      MPI_Recv(ack, 4, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    else
      MPI_Send(ack, 4, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
  }
  return (double)(window * windows * len) / (MPI_Wtime() - t0) / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static void usage(void) {
  fprintf(stderr, "usage: mpirun -np 2 mpi_p2p [-b MIN] [-e MAX] [-r ROUNDS] LAT BW\n");
  exit(2);
}

int main(int argc, char **argv) {
  size_t min = 1, max = 16u << 20;
  int rounds = 3, argi = 1;
  for (; argi + 1 < argc && argv[argi][0] == '-'; argi += 2) {
    if (!strcmp(argv[argi], "-b")) min = parse_size(argv[argi + 1]);
    else if (!strcmp(argv[argi], "-e")) max = parse_size(argv[argi + 1]);
    else if (!strcmp(argv[argi], "-r")) rounds = atoi(argv[argi + 1]);
    else usage();
  }
  if (argc - argi != 2 || rounds < 1 || max > (1u << 30)) usage();
  if (min < 1) min = 1;
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 2) die("needs exactly 2 ranks (mpirun -np 2)");
  unsigned char *buf = malloc(max > min ? max : min);
  double *lats = malloc(sizeof(double) * (size_t)rounds), *bws = malloc(sizeof(double) * (size_t)rounds);
  FILE *lat_file = NULL, *bw_file = NULL;
  if (!buf || !lats || !bws) die("out of memory");
  if (rank == 0 && (!(lat_file = fopen(argv[argi], "w")) || !(bw_file = fopen(argv[argi + 1], "w"))))
    die("cannot open the output files");
  for (size_t len = min; len <= max; len *= 2) {
    check_exchange(buf, len, rank);
    memset(buf, 7, len);
    for (int r = 0; r < rounds; r++) {
      lats[r] = latency(buf, len, rank);
      bws[r] = bandwidth(buf, len, rank);
    }
    if (rank == 0) {
      fprintf(lat_file, "%zu %.6g\n", len, median(lats, rounds));
      fprintf(bw_file, "%zu %.6g\n", len, median(bws, rounds));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && (fclose(lat_file) != 0 || fclose(bw_file) != 0)) die("cannot write the output files");
  free(buf);
  free(lats);
  free(bws);
  MPI_Finalize();
  return 0;
}
