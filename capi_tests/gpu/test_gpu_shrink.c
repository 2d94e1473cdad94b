/* tc_comm_shrink on the nccl backend (ncclCommShrink), in the GPU suite
   (part 3, 4 ranks) and on the simulated NCCL. With 4 ranks: ranks 0, 2 and 3 shrink a healthy
   comm excluding rank 1, which takes no part; the new comm ranks them 0, 1,
   2 in their old order and all-reduces correctly; the parent stays usable
   for all four. After tc_comm_abort the parent has no NCCL comm left, so a
   shrink is TC_ERR_UNSUPPORTED saying why. With "old" (2 ranks, an NCCL
   without ncclCommShrink; make sim-gpu-test runs it on its NCCL 2.18
   double): TC_ERR_UNSUPPORTED naming the version. With "failure" (4 ranks,
   simulated NCCL only: make sim-gpu-test): rank 1 dies while the
   others are in an all_reduce; the 3 survivors see the error, shrink
   (the failure revoked the NCCL comm: ncclCommRevoke, NCCL 2.28+) and
   all-reduce correctly on the new comm. With "failure-norevoke" (the same
   on an NCCL 2.27 double, which has ncclCommShrink but no
   ncclCommRevoke): the shrink is TC_ERR_UNSUPPORTED naming
   ncclCommRevoke and the version. Prints "N passed, N failed" on every
   surviving rank. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <unistd.h>
#include "scenario.h"

/* Rank 1 dies while ranks 0, 2 and 3 all-reduce; they shrink
   the failed comm excluding it. */
static void after_failure(tc_comm_t *comm, int R, void *d, tc_op_options_t *o, int revoke) {
    expect(scenario_all_reduce_of(comm, d, 1, o) == 4, "warm-up all_reduce on 4 ranks");
    if (R == 1) _exit(0); /* gone without a word, as a killed process (a signal would make tc-run stop the job) */
    float h[64] = {0};
    h2d(d, h, sizeof h);
    tc_op_options_t a = *o;
    a.async_op = 1;
    tc_work_t *w = NULL;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    expect(tc_all_reduce(comm, d, 64, TC_FLOAT32, sum, &a, &w) == TC_SUCCESS, "the all_reduce rank 1 dies in is issued");
    tc_result_t rc = tc_work_wait_blocking(w);
    printf("rank %d: the all_reduce ended with %s: %s\n", R, tc_result_string(rc), tc_last_error());
    expect(rc != TC_SUCCESS && rc != TC_ERR_TIMEOUT, "each survivor sees the failure (not a timeout)");
    tc_work_free(w);
    int excluded[1] = {1};
    tc_comm_t *child = NULL;
    rc = tc_comm_shrink(comm, excluded, 1, "survivors", NULL, &child);
    if (!revoke) {
        expect(rc == TC_ERR_UNSUPPORTED, "shrink after a failure without ncclCommRevoke is TC_ERR_UNSUPPORTED");
        expect(strstr(tc_last_error(), "ncclCommRevoke") && strstr(tc_last_error(), "2.27"),
               "the error names ncclCommRevoke and the loaded version");
        expect(child == NULL, "no comm");
        return;
    }
    expect(rc == TC_SUCCESS, "the survivors shrink the failed comm");
    if (rc != TC_SUCCESS) {
        printf("rank %d: shrink: %s\n", R, tc_last_error());
        return;
    }
    int cr = -1, cn = -1;
    tc_comm_get_rank(child, &cr);
    tc_comm_get_size(child, &cn);
    expect(cn == 3 && cr == (R == 0 ? 0 : R - 1), "ranks 0, 2, 3 become 0, 1, 2");
    expect(scenario_all_reduce_of(child, d, (float)R + 1, o) == 1 + 3 + 4, "all_reduce on the shrunk comm");
    expect(scenario_all_reduce_of(child, d, 2, o) == 6, "a second all_reduce on the shrunk comm");
    expect(tc_comm_finalize(child) == TC_SUCCESS, "the shrunk comm finalizes");
    tc_comm_destroy(child);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int old = argc > 1 && strcmp(argv[1], "old") == 0;
    int failure = argc > 1 && strncmp(argv[1], "failure", 7) == 0;
    int revoke = failure && strcmp(argv[1], "failure") == 0;
    gpu_setup();
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_t *comm = scenario_comm("sim_shrink");
    int R, N;
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    void *d = dalloc(4096);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    int excluded[1] = {1};
    tc_comm_t *child = NULL;
    if (failure) {
        if (N != 4) { fprintf(stderr, "run with 4 ranks\n"); return 1; }
        after_failure(comm, R, d, &o, revoke);
        expect(tc_comm_finalize(comm) != TC_SUCCESS, "the failed parent's finalize reports the failure");
    } else if (old) {
        expect(tc_comm_shrink(comm, NULL, 0, "shrunk", NULL, &child) == TC_ERR_UNSUPPORTED,
               "shrink on an NCCL without ncclCommShrink is TC_ERR_UNSUPPORTED");
        expect(strstr(tc_last_error(), "ncclCommShrink") && strstr(tc_last_error(), "2.18"),
               "the error names ncclCommShrink and the loaded version");
        expect(child == NULL, "no comm");
        expect(tc_comm_finalize(comm) == TC_SUCCESS, "the parent finalizes");
    } else {
        if (N != 4) { fprintf(stderr, "run with 4 ranks\n"); return 1; }
        expect(scenario_all_reduce_of(comm, d, 1, &o) == 4, "warm-up all_reduce on 4 ranks");
        if (R != 1) {
            expect(tc_comm_shrink(comm, excluded, 1, "shrunk", NULL, &child) == TC_SUCCESS, "shrink excluding rank 1");
            int cr = -1, cn = -1;
            tc_comm_get_rank(child, &cr);
            tc_comm_get_size(child, &cn);
            expect(cn == 3 && cr == (R == 0 ? 0 : R - 1), "ranks 0, 2, 3 become 0, 1, 2");
            expect(scenario_all_reduce_of(child, d, (float)R + 1, &o) == 1 + 3 + 4, "all_reduce on the shrunk comm");
            expect(tc_comm_finalize(child) == TC_SUCCESS, "the shrunk comm finalizes");
            tc_comm_destroy(child);
            child = NULL;
        }
        expect(scenario_all_reduce_of(comm, d, 2, &o) == 8, "the parent still all-reduces on 4 ranks");
        tc_comm_abort(comm);
        if (R != 1) {
            expect(tc_comm_shrink(comm, excluded, 1, "after-abort", NULL, &child) == TC_ERR_UNSUPPORTED,
                   "shrink after abort is TC_ERR_UNSUPPORTED");
            expect(strstr(tc_last_error(), "aborted") != NULL, "the error says the NCCL comm was aborted");
            expect(child == NULL, "no comm after abort");
        }
    }
    if (!old && !failure) expect(tc_comm_finalize(comm) == TC_ERR_ABORTED, "finalize reports the abort");
    tc_comm_destroy(comm);
    dfree(d);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
