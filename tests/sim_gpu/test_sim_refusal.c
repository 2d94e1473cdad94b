/* A collective refused on one rank of the nccl backend, two ranks, on the
   simulated driver and NCCL. A peer cannot be told inside NCCL: rank 1's
   refusal (an unknown dtype) fails only rank 1, which publishes its reason
   in the comm's store; rank 0's all_reduce waits until its timeout (3 s
   here), and that timeout error must name rank 1 and the argument. Prints
   "N passed, N failed" on each rank. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <unistd.h>
#include "scenario.h"

int main(void) {
    pair_scenario_t s = pair_scenario_start("sim_refusal");
    tc_result_t rc;
    if (s.rank == 1) {
        rc = tc_all_reduce(s.comm, s.buf, 1024, (tc_dtype_t)99, s.sum, &s.opts, NULL);
        printf("rank 1: refused: %s: %s\n", tc_result_string(rc), tc_last_error());
        expect(rc == TC_ERR_INVALID_ARGUMENT, "rank 1's call is refused");
        /* Alive until rank 0 timed out (a process that exits is another failure). */
        sleep(8);
        printf("%d passed, %d failed\n", passed, failed);
        fflush(stdout);
        _exit(failed != 0);
    }
    s.opts.async_op = 1;
    s.opts.timeout_ms = 3000;
    tc_work_t *w = NULL;
    rc = tc_all_reduce(s.comm, s.buf, 1024, TC_FLOAT32, s.sum, &s.opts, &w);
    expect(rc == TC_SUCCESS, "issue of the all_reduce rank 1 refused");
    rc = tc_work_wait_blocking(w);
    const char *e = tc_last_error();
    printf("rank 0: wait_blocking returned %s: %s\n", tc_result_string(rc), e);
    expect(rc == TC_ERR_TIMEOUT, "the peer's all_reduce times out");
    expect(strstr(e, "rank 1 refused this call") != NULL, "the timeout names the refusing rank");
    expect(strstr(e, "'dtype'") != NULL, "the timeout names the argument");
    tc_work_free(w);
    return pair_scenario_end(&s);
}
