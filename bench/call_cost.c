/* call_cost: instructions per small collective call on the calling thread,
 * for this library (default build) and for Open MPI (-DUSE_MPI), measured
 * the same way: rank 0 runs under callgrind with collection off
 * (--collect-atstart=no) and switches it on around each call only, then
 * dumps the counts (one file per call); before each call it sleeps 1 ms,
 * so that every peer (running natively) is already waiting and rank 0's
 * own wait ends at its first look: the count is the call's work, not its
 * waiting. On a loaded machine a peer can still be late now and then: the
 * script takes the median over the calls.
 *
 *   call_cost OP CALLS      OP: all_reduce (4 B float32 sum, in place),
 *                           broadcast (4 B from rank 0) or barrier
 *
 * scripts/callgrind-small.sh runs both and prints instructions per call.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <valgrind/callgrind.h>
#ifdef USE_MPI
#include <mpi.h>
#else
#include <torchcomm.h>
#endif

enum { ALL_REDUCE, BROADCAST, BARRIER };

#ifdef USE_MPI
static void call(int op, float *x) {
    if (op == ALL_REDUCE) MPI_Allreduce(MPI_IN_PLACE, x, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (op == BROADCAST) MPI_Bcast(x, 1, MPI_FLOAT, 0, MPI_COMM_WORLD);
    else MPI_Barrier(MPI_COMM_WORLD);
}
#else
static tc_comm_t *comm;
static void call(int op, float *x) {
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_result_t rc;
    if (op == ALL_REDUCE) rc = tc_all_reduce(comm, x, 1, TC_FLOAT32, sum, NULL, NULL);
    else if (op == BROADCAST) rc = tc_broadcast(comm, x, 1, TC_FLOAT32, 0, NULL, NULL);
    else rc = tc_barrier(comm, NULL, NULL);
    if (rc != TC_SUCCESS) {
        fprintf(stderr, "call failed: %s\n", tc_last_error());
        exit(1);
    }
}
#endif

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: call_cost all_reduce|broadcast|barrier CALLS\n");
        return 2;
    }
    int op = !strcmp(argv[1], "broadcast") ? BROADCAST : !strcmp(argv[1], "barrier") ? BARRIER : ALL_REDUCE;
    int calls = atoi(argv[2]), rank;
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#else
    tc_comm_options_t copts = TC_COMM_OPTIONS_INIT;
    copts.name = "call_cost";
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    if (tc_comm_new("gloo", cpu, &copts, &comm) != TC_SUCCESS) {
        fprintf(stderr, "tc_comm_new: %s\n", tc_last_error());
        return 1;
    }
    tc_comm_get_rank(comm, &rank);
#endif
    float x = 1;
    for (int i = 0; i < 20; i++) call(op, &x);
    struct timespec pause = {0, 1000000};
    for (int i = 0; i < calls; i++) {
        if (rank == 0) nanosleep(&pause, NULL);
        CALLGRIND_TOGGLE_COLLECT;
        call(op, &x);
        CALLGRIND_TOGGLE_COLLECT;
        CALLGRIND_DUMP_STATS; /* one file per call: the script takes the median */
    }
#ifdef USE_MPI
    MPI_Finalize();
#else
    tc_comm_finalize(comm);
    tc_comm_destroy(comm);
#endif
    return 0;
}
