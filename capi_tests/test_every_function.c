/* Every exported function, checked for its argument errors: NULL handles and
   out-pointers give TC_ERR_NULL_ARGUMENT naming the argument; with a live
   comm, an unknown dtype and a bad options magic give TC_ERR_INVALID_ARGUMENT
   naming the argument; out-parameters stay untouched. `make capi-test` also
   checks that every symbol the library exports is named in this file. */
#include "capi_util.h"

/* A value no call may write: out-pointers are reset to it and checked. */
static int sentinel_target;
#define SENTINEL ((void *)&sentinel_target)

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *comm = capi_one_rank_comm("every-function", store);
    if (comm == NULL) CAPI_DONE("test_every_function");

    float buf[4] = {1, 2, 3, 4}, out[4] = {0};
    void *list[1] = {out};
    const void *clist[1] = {buf};
    size_t counts[1] = {4};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t bad = TC_OP_OPTIONS_INIT;
    bad.magic = 0xbad;
    tc_work_t *work = SENTINEL;

    /* ---- operations: NULL comm, unknown dtype, bad options magic -------- */
#define OP_CHECKS(call_with)                                                                          \
    do {                                                                                          \
        tc_comm_t *c_; tc_dtype_t d_; const tc_op_options_t *o_;                                   \
        c_ = NULL; d_ = TC_FLOAT32; o_ = NULL;                                                     \
        EXPECT_RC(call_with, TC_ERR_NULL_ARGUMENT, "'comm'");                                      \
        c_ = comm; d_ = 99; o_ = NULL;                                                             \
        EXPECT_RC(call_with, TC_ERR_INVALID_ARGUMENT, "dtype");                                    \
        c_ = comm; d_ = TC_FLOAT32; o_ = &bad;                                                     \
        EXPECT_RC(call_with, TC_ERR_INVALID_ARGUMENT, "magic");                                    \
        CHECK(work == SENTINEL);                                                                   \
    } while (0)
    OP_CHECKS(tc_send(c_, buf, 4, d_, 0, o_, &work));
    OP_CHECKS(tc_recv(c_, out, 4, d_, 0, o_, &work));
    OP_CHECKS(tc_broadcast(c_, buf, 4, d_, 0, o_, &work));
    OP_CHECKS(tc_reduce(c_, buf, 4, d_, 0, sum, o_, &work));
    OP_CHECKS(tc_all_reduce(c_, buf, 4, d_, sum, o_, &work));
    OP_CHECKS(tc_all_gather(c_, list, buf, 4, d_, o_, &work));
    OP_CHECKS(tc_all_gather_single(c_, out, buf, 4, d_, o_, &work));
    OP_CHECKS(tc_all_gather_v(c_, out, counts, buf, d_, o_, &work));
    OP_CHECKS(tc_reduce_scatter(c_, out, clist, 4, d_, sum, o_, &work));
    OP_CHECKS(tc_reduce_scatter_single(c_, out, buf, 4, d_, sum, o_, &work));
    OP_CHECKS(tc_reduce_scatter_v(c_, out, buf, counts, d_, sum, o_, &work));
    OP_CHECKS(tc_all_to_all(c_, list, clist, 4, d_, o_, &work));
    OP_CHECKS(tc_all_to_all_single(c_, out, buf, 4, d_, o_, &work));
    OP_CHECKS(tc_all_to_all_v_single(c_, out, counts, buf, counts, d_, o_, &work));
    OP_CHECKS(tc_scatter(c_, out, clist, 4, d_, 0, o_, &work));
    OP_CHECKS(tc_gather(c_, list, buf, 4, d_, 0, o_, &work));
    OP_CHECKS(tc_gather_single(c_, out, buf, 4, d_, 0, o_, &work));
    {
        const int64_t sp_shape[1] = {4};
        tc_sparse_coo_t sp_in = {1, 0, sp_shape, 0, NULL, NULL, TC_FLOAT32}, sp_out = sp_in;
        EXPECT_RC(tc_sparse_all_reduce(NULL, &sp_in, sum, &sp_out, NULL, &work), TC_ERR_NULL_ARGUMENT, "'comm'");
        EXPECT_RC(tc_sparse_all_reduce(comm, NULL, sum, &sp_out, NULL, &work), TC_ERR_NULL_ARGUMENT, "'input'");
        EXPECT_RC(tc_sparse_all_reduce(comm, &sp_in, sum, NULL, NULL, &work), TC_ERR_NULL_ARGUMENT, "'output'");
        EXPECT_RC(tc_sparse_all_reduce(comm, &sp_in, sum, &sp_out, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
        sp_in.dtype = 99;
        EXPECT_RC(tc_sparse_all_reduce(comm, &sp_in, sum, &sp_out, NULL, &work), TC_ERR_INVALID_ARGUMENT, "dtype");
        CHECK(sp_out.shape == sp_shape && sp_out.dtype == TC_FLOAT32);
    }
    {
        tc_all_gather_p_t *agp = SENTINEL;
        EXPECT_RC(tc_all_gather_p_init(NULL, out, 4, TC_FLOAT32, NULL, &agp), TC_ERR_NULL_ARGUMENT, "'comm'");
        EXPECT_RC(tc_all_gather_p_init(comm, out, 4, TC_FLOAT32, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'handle'");
        EXPECT_RC(tc_all_gather_p_init(comm, out, 4, 99, NULL, &agp), TC_ERR_INVALID_ARGUMENT, "dtype");
        EXPECT_RC(tc_all_gather_p_init(comm, NULL, 4, TC_FLOAT32, NULL, &agp), TC_ERR_NULL_ARGUMENT, "'output'");
        EXPECT_RC(tc_all_gather_p_init(comm, out, 4, TC_FLOAT32, &bad, &agp), TC_ERR_INVALID_ARGUMENT, "magic");
        CHECK(agp == SENTINEL);
        EXPECT_RC(tc_all_gather_p_exec(NULL, buf, NULL, &work), TC_ERR_NULL_ARGUMENT, "'handle'");
        EXPECT_OK(tc_all_gather_p_init(comm, out, 4, TC_FLOAT32, NULL, &agp));
        EXPECT_RC(tc_all_gather_p_exec(agp, NULL, NULL, &work), TC_ERR_NULL_ARGUMENT, "'input'");
        EXPECT_RC(tc_all_gather_p_exec(agp, buf, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
        CHECK(work == SENTINEL);
        EXPECT_OK(tc_all_gather_p_exec(agp, buf, NULL, NULL));
        CHECK(memcmp(out, buf, sizeof buf) == 0);
        tc_all_gather_p_free(agp);
        tc_all_gather_p_free(NULL);
    }
    EXPECT_RC(tc_barrier(NULL, NULL, &work), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_barrier(comm, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
    /* A binding's refusal: every rank refuses the same call here, so each
       gets its own error and the comm stays in step. */
    EXPECT_RC(tc_comm_refuse(NULL, "tc_all_reduce", "why"), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_refuse(comm, NULL, "why"), TC_ERR_NULL_ARGUMENT, "'call'");
    EXPECT_RC(tc_comm_refuse(comm, "tc_all_reduce", NULL), TC_ERR_NULL_ARGUMENT, "'reason'");
    EXPECT_RC(tc_comm_refuse(comm, "tc_send", "why"), TC_ERR_INVALID_ARGUMENT, "'call'");
    EXPECT_RC(tc_comm_refuse(comm, "tc_all_reduce", "'buf': refused by the binding"),
              TC_ERR_INVALID_ARGUMENT, "refused by the binding");
    CHECK(work == SENTINEL);

    /* ---- coalesced broadcast -------------------------------------------- */
    void *cbufs[1] = {out};
    tc_dtype_t cdt[1] = {99};
    EXPECT_RC(tc_broadcast_coalesced(NULL, cbufs, counts, cdt, 1, 64, 0, NULL, &work),
              TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_broadcast_coalesced(comm, NULL, counts, cdt, 1, 64, 0, NULL, &work),
              TC_ERR_NULL_ARGUMENT, "'bufs'");
    EXPECT_RC(tc_broadcast_coalesced(comm, cbufs, counts, cdt, 1, 64, 0, NULL, &work),
              TC_ERR_INVALID_ARGUMENT, "dtypes[0]");
    cdt[0] = TC_FLOAT32;
    EXPECT_RC(tc_broadcast_coalesced(comm, cbufs, counts, cdt, 1, 64, 0, &bad, &work),
              TC_ERR_INVALID_ARGUMENT, "magic");
    EXPECT_RC(tc_broadcast_coalesced(comm, cbufs, counts, cdt, 1, 0, 0, NULL, &work),
              TC_ERR_INVALID_ARGUMENT, "buffer_bytes");
    EXPECT_RC(tc_broadcast_coalesced(comm, cbufs, counts, cdt, 1, 64, 1, NULL, &work),
              TC_ERR_INVALID_ARGUMENT, "root");
    CHECK(work == SENTINEL);
    EXPECT_OK(tc_broadcast_coalesced(comm, cbufs, counts, cdt, 1, 64, 0, NULL, &work));
    EXPECT_OK(tc_work_wait(work, NULL));
    tc_work_free(work);
    work = SENTINEL;

    /* ---- reducer -------------------------------------------------------- */
    tc_reducer_t *red = SENTINEL;
    float g0[3] = {1, 2, 3};
    void *grads[2] = {g0, NULL};
    size_t gcounts[2] = {3, 0};
    tc_dtype_t gdt[2] = {TC_FLOAT32, TC_INT32};
    tc_reducer_options_t ropts = TC_REDUCER_OPTIONS_INIT;
    EXPECT_RC(tc_reducer_new(NULL, grads, gcounts, gdt, 2, NULL, &red), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_reducer_new(comm, grads, gcounts, gdt, 2, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'out'");
    EXPECT_RC(tc_reducer_new(comm, NULL, gcounts, gdt, 2, NULL, &red), TC_ERR_NULL_ARGUMENT, "'grads'");
    EXPECT_RC(tc_reducer_new(comm, grads, gcounts, gdt, 2, NULL, &red), TC_ERR_UNSUPPORTED, "dtypes[1]");
    ropts.magic = 0xbad;
    EXPECT_RC(tc_reducer_new(comm, grads, gcounts, gdt, 2, &ropts, &red), TC_ERR_INVALID_ARGUMENT, "magic");
    CHECK(red == SENTINEL);
    gdt[1] = TC_FLOAT32;
    EXPECT_OK(tc_reducer_new(comm, grads, gcounts, gdt, 2, NULL, &red));
    size_t nbuckets = 0;
    void *gp = NULL;
    EXPECT_RC(tc_reducer_num_buckets(NULL, &nbuckets), TC_ERR_NULL_ARGUMENT, "'reducer'");
    EXPECT_RC(tc_reducer_num_buckets(red, NULL), TC_ERR_NULL_ARGUMENT, "'num_buckets'");
    EXPECT_OK(tc_reducer_num_buckets(red, &nbuckets));
    CHECK(nbuckets == 1);
    EXPECT_RC(tc_reducer_get_grad(NULL, 0, &gp), TC_ERR_NULL_ARGUMENT, "'reducer'");
    EXPECT_RC(tc_reducer_get_grad(red, 0, NULL), TC_ERR_NULL_ARGUMENT, "'ptr'");
    EXPECT_RC(tc_reducer_get_grad(red, 2, &gp), TC_ERR_INVALID_ARGUMENT, "grad_index");
    EXPECT_OK(tc_reducer_get_grad(red, 0, &gp));
    CHECK(gp == g0);
    EXPECT_RC(tc_reducer_set_hook(NULL, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'reducer'");
    EXPECT_RC(tc_reducer_set_hook(red, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'hook'");
    EXPECT_RC(tc_reducer_set_builtin_hook(NULL, TC_HOOK_NOOP), TC_ERR_NULL_ARGUMENT, "'reducer'");
    EXPECT_RC(tc_reducer_set_builtin_hook(red, 99), TC_ERR_INVALID_ARGUMENT, "kind");
    tc_powersgd_options_t popts = TC_POWERSGD_OPTIONS_INIT;
    EXPECT_RC(tc_reducer_set_powersgd(NULL, &popts), TC_ERR_NULL_ARGUMENT, "'reducer'");
    popts.matrix_approximation_rank = 0;
    EXPECT_RC(tc_reducer_set_powersgd(red, &popts), TC_ERR_INVALID_ARGUMENT, "matrix_approximation_rank");
    popts.matrix_approximation_rank = 1;
    popts.num_rows = 2;
    EXPECT_RC(tc_reducer_set_powersgd(red, &popts), TC_ERR_NULL_ARGUMENT, "'opts.rows'");
    popts.num_rows = 0;
    EXPECT_OK(tc_reducer_set_powersgd(red, &popts));
    EXPECT_OK(tc_reducer_set_powersgd(red, NULL));
    EXPECT_OK(tc_reducer_set_builtin_hook(red, TC_HOOK_POWERSGD));
    EXPECT_OK(tc_reducer_set_builtin_hook(red, TC_HOOK_FP16_COMPRESS));
    EXPECT_RC(tc_reducer_mark_ready(NULL, 0), TC_ERR_NULL_ARGUMENT, "'reducer'");
    EXPECT_RC(tc_reducer_mark_ready(red, 2), TC_ERR_INVALID_ARGUMENT, "grad_index");
    EXPECT_OK(tc_reducer_mark_ready(red, 1));
    EXPECT_OK(tc_reducer_mark_ready(red, 0));
    EXPECT_RC(tc_reducer_mark_ready(red, 0), TC_ERR_INVALID_USAGE, "already marked");
    EXPECT_RC(tc_reducer_finalize(NULL), TC_ERR_NULL_ARGUMENT, "'reducer'");
    EXPECT_OK(tc_reducer_finalize(red));
    CHECK(g0[0] == 1 && g0[1] == 2 && g0[2] == 3);
    EXPECT_RC(tc_reducer_finalize(red), TC_ERR_INVALID_USAGE, "never marked");
    EXPECT_RC(tc_reducer_finalize_async(NULL, &work), TC_ERR_NULL_ARGUMENT, "'reducer'");
    EXPECT_RC(tc_reducer_finalize_async(red, NULL), TC_ERR_NULL_ARGUMENT, "'work'");
    CHECK(work == SENTINEL);
    EXPECT_OK(tc_reducer_mark_ready(red, 0));
    EXPECT_OK(tc_reducer_mark_ready(red, 1));
    EXPECT_OK(tc_reducer_finalize_async(red, &work));
    EXPECT_OK(tc_work_wait(work, NULL));
    tc_work_free(work);
    work = SENTINEL;
    tc_reducer_free(red);
    tc_reducer_free(NULL);

    /* ---- batches ---------------------------------------------------------- */
    tc_batch_t *batch = SENTINEL;
    EXPECT_RC(tc_batch_begin(NULL, &batch), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_batch_begin(comm, NULL), TC_ERR_NULL_ARGUMENT, "'batch'");
    CHECK(batch == SENTINEL);
    EXPECT_RC(tc_batch_send(NULL, buf, 4, TC_FLOAT32, 0), TC_ERR_NULL_ARGUMENT, "'batch'");
    EXPECT_RC(tc_batch_recv(NULL, out, 4, TC_FLOAT32, 0), TC_ERR_NULL_ARGUMENT, "'batch'");
    EXPECT_RC(tc_batch_send_tagged(NULL, buf, 4, TC_FLOAT32, 0, 1), TC_ERR_NULL_ARGUMENT, "'batch'");
    EXPECT_RC(tc_batch_recv_tagged(NULL, out, 4, TC_FLOAT32, 0, 1), TC_ERR_NULL_ARGUMENT, "'batch'");
    EXPECT_RC(tc_batch_issue(NULL, NULL, &work), TC_ERR_NULL_ARGUMENT, "'batch'");
    EXPECT_OK(tc_batch_begin(comm, &batch));
    EXPECT_RC(tc_batch_send(batch, buf, 4, 99, 0), TC_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT_RC(tc_batch_recv(batch, out, 4, 99, 0), TC_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT_RC(tc_batch_issue(batch, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
    EXPECT_RC(tc_batch_send_tagged(batch, buf, 4, 99, 0, 1), TC_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT_RC(tc_batch_recv_tagged(batch, out, 4, 99, 0, 1), TC_ERR_INVALID_ARGUMENT, "dtype");
    {
        tc_op_options_t tagged = TC_OP_OPTIONS_INIT;
        tagged.tag = 3;
        EXPECT_RC(tc_batch_issue(batch, &tagged, &work), TC_ERR_INVALID_ARGUMENT, "'opts.tag'");
        EXPECT_RC(tc_all_reduce(comm, buf, 4, TC_FLOAT32, sum, &tagged, &work), TC_ERR_INVALID_ARGUMENT,
                  "'opts.tag'");
    }
    CHECK(work == SENTINEL);
    tc_batch_free(batch);
    tc_batch_free(NULL);

    /* ---- comm queries and lifetime ------------------------------------- */
    int i = -7;
    const char *s = SENTINEL;
    tc_device_t dev = {-7, -7};
    tc_comm_t *child = SENTINEL;
    int ranks[1] = {0};
    EXPECT_RC(tc_comm_new("gloo", dev, NULL, &child), TC_ERR_INVALID_ARGUMENT, "device");
    EXPECT_RC(tc_comm_get_rank(NULL, &i), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_get_rank(comm, NULL), TC_ERR_NULL_ARGUMENT, "'rank'");
    EXPECT_RC(tc_comm_get_size(NULL, &i), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_get_size(comm, NULL), TC_ERR_NULL_ARGUMENT, "'size'");
    EXPECT_RC(tc_comm_get_name(NULL, &s), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_get_name(comm, NULL), TC_ERR_NULL_ARGUMENT, "'name'");
    EXPECT_RC(tc_comm_get_backend(NULL, &s), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_get_backend(comm, NULL), TC_ERR_NULL_ARGUMENT, "'backend'");
    EXPECT_RC(tc_comm_get_device(NULL, &dev), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_get_device(comm, NULL), TC_ERR_NULL_ARGUMENT, "'device'");
    EXPECT_RC(tc_comm_get_async_error(NULL), TC_ERR_NULL_ARGUMENT, "'comm'");
    {
        size_t nr = 1;
        tc_hint_t live = {"no_such_hint", "1"};
        EXPECT_RC(tc_comm_get_ranks(NULL, &i, &nr), TC_ERR_NULL_ARGUMENT, "'comm'");
        EXPECT_RC(tc_comm_get_ranks(comm, &i, NULL), TC_ERR_NULL_ARGUMENT, "'count'");
        EXPECT_RC(tc_comm_get_backend_version(NULL, &s), TC_ERR_NULL_ARGUMENT, "'comm'");
        EXPECT_RC(tc_comm_get_backend_version(comm, NULL), TC_ERR_NULL_ARGUMENT, "'version'");
        EXPECT_RC(tc_comm_set_timeout(NULL, 1000), TC_ERR_NULL_ARGUMENT, "'comm'");
        EXPECT_RC(tc_comm_set_timeout(comm, 0), TC_ERR_INVALID_ARGUMENT, "'timeout_ms'");
        EXPECT_RC(tc_comm_set_hints(NULL, &live, 1), TC_ERR_NULL_ARGUMENT, "'comm'");
        EXPECT_RC(tc_comm_set_hints(comm, NULL, 1), TC_ERR_NULL_ARGUMENT, "'hints'");
        EXPECT_RC(tc_comm_set_hints(comm, &live, 1), TC_ERR_INVALID_ARGUMENT, "no_such_hint");
        CHECK(nr == 1);
    }
    char *text = SENTINEL;
    EXPECT_RC(tc_comm_dump_flight_recorder(NULL, &text), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_dump_flight_recorder(comm, NULL), TC_ERR_NULL_ARGUMENT, "'text'");
    CHECK(text == SENTINEL);
    EXPECT_RC(tc_comm_set_abort_hook(NULL, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'comm'");
    uint64_t hook_id = 77;
    EXPECT_RC(tc_comm_add_pre_hook(NULL, NULL, NULL, &hook_id), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_add_pre_hook(comm, NULL, NULL, &hook_id), TC_ERR_NULL_ARGUMENT, "'hook'");
    EXPECT_RC(tc_comm_add_post_hook(NULL, NULL, NULL, &hook_id), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_add_post_hook(comm, NULL, NULL, &hook_id), TC_ERR_NULL_ARGUMENT, "'hook'");
    EXPECT_RC(tc_comm_remove_hook(NULL, 1), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_remove_hook(comm, 0), TC_ERR_NOT_FOUND, "no hook 0");
    CHECK(hook_id == 77);
    EXPECT_RC(tc_comm_split(NULL, ranks, 1, "x", NULL, &child), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_split(comm, ranks, 1, "x", NULL, NULL), TC_ERR_NULL_ARGUMENT, "'out'");
    EXPECT_RC(tc_comm_split(comm, NULL, 1, "x", NULL, &child), TC_ERR_NULL_ARGUMENT, "'ranks'");
    EXPECT_RC(tc_comm_split(comm, ranks, 1, NULL, NULL, &child), TC_ERR_NULL_ARGUMENT, "'name'");
    tc_comm_options_t bad_comm = TC_COMM_OPTIONS_INIT;
    bad_comm.magic = 0xbad;
    EXPECT_RC(tc_comm_split(comm, ranks, 1, "x", &bad_comm, &child), TC_ERR_INVALID_ARGUMENT, "magic");
    EXPECT_RC(tc_comm_shrink(NULL, ranks, 1, "x", NULL, &child), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_shrink(comm, ranks, 1, "x", NULL, NULL), TC_ERR_NULL_ARGUMENT, "'out'");
    EXPECT_RC(tc_comm_shrink(comm, NULL, 1, "x", NULL, &child), TC_ERR_NULL_ARGUMENT, "'exclude_ranks'");
    EXPECT_RC(tc_comm_shrink(comm, ranks, 1, NULL, NULL, &child), TC_ERR_NULL_ARGUMENT, "'name'");
    EXPECT_RC(tc_comm_shrink(comm, ranks, 1, "x", &bad_comm, &child), TC_ERR_INVALID_ARGUMENT, "magic");
    CHECK(i == -7 && s == SENTINEL && dev.type == -7 && child == SENTINEL);

    /* ---- reconfigure: a comm created with enable_reconfigure ------------ */
    {
        const char *init = SENTINEL;
        EXPECT_RC(tc_comm_get_init_handle(NULL, &init), TC_ERR_NULL_ARGUMENT, "'comm'");
        EXPECT_RC(tc_comm_get_init_handle(comm, NULL), TC_ERR_NULL_ARGUMENT, "'handle'");
        EXPECT_RC(tc_comm_get_init_handle(comm, &init), TC_ERR_INVALID_USAGE, "enable_reconfigure");
        CHECK(init == SENTINEL);
        tc_device_t cpu = {TC_DEVICE_CPU, 0}, cuda = {TC_DEVICE_CUDA, 0};
        tc_comm_options_t ro = TC_COMM_OPTIONS_INIT;
        ro.name = "every-function-elastic";
        ro.store = store;
        ro.abort_on_error = 0;
        ro.enable_reconfigure = 2;
        tc_comm_t *elastic = SENTINEL;
        EXPECT_RC(tc_comm_new("gloo", cpu, &ro, &elastic), TC_ERR_INVALID_ARGUMENT, "'opts.enable_reconfigure'");
        ro.enable_reconfigure = 1;
        EXPECT_RC(tc_comm_split(comm, ranks, 1, "x", &ro, &child), TC_ERR_INVALID_ARGUMENT, "'opts.enable_reconfigure'");
        /* nccl: reconfigurable where NCCL and the driver load (a fresh NCCL
           comm per reconfigure); here, without them, refused saying so. */
        tc_result_t nrc = tc_comm_new("nccl", cuda, &ro, &elastic);
        if (nrc == TC_SUCCESS) {
            tc_comm_destroy(elastic);
            elastic = SENTINEL;
        } else {
            EXPECT_RC(nrc, TC_ERR_UNAVAILABLE, "nccl backend is unavailable");
        }
        CHECK(elastic == SENTINEL && child == SENTINEL);
        elastic = NULL;
        EXPECT_OK(tc_comm_new("gloo", cpu, &ro, &elastic));
        if (elastic != NULL) {
            int r = -7;
            EXPECT_RC(tc_comm_get_rank(elastic, &r), TC_ERR_INVALID_USAGE, "tc_comm_reconfigure");
            tc_device_t d = {-7, -7};
            EXPECT_OK(tc_comm_get_device(elastic, &d));
            EXPECT_OK(tc_comm_get_async_error(elastic));
            CHECK(r == -7 && d.type == TC_DEVICE_CPU);
            EXPECT_OK(tc_comm_get_init_handle(elastic, &init));
            const char *handles[2] = {init, NULL};
            const int L = TC_INIT_HANDLES_LIST;
            EXPECT_RC(tc_comm_reconfigure(NULL, 0, handles, 1, L, NULL, &work), TC_ERR_NULL_ARGUMENT, "'comm'");
            EXPECT_RC(tc_comm_reconfigure(elastic, 0, NULL, 1, L, NULL, &work), TC_ERR_NULL_ARGUMENT, "'init_handles'");
            EXPECT_RC(tc_comm_reconfigure(elastic, 0, handles, 0, L, NULL, &work), TC_ERR_INVALID_ARGUMENT, "empty");
            EXPECT_RC(tc_comm_reconfigure(elastic, 0, handles, 2, L, NULL, &work), TC_ERR_NULL_ARGUMENT, "'init_handles[1]'");
            handles[1] = init;
            EXPECT_RC(tc_comm_reconfigure(elastic, 0, handles, 2, L, NULL, &work), TC_ERR_INVALID_ARGUMENT, "'init_handles[1]': handle");
            handles[1] = "gloo:0:0:127.0.0.1:29500";
            EXPECT_RC(tc_comm_reconfigure(elastic, 0, handles, 2, L, NULL, &work), TC_ERR_INVALID_ARGUMENT, "not an init handle");
            EXPECT_RC(tc_comm_reconfigure(elastic, 0, handles, 1, 2, NULL, &work), TC_ERR_INVALID_ARGUMENT, "'form'");
            EXPECT_RC(tc_comm_reconfigure(elastic, -1, handles, 1, L, NULL, &work), TC_ERR_INVALID_ARGUMENT, "'uuid'");
            EXPECT_RC(tc_comm_reconfigure(elastic, 0, handles, 1, L, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
            EXPECT_RC(tc_comm_reconfigure(comm, 0, handles, 1, L, NULL, &work), TC_ERR_INVALID_USAGE, "enable_reconfigure");
            CHECK(work == SENTINEL);
            /* One member: the comm forms, with a completed work. */
            EXPECT_OK(tc_comm_reconfigure(elastic, 0, handles, 1, TC_INIT_HANDLES_SET, NULL, &work));
            int size = -1, done = 0;
            EXPECT_OK(tc_comm_get_size(elastic, &size));
            EXPECT_OK(tc_work_is_completed(work, &done));
            CHECK(size == 1 && done == 1);
            tc_work_free(work);
            work = SENTINEL;
            EXPECT_OK(tc_comm_finalize(elastic));
            tc_comm_destroy(elastic);
        }
    }
    EXPECT_RC(tc_comm_finalize(NULL), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_abort(NULL), TC_ERR_NULL_ARGUMENT, "'comm'");
    tc_comm_destroy(NULL);

    /* ---- memory --------------------------------------------------------- */
    void *p = SENTINEL;
    EXPECT_RC(tc_comm_register(NULL, buf, sizeof buf, &p), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_register(comm, buf, sizeof buf, NULL), TC_ERR_NULL_ARGUMENT, "'handle'");
    EXPECT_RC(tc_comm_deregister(NULL, SENTINEL), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_mem_alloc(NULL, 64, &p), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_mem_alloc(comm, 64, NULL), TC_ERR_NULL_ARGUMENT, "'ptr'");
    EXPECT_RC(tc_mem_free(NULL, SENTINEL), TC_ERR_NULL_ARGUMENT, "'comm'");
    CHECK(p == SENTINEL);

    /* ---- windows -------------------------------------------------------- */
    tc_window_t *win = SENTINEL;
    EXPECT_RC(tc_window_new(NULL, &win), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_window_new(comm, NULL), TC_ERR_NULL_ARGUMENT, "'window'");
    CHECK(win == SENTINEL);
    EXPECT_RC(tc_window_register(NULL, buf, sizeof buf), TC_ERR_NULL_ARGUMENT, "'window'");
    EXPECT_RC(tc_window_deregister(NULL), TC_ERR_NULL_ARGUMENT, "'window'");
    EXPECT_RC(tc_window_put(NULL, buf, 4, 0, 0, NULL, &work), TC_ERR_NULL_ARGUMENT, "'window'");
    EXPECT_RC(tc_window_get(NULL, buf, 4, 0, 0, NULL, &work), TC_ERR_NULL_ARGUMENT, "'window'");
    EXPECT_RC(tc_window_signal(NULL, 0, NULL, &work), TC_ERR_NULL_ARGUMENT, "'window'");
    EXPECT_RC(tc_window_wait_signal(NULL, 0, NULL, &work), TC_ERR_NULL_ARGUMENT, "'window'");
    EXPECT_RC(tc_window_map_remote(NULL, 0, &p), TC_ERR_NULL_ARGUMENT, "'window'");
    CHECK(work == SENTINEL && p == SENTINEL);
    EXPECT_OK(tc_window_new(comm, &win));
    EXPECT_RC(tc_window_register(win, NULL, sizeof out), TC_ERR_NULL_ARGUMENT, "'buf'");
    EXPECT_OK(tc_window_register(win, out, sizeof out));
    EXPECT_RC(tc_window_put(win, NULL, 4, 0, 0, NULL, &work), TC_ERR_NULL_ARGUMENT, "'src'");
    EXPECT_RC(tc_window_put(win, buf, 4, 0, 0, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
    EXPECT_RC(tc_window_get(win, NULL, 4, 0, 0, NULL, &work), TC_ERR_NULL_ARGUMENT, "'dst'");
    EXPECT_RC(tc_window_get(win, buf, 4, 0, 0, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
    EXPECT_RC(tc_window_get(win, buf, 4, 1 << 20, 0, NULL, &work), TC_ERR_INVALID_ARGUMENT, "'src_rank'");
    EXPECT_RC(tc_window_get(win, buf, 4, 0, sizeof out, NULL, &work), TC_ERR_INVALID_ARGUMENT, "'src_offset'");
    out[0] = 42.5f;
    EXPECT_OK(tc_window_get(win, buf, 4, 0, 0, NULL, NULL));
    CHECK(buf[0] == 42.5f);
    buf[0] = 1;
    EXPECT_RC(tc_window_signal(win, 0, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
    EXPECT_RC(tc_window_wait_signal(win, 0, &bad, &work), TC_ERR_INVALID_ARGUMENT, "magic");
    EXPECT_RC(tc_window_map_remote(win, 0, NULL), TC_ERR_NULL_ARGUMENT, "'ptr'");
    CHECK(work == SENTINEL);
    EXPECT_OK(tc_window_deregister(win));
    tc_window_free(win);
    tc_window_free(NULL);

    /* ---- work ----------------------------------------------------------- */
    int32_t st = -7;
    EXPECT_RC(tc_work_is_completed(NULL, &i), TC_ERR_NULL_ARGUMENT, "'work'");
    EXPECT_RC(tc_work_status(NULL, &st), TC_ERR_NULL_ARGUMENT, "'work'");
    EXPECT_RC(tc_work_wait(NULL, NULL), TC_ERR_NULL_ARGUMENT, "'work'");
    EXPECT_RC(tc_work_wait_blocking(NULL), TC_ERR_NULL_ARGUMENT, "'work'");
    EXPECT_OK(tc_all_reduce(comm, buf, 4, TC_FLOAT32, sum, NULL, &work));
    EXPECT_RC(tc_work_is_completed(work, NULL), TC_ERR_NULL_ARGUMENT, "'done'");
    EXPECT_RC(tc_work_status(work, NULL), TC_ERR_NULL_ARGUMENT, "'status'");
    EXPECT_RC(tc_work_source(NULL, &st), TC_ERR_NULL_ARGUMENT, "'work'");
    EXPECT_RC(tc_work_source(work, NULL), TC_ERR_NULL_ARGUMENT, "'rank'");
    EXPECT_RC(tc_work_source(work, &st), TC_ERR_INVALID_USAGE, "not a receive");
    CHECK(i == -7 && st == -7);
    tc_work_free(work);
    tc_work_free(NULL);

    /* ---- stores --------------------------------------------------------- */
    tc_store_t *st_out = SENTINEL;
    const char *keys[1] = {"k"};
    int64_t n64 = -7;
    size_t len = 7;
    uint16_t port = 7;
    EXPECT_RC(tc_store_tcp_new(NULL, 1234, 0, -1, 100, &st_out), TC_ERR_NULL_ARGUMENT, "'host'");
    EXPECT_RC(tc_store_tcp_new("127.0.0.1", 0, 1, -1, 100, NULL), TC_ERR_NULL_ARGUMENT, "'out'");
    EXPECT_RC(tc_store_tcp_new("127.0.0.1", 0, 1, 0, 100, &st_out), TC_ERR_INVALID_ARGUMENT, "world_size");
    EXPECT_RC(tc_store_tcp_port(NULL, &port), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_tcp_port(store, NULL), TC_ERR_NULL_ARGUMENT, "'port'");
    EXPECT_RC(tc_store_file_new(NULL, 1, &st_out), TC_ERR_NULL_ARGUMENT, "'path'");
    EXPECT_RC(tc_store_prefix_new(NULL, "p", &st_out), TC_ERR_NULL_ARGUMENT, "'base'");
    EXPECT_RC(tc_store_prefix_new(store, NULL, &st_out), TC_ERR_NULL_ARGUMENT, "'prefix'");
    EXPECT_RC(tc_store_set(NULL, "k", "v", 1), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_set(store, NULL, "v", 1), TC_ERR_NULL_ARGUMENT, "'key'");
    EXPECT_RC(tc_store_get(NULL, "k", NULL, 0, &len), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_get_alloc(NULL, "k", &p, &len), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_get_alloc(store, "k", NULL, &len), TC_ERR_NULL_ARGUMENT, "'value'");
    EXPECT_RC(tc_store_add(NULL, "k", 1, &n64), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_add(store, NULL, 1, &n64), TC_ERR_NULL_ARGUMENT, "'key'");
    EXPECT_RC(tc_store_compare_set(NULL, "k", "a", 1, "b", 1, &p, &len), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_check(NULL, keys, 1, &i), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_check(store, NULL, 1, &i), TC_ERR_NULL_ARGUMENT, "'keys'");
    EXPECT_RC(tc_store_wait(NULL, keys, 1, 10), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_delete(NULL, "k", &i), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_num_keys(NULL, &n64), TC_ERR_NULL_ARGUMENT, "'store'");
    EXPECT_RC(tc_store_num_keys(store, NULL), TC_ERR_NULL_ARGUMENT, "'n'");
    tc_store_callbacks_t callbacks = TC_STORE_CALLBACKS_INIT;
    EXPECT_RC(tc_store_new_callbacks(NULL, &st_out), TC_ERR_NULL_ARGUMENT, "'callbacks'");
    EXPECT_RC(tc_store_new_callbacks(&callbacks, NULL), TC_ERR_NULL_ARGUMENT, "'out'");
    EXPECT_RC(tc_store_new_callbacks(&callbacks, &st_out), TC_ERR_NULL_ARGUMENT, "'callbacks->set'");
    callbacks.magic = 0;
    EXPECT_RC(tc_store_new_callbacks(&callbacks, &st_out), TC_ERR_INVALID_ARGUMENT, "bad magic");
    EXPECT_RC(tc_store_reply_value(NULL, "v", 1), TC_ERR_NULL_ARGUMENT, "'reply'");
    EXPECT_RC(tc_store_reply_error(NULL, "m"), TC_ERR_NULL_ARGUMENT, "'reply'");
    CHECK(st_out == SENTINEL && p == SENTINEL && n64 == -7 && i == -7 && port == 7);
    tc_store_free(NULL);
    tc_free(NULL);

    /* ---- device groups (tc_local_*) --------------------------------------- */
    /* Without a CUDA driver a CUDA member is TC_ERR_UNAVAILABLE; a group of
       CPU members works everywhere (host copies), so every function's
       argument checks run here. */
    tc_local_t *lg = SENTINEL;
    tc_device_t cuda0[1] = {{TC_DEVICE_CUDA, 0}}, cpus[2] = {{TC_DEVICE_CPU, 0}, {TC_DEVICE_CPU, 0}};
    tc_device_t bad_type[1] = {{7, 0}};
    tc_local_options_t bad_local = TC_LOCAL_OPTIONS_INIT;
    bad_local.magic = 0xbad;
    tc_result_t lrc = tc_local_new(cuda0, 1, NULL, &lg);
    CHECK(lrc == TC_ERR_UNAVAILABLE || lrc == TC_SUCCESS);
    if (lrc == TC_SUCCESS) tc_local_free(lg);
    lg = SENTINEL;
    EXPECT_RC(tc_local_new(NULL, 1, NULL, &lg), TC_ERR_NULL_ARGUMENT, "'devices'");
    EXPECT_RC(tc_local_new(cpus, 2, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'out'");
    EXPECT_RC(tc_local_new(cpus, 0, NULL, &lg), TC_ERR_INVALID_ARGUMENT, "'n'");
    EXPECT_RC(tc_local_new(bad_type, 1, NULL, &lg), TC_ERR_INVALID_ARGUMENT, "devices[0]");
    EXPECT_RC(tc_local_new(cpus, 2, &bad_local, &lg), TC_ERR_INVALID_ARGUMENT, "magic");
    CHECK(lg == SENTINEL);
    EXPECT_OK(tc_local_new(cpus, 2, NULL, &lg));
    float lsrc[4] = {1, 2, 3, 4}, la[4] = {0}, lb[4] = {0}, lcat[8] = {0};
    void *ldst[2] = {la, lb};
    const void *lsrcs[2] = {la, lb};
    size_t lcounts[2] = {4, 4}, lhuge[2] = {(size_t)-1 / 2, 1};
    tc_dtype_t ldts[1] = {TC_FLOAT32};
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    EXPECT_RC(tc_local_broadcast(NULL, lsrc, 0, ldst, 4, TC_FLOAT32, NULL), TC_ERR_NULL_ARGUMENT, "'g'");
    EXPECT_RC(tc_local_broadcast(lg, lsrc, 0, NULL, 4, TC_FLOAT32, NULL), TC_ERR_NULL_ARGUMENT, "'dsts'");
    EXPECT_RC(tc_local_broadcast(lg, lsrc, 2, ldst, 4, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "src_index");
    EXPECT_RC(tc_local_broadcast(lg, lsrc, 0, ldst, 4, 99, NULL), TC_ERR_INVALID_ARGUMENT, "'dt'");
    EXPECT_RC(tc_local_broadcast(lg, lsrc, 0, ldst, (size_t)-1 / 2, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "count");
    ldst[1] = la; /* two destinations in one buffer */
    EXPECT_RC(tc_local_broadcast(lg, lsrc, 0, ldst, 4, TC_FLOAT32, NULL), TC_ERR_INVALID_ARGUMENT, "overlap");
    CHECK(la[0] == 0 && lb[0] == 0);
    ldst[1] = lb;
    EXPECT_OK(tc_local_broadcast(lg, lsrc, 0, ldst, 4, TC_FLOAT32, NULL));
    CHECK(la[3] == 4 && lb[3] == 4);
    EXPECT_RC(tc_local_broadcast_coalesced(NULL, clist, counts, ldts, 1, 0, ldst, NULL), TC_ERR_NULL_ARGUMENT, "'g'");
    EXPECT_RC(tc_local_broadcast_coalesced(lg, NULL, counts, ldts, 1, 0, ldst, NULL), TC_ERR_NULL_ARGUMENT, "'srcs'");
    EXPECT_RC(tc_local_broadcast_coalesced(lg, clist, counts, ldts, 1, 0, NULL, NULL), TC_ERR_NULL_ARGUMENT, "'dsts'");
    EXPECT_RC(tc_local_scatter(NULL, lcat, cpu, 8, TC_FLOAT32, NULL, ldst, NULL), TC_ERR_NULL_ARGUMENT, "'g'");
    EXPECT_RC(tc_local_scatter(lg, lcat, cpu, 8, TC_FLOAT32, lhuge, ldst, NULL), TC_ERR_INVALID_ARGUMENT, "chunk_counts");
    EXPECT_RC(tc_local_scatter(lg, lcat, bad_type[0], 8, TC_FLOAT32, NULL, ldst, NULL), TC_ERR_INVALID_ARGUMENT, "src_device");
    EXPECT_RC(tc_local_gather(NULL, lsrcs, lcounts, TC_FLOAT32, lcat, cpu, NULL), TC_ERR_NULL_ARGUMENT, "'g'");
    EXPECT_RC(tc_local_gather(lg, lsrcs, NULL, TC_FLOAT32, lcat, cpu, NULL), TC_ERR_NULL_ARGUMENT, "'counts'");
    EXPECT_RC(tc_local_gather(lg, lsrcs, lhuge, TC_FLOAT32, lcat, cpu, NULL), TC_ERR_INVALID_ARGUMENT, "counts");
    EXPECT_OK(tc_local_gather(lg, lsrcs, lcounts, TC_FLOAT32, lcat, cpu, NULL));
    CHECK(lcat[0] == 1 && lcat[7] == 4);
    /* reduce_add takes CUDA members only */
    EXPECT_RC(tc_local_reduce_add(NULL, lsrcs, 4, TC_FLOAT32, lcat, 0, NULL), TC_ERR_NULL_ARGUMENT, "'g'");
    EXPECT_RC(tc_local_reduce_add(lg, lsrcs, 4, TC_FLOAT32, lcat, 0, NULL), TC_ERR_INVALID_ARGUMENT, "CPU");
    EXPECT_RC(tc_local_reduce_add_coalesced(NULL, lsrcs, counts, ldts, 1, 0, ldst, 0, NULL), TC_ERR_NULL_ARGUMENT, "'g'");
    EXPECT_RC(tc_local_reduce_add_coalesced(lg, lsrcs, counts, ldts, 1, 0, ldst, 0, NULL), TC_ERR_INVALID_ARGUMENT, "CPU");
    tc_local_free(lg);
    tc_local_free(NULL);

    /* ---- process-wide ---------------------------------------------------- */
    size_t size = 7;
    int a, b;
    EXPECT_RC(tc_dtype_size(99, &size), TC_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT_RC(tc_get_version(&a, &b, NULL), TC_ERR_NULL_ARGUMENT, "'patch'");
    EXPECT_OK(tc_set_log_callback(NULL, NULL));
    CHECK(size == 7 && tc_result_string(TC_SUCCESS) != NULL && tc_last_error() != NULL);

    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_every_function");
}
