/* tc_sparse_all_reduce through the C API on one rank: the coalesced result
   (sorted unique indices, duplicates summed), AVG, async completion, nnz 0,
   library-allocated outputs released with tc_free; and NULLs, bad enums,
   unsupported ops and out-of-range indices refused with the argument named
   and the output untouched. Multi-rank behaviour: tests/gloo_sparse.rs. */
#include "capi_util.h"

static void free_coo(tc_sparse_coo_t *c) {
    tc_free((void *)c->shape);
    tc_free((void *)c->indices);
    tc_free((void *)c->values);
}

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *comm = capi_one_rank_comm("sparse", store);
    if (comm == NULL) CAPI_DONE("test_sparse");

    /* 4 x 2 x [3]: entries (2,1) (0,1) (2,1) (1,0), unsorted, one duplicate. */
    const int64_t shape[3] = {4, 2, 3};
    const int64_t indices[2 * 4] = {2, 0, 2, 1, /* dim 1: */ 1, 1, 1, 0};
    const float values[4 * 3] = {1, 2, 3, 10, 20, 30, 100, 200, 300, 7, 8, 9};
    tc_sparse_coo_t in = {2, 1, shape, 4, indices, values, TC_FLOAT32};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM), avg = TC_REDUCE_OP(TC_AVG), max = TC_REDUCE_OP(TC_MAX),
                   unknown = TC_REDUCE_OP(99);
    tc_sparse_coo_t out;
    memset(&out, 0, sizeof out);
    EXPECT_OK(tc_sparse_all_reduce(comm, &in, sum, &out, NULL, NULL));
    CHECK(out.sparse_dim == 2 && out.dense_dim == 1 && out.nnz == 3 && out.dtype == TC_FLOAT32);
    CHECK(out.shape[0] == 4 && out.shape[1] == 2 && out.shape[2] == 3);
    const int64_t want_idx[2 * 3] = {0, 1, 2, 1, 0, 1};
    const float want_val[3 * 3] = {10, 20, 30, 7, 8, 9, 101, 202, 303};
    CHECK(memcmp(out.indices, want_idx, sizeof want_idx) == 0);
    CHECK(memcmp(out.values, want_val, sizeof want_val) == 0);
    free_coo(&out);

    /* AVG on one rank is the sum; async: written once the work completes. */
    tc_op_options_t async = TC_OP_OPTIONS_INIT;
    async.async_op = 1;
    tc_work_t *work = NULL;
    memset(&out, 0, sizeof out);
    EXPECT_OK(tc_sparse_all_reduce(comm, &in, avg, &out, &async, &work));
    EXPECT_OK(tc_work_wait_blocking(work));
    tc_work_free(work);
    CHECK(out.nnz == 3 && memcmp(out.values, want_val, sizeof want_val) == 0);
    free_coo(&out);
    EXPECT_RC(tc_sparse_all_reduce(comm, &in, sum, &out, &async, NULL), TC_ERR_INVALID_ARGUMENT,
              "'work'");

    /* nnz 0 with NULL arrays: an empty result whose arrays are still freeable. */
    tc_sparse_coo_t empty = {2, 1, shape, 0, NULL, NULL, TC_INT64};
    memset(&out, 0, sizeof out);
    EXPECT_OK(tc_sparse_all_reduce(comm, &empty, sum, &out, NULL, NULL));
    CHECK(out.nnz == 0 && out.indices != NULL && out.values != NULL && out.dtype == TC_INT64);
    free_coo(&out);

    /* Refusals: the output stays untouched. */
    tc_sparse_coo_t untouched;
    memset(&untouched, 0x5a, sizeof untouched);
    out = untouched;
    EXPECT_RC(tc_sparse_all_reduce(NULL, &in, sum, &out, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_sparse_all_reduce(comm, NULL, sum, &out, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'input'");
    EXPECT_RC(tc_sparse_all_reduce(comm, &in, sum, NULL, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'output'");
    tc_sparse_coo_t bad = in;
    bad.dtype = 99;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "dtype");
    bad = in;
    bad.dtype = TC_BOOL;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_UNSUPPORTED, "bool");
    EXPECT_RC(tc_sparse_all_reduce(comm, &in, unknown, &out, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
              "op.kind");
    EXPECT_RC(tc_sparse_all_reduce(comm, &in, max, &out, NULL, NULL), TC_ERR_UNSUPPORTED,
              "max");
    bad = in;
    bad.indices = NULL;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_NULL_ARGUMENT, "input.indices");
    bad = in;
    bad.shape = NULL;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_NULL_ARGUMENT, "input.shape");
    const int64_t far[2 * 4] = {2, 0, 4, 1, 1, 1, 1, 0};
    bad = in;
    bad.indices = far;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
              "index 4 of entry 2 in dimension 0 is outside [0, 4)");
    const int64_t negative[3] = {4, -2, 3};
    bad = in;
    bad.shape = negative;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_INVALID_ARGUMENT,
              "dimension 1 is negative");
    bad = in;
    bad.nnz = SIZE_MAX / 4;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "overflows");
    bad = in;
    bad.sparse_dim = SIZE_MAX;
    EXPECT_RC(tc_sparse_all_reduce(comm, &bad, sum, &out, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "exceeds 64");
    tc_op_options_t badopts = TC_OP_OPTIONS_INIT;
    badopts.magic = 0xbad;
    EXPECT_RC(tc_sparse_all_reduce(comm, &in, sum, &out, &badopts, NULL), TC_ERR_INVALID_ARGUMENT, "magic");
    CHECK(memcmp(&out, &untouched, sizeof out) == 0);

    /* The comm still works after the refusals. */
    memset(&out, 0, sizeof out);
    EXPECT_OK(tc_sparse_all_reduce(comm, &in, sum, &out, NULL, NULL));
    CHECK(out.nnz == 3);
    free_coo(&out);

    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_sparse");
}
