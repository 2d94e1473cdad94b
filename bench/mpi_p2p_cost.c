/* mpi_p2p_cost: Open MPI's side of scripts/p2p-cost.sh, the same calls as
 * tc-osu --cost and --cost-async: rank 0 makes N blocking 4-byte sends
 * (MPI_Send) to rank 1, both ranks meet at a barrier, then rank 1 makes
 * the N receives (MPI_Recv), every message already there; with "async",
 * the same in windows of 64 MPI_Isend / MPI_Irecv closed by MPI_Waitall.
 * Run under callgrind with --toggle-collect='cost_*': the instructions of
 * cost_sends / cost_receives (cost_isends / cost_ireceives) divided by N.
 *
 *   mpirun -np 2 --mca btl self,vader mpi_p2p_cost N [async]
 */
#include <mpi.h>
#include <stdlib.h>

#define WINDOW 64

__attribute__((noinline)) void cost_sends(char *b, int n) {
  for (int i = 0; i < n; i++) MPI_Send(b, 4, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
}

__attribute__((noinline)) void cost_receives(char *b, int n) {
  for (int i = 0; i < n; i++) MPI_Recv(b, 4, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

static void windows(char *b, int n, int send) {
  MPI_Request r[WINDOW];
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (send)
      MPI_Isend(b, 4, MPI_BYTE, 1, 0, MPI_COMM_WORLD, &r[k++]);
    else
      MPI_Irecv(b, 4, MPI_BYTE, 0, 0, MPI_COMM_WORLD, &r[k++]);
    if (k == WINDOW || i + 1 == n) {
      MPI_Waitall(k, r, MPI_STATUSES_IGNORE);
      k = 0;
    }
  }
}

__attribute__((noinline)) void cost_isends(char *b, int n) { windows(b, n, 1); }
__attribute__((noinline)) void cost_ireceives(char *b, int n) { windows(b, n, 0); }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int me;
  int n = argc > 1 ? atoi(argv[1]) : 1000;
  int async = argc > 2;
  char b[4] = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  /* One exchange first, so that no first-call work is counted. */
  if (me == 0)
    MPI_Send(b, 4, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
  else if (me == 1)
    MPI_Recv(b, 4, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  if (me == 0) async ? cost_isends(b, n) : cost_sends(b, n);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 1) async ? cost_ireceives(b, n) : cost_receives(b, n);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
