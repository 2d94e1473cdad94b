/* A peer process that dies, two ranks of the nccl backend, on the simulated
   driver and NCCL only (a test double scenario: the fake NCCL notices that
   the process a receive waits for is gone and reports ncclRemoteError as
   the comm's asynchronous error, as real NCCL does when a peer's connection
   closes; how fast real NCCL notices is not modeled). Rank 1 leaves after a
   first all_reduce without cleaning anything up (_exit); rank 0's next
   all_reduce must then fail with TC_ERR_REMOTE well before its 60 s
   timeout, the comm must be aborted (later calls TC_ERR_ABORTED) and
   finalize must report the failure. Prints "N passed, N failed" on rank 0. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>
#include "scenario.h"

int main(void) {
    pair_scenario_t s = pair_scenario_start("sim_peer_exit");
    tc_result_t rc;
    if (s.rank == 1) _exit(0); /* gone, as a crashed process */

    s.opts.async_op = 1;
    tc_work_t *w = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = tc_all_reduce(s.comm, s.buf, 1024, TC_FLOAT32, s.sum, &s.opts, &w);
    expect(rc == TC_SUCCESS, "issue of the all_reduce whose peer is gone");
    rc = tc_work_wait_blocking(w);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("rank 0: wait_blocking returned %s after %.1f s: %s\n", tc_result_string(rc), secs, tc_last_error());
    expect(rc == TC_ERR_REMOTE, "wait_blocking fails with TC_ERR_REMOTE");
    expect(secs < 20, "the failure is reported long before the 60 s timeout");
    tc_work_free(w);
    pair_scenario_expect_broken(&s);
    return pair_scenario_end(&s);
}
