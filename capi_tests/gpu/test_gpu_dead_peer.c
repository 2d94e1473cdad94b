/* A peer process that dies, two ranks of the nccl backend. Rank 1 leaves
   after a first all_reduce without cleaning anything up (_exit); rank 0's
   next all_reduce (per-operation timeout 20 s) must then fail rather than
   hang: with a remote error (TC_ERR_REMOTE: NCCL noticed the closed
   connection and set its asynchronous error) or with the timeout
   (TC_ERR_TIMEOUT, or TC_ERR_ABORTED once the watchdog aborted the comm),
   whichever comes first on this machine. The comm must then be broken
   (later calls fail) and finalize must report it. Prints "N passed, N
   failed" on rank 0. On the simulated NCCL the remote error is expected
   (TC_GPU_DEAD_PEER_REMOTE=1 demands it). */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>
#include "scenario.h"

int main(void) {
    pair_scenario_t s = pair_scenario_start("gpu_dead_peer");
    tc_result_t rc;
    if (s.rank == 1) _exit(0); /* gone, as a crashed process */

    s.opts.async_op = 1;
    s.opts.timeout_ms = 20000;
    tc_work_t *w = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = tc_all_reduce(s.comm, s.buf, 1024, TC_FLOAT32, s.sum, &s.opts, &w);
    expect(rc == TC_SUCCESS || rc == TC_ERR_REMOTE, "issue of the all_reduce whose peer is gone");
    if (rc == TC_SUCCESS) rc = tc_work_wait_blocking(w);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("rank 0: the all_reduce whose peer is gone ended with %s after %.1f s: %s\n", tc_result_string(rc), secs, tc_last_error());
    if (env_int("TC_GPU_DEAD_PEER_REMOTE", 0))
        expect(rc == TC_ERR_REMOTE && secs < 15, "TC_ERR_REMOTE before the 20 s timeout");
    else
        expect(rc == TC_ERR_REMOTE || rc == TC_ERR_TIMEOUT || rc == TC_ERR_ABORTED, "a remote error or the timeout, not a hang");
    expect(secs < 45, "ended within 45 s");
    tc_work_free(w);
    pair_scenario_expect_broken(&s);
    return pair_scenario_end(&s);
}
