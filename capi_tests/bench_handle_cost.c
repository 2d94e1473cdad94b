/* Calls cheap functions many times on a one-rank host comm, for counting
   the instructions each call costs under callgrind (scripts/handle-cost.sh):
   tc_comm_get_rank, tc_work_wait on a completed work, tc_work_status, a
   blocking 4-element tc_all_reduce, and an asynchronous tc_barrier whose
   work is waited for and freed (tc_work_free). Usage: bench_handle_cost [N]:
   N calls of each query, N / 10 of each operation. */
#include "capi_util.h"

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10000;
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *comm = capi_one_rank_comm("handle-cost", store);
    if (comm == NULL) CAPI_DONE("bench_handle_cost");
    int rank = -1;
    for (int i = 0; i < n; i++) tc_comm_get_rank(comm, &rank);
    tc_work_t *work = NULL;
    EXPECT_OK(tc_barrier(comm, NULL, &work));
    int32_t status = -1;
    for (int i = 0; i < n; i++) tc_work_wait(work, NULL);
    for (int i = 0; i < n; i++) tc_work_status(work, &status);
    tc_work_free(work);
    float x[4] = {1, 2, 3, 4};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    for (int i = 0; i < n / 10; i++) tc_all_reduce(comm, x, 4, TC_FLOAT32, sum, NULL, NULL);
    tc_op_options_t async = TC_OP_OPTIONS_INIT;
    async.async_op = 1;
    for (int i = 0; i < n / 10; i++) {
        tc_work_t *w = NULL;
        tc_barrier(comm, &async, &w);
        tc_work_wait_blocking(w);
        tc_work_free(w);
    }
    CHECK(rank == 0 && status == TC_WORK_COMPLETED && x[3] == 4.0f);
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("bench_handle_cost");
}
