/* A one-rank host comm through the C API: queries, operations, error paths
   with a live comm (unknown dtype and reduce op, bad op-options magic, short
   options struct, ranks out of range, bitwise ops on floats, NULL buffers,
   overflowing counts), use after finalize, shrink, the flight recorder, the abort
   hook, and the log callback. */
#include "capi_util.h"
#include <stdint.h>
#include <unistd.h>

static int warnings = 0;
static void on_log(int32_t level, const char *message, void *user) {
    (void)user;
    if (level == TC_LOG_WARN && strstr(message, "[torchcomm] WARN") != NULL) warnings++;
}

struct hook_calls {
    int count;
    tc_result_t code;
    char message[256];
};
static void on_abort(tc_result_t code, const char *message, void *user) {
    struct hook_calls *calls = user;
    calls->count++;
    calls->code = code;
    snprintf(calls->message, sizeof calls->message, "%s", message);
}

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);

    tc_comm_t *comm = capi_one_rank_comm("capi", store);
    if (comm == NULL) CAPI_DONE("test_comm");
    int rank = -1, size = -1;
    const char *name = NULL, *backend = NULL;
    tc_device_t dev = {-1, -1};
    EXPECT_OK(tc_comm_get_rank(comm, &rank));
    EXPECT_OK(tc_comm_get_size(comm, &size));
    EXPECT_OK(tc_comm_get_name(comm, &name));
    EXPECT_OK(tc_comm_get_backend(comm, &backend));
    EXPECT_OK(tc_comm_get_device(comm, &dev));
    CHECK(rank == 0 && size == 1);
    CHECK(name && strcmp(name, "capi") == 0 && backend && strcmp(backend, "gloo") == 0);
    CHECK(dev.type == TC_DEVICE_CPU);
    EXPECT_OK(tc_comm_get_async_error(comm));

    /* a working operation, blocking and asynchronous */
    float x[8];
    for (int i = 0; i < 8; i++) x[i] = (float)i;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    EXPECT_OK(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, NULL, NULL));
    CHECK(x[7] == 7.0f);
    tc_op_options_t async = TC_OP_OPTIONS_INIT;
    async.async_op = 1;
    tc_work_t *work = NULL;
    EXPECT_OK(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, &async, &work));
    EXPECT_OK(tc_work_wait_blocking(work));
    int done = 0;
    int32_t status = -1;
    EXPECT_OK(tc_work_is_completed(work, &done));
    EXPECT_OK(tc_work_status(work, &status));
    CHECK(done == 1 && status == TC_WORK_COMPLETED);
    tc_work_free(work);

    /* bad arguments with a live comm: each names its argument, nothing runs */
    tc_work_t *untouched = (tc_work_t *)&done;
    EXPECT_RC(tc_all_reduce(comm, x, 8, 99, sum, NULL, &untouched), TC_ERR_INVALID_ARGUMENT, "dtype");
    tc_reduce_op_t bad_kind = TC_REDUCE_OP(42);
    EXPECT_RC(tc_all_reduce(comm, x, 8, TC_FLOAT32, bad_kind, NULL, &untouched), TC_ERR_INVALID_ARGUMENT, "op.kind");
    tc_reduce_op_t band = TC_REDUCE_OP(TC_BAND);
    EXPECT_RC(tc_all_reduce(comm, x, 8, TC_FLOAT32, band, NULL, &untouched), TC_ERR_UNSUPPORTED, "float32");
    tc_op_options_t bad_magic = TC_OP_OPTIONS_INIT;
    bad_magic.magic = 1;
    EXPECT_RC(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, &bad_magic, &untouched), TC_ERR_INVALID_ARGUMENT, "magic");
    tc_op_options_t bad_async = TC_OP_OPTIONS_INIT;
    bad_async.async_op = 3;
    EXPECT_RC(tc_barrier(comm, &bad_async, &untouched), TC_ERR_INVALID_ARGUMENT, "async_op");
    EXPECT_RC(tc_send(comm, x, 8, TC_FLOAT32, 1, NULL, &untouched), TC_ERR_INVALID_ARGUMENT, "peer");
    EXPECT_RC(tc_broadcast(comm, x, 8, TC_FLOAT32, -1, NULL, &untouched), TC_ERR_INVALID_ARGUMENT, "root");
    EXPECT_RC(tc_all_reduce(comm, NULL, 8, TC_FLOAT32, sum, NULL, &untouched), TC_ERR_NULL_ARGUMENT, "buf");
    EXPECT_RC(tc_all_reduce(comm, x, SIZE_MAX / 2, TC_FLOAT32, sum, NULL, &untouched), TC_ERR_INVALID_ARGUMENT, "overflow");
    EXPECT_RC(tc_all_gather(comm, NULL, x, 8, TC_FLOAT32, NULL, &untouched), TC_ERR_NULL_ARGUMENT, "outputs");
    CHECK(untouched == (tc_work_t *)&done);

    /* a short op-options struct (an older caller): fields beyond its size are
       ignored, so the garbage async_op below must not be read */
    tc_op_options_t short_opts = TC_OP_OPTIONS_INIT;
    short_opts.async_op = 77;
    short_opts.size = offsetof(tc_op_options_t, async_op);
    EXPECT_OK(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, &short_opts, NULL));

    /* split: empty list opts out, a list without the caller is an error */
    tc_comm_t *child = (tc_comm_t *)&done;
    EXPECT_OK(tc_comm_split(comm, NULL, 0, "none", NULL, &child));
    CHECK(child == NULL);
    int ranks_bad[1] = {3};
    EXPECT_RC(tc_comm_split(comm, ranks_bad, 1, "bad", NULL, &child), TC_ERR_INVALID_ARGUMENT, "ranks[0]");

    /* shrink: excluding nobody gives a comm of the same ranks; excluding
       oneself, a rank out of range or a name in use is refused */
    int self_rank[1] = {0};
    child = (tc_comm_t *)&done;
    EXPECT_RC(tc_comm_shrink(comm, self_rank, 1, "shrunk", NULL, &child), TC_ERR_INVALID_USAGE, "exclude_ranks[0]");
    EXPECT_RC(tc_comm_shrink(comm, ranks_bad, 1, "shrunk", NULL, &child), TC_ERR_INVALID_ARGUMENT, "exclude_ranks[0]");
    EXPECT_RC(tc_comm_shrink(comm, NULL, 0, "capi", NULL, &child), TC_ERR_INVALID_ARGUMENT, "already named");
    CHECK(child == (tc_comm_t *)&done);
    EXPECT_OK(tc_comm_shrink(comm, NULL, 0, "shrunk", NULL, &child));
    int shrunk_size = 0;
    EXPECT_OK(tc_comm_get_size(child, &shrunk_size));
    CHECK(child != (tc_comm_t *)&done && shrunk_size == 1);
    EXPECT_OK(tc_all_reduce(child, x, 8, TC_FLOAT32, sum, NULL, NULL));
    EXPECT_OK(tc_comm_finalize(child));
    tc_comm_destroy(child);

    /* use after finalize */
    EXPECT_OK(tc_comm_finalize(comm));
    EXPECT_RC(tc_all_reduce(comm, x, 8, TC_FLOAT32, sum, NULL, NULL), TC_ERR_INVALID_USAGE, "finalized");
    EXPECT_RC(tc_comm_finalize(comm), TC_ERR_INVALID_USAGE, "already finalized");
    EXPECT_RC(tc_comm_shrink(comm, NULL, 0, "late", NULL, &child), TC_ERR_INVALID_USAGE, "finalized");

    /* the flight recorder, still readable after finalize: the three issued
       all_reduces in order (refused calls were never issued), completed */
    char *text = NULL;
    EXPECT_RC(tc_comm_dump_flight_recorder(comm, NULL), TC_ERR_NULL_ARGUMENT, "'text'");
    EXPECT_OK(tc_comm_dump_flight_recorder(comm, &text));
    CHECK(text != NULL && strstr(text, "flight recorder of comm 'capi' (rank 0/1): last 3 of 3 operations") == text);
    const char *row = text ? strchr(text, '\n') : NULL;
    row = row ? strchr(row + 1, '\n') : NULL; /* skip the column header */
    for (int seq = 1; seq <= 3 && row; seq++) {
        int got = 0;
        char op[32] = "", dtype[16] = "", async_col[8] = "";
        unsigned long elements = 0;
        CHECK(sscanf(row + 1, "%d %31s %15s %lu - %7s", &got, op, dtype, &elements, async_col) == 5);
        CHECK(got == seq && strcmp(op, "all_reduce") == 0 && strcmp(dtype, "float32") == 0 && elements == 8);
        CHECK(strcmp(async_col, seq == 2 ? "yes" : "no") == 0);
        const char *end = strchr(row + 1, '\n');
        CHECK(end != NULL && strstr(row + 1, "completed") != NULL && strstr(row + 1, "completed") < end);
        row = end;
    }
    CHECK(row != NULL && row[1] == '\0');
    tc_free(text);
    tc_comm_destroy(comm);

    /* the abort hook: called once, with the code and message, on
       tc_comm_abort; not again on a second abort or on destroy */
    tc_comm_t *hooked = capi_one_rank_comm("capi-hooked", store);
    struct hook_calls calls = {0, 0, ""};
    EXPECT_RC(tc_comm_set_abort_hook(NULL, on_abort, &calls), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_OK(tc_comm_set_abort_hook(hooked, on_abort, &calls));
    EXPECT_OK(tc_all_reduce(hooked, x, 8, TC_FLOAT32, sum, NULL, NULL));
    CHECK(calls.count == 0);
    EXPECT_OK(tc_comm_abort(hooked));
    CHECK(calls.count == 1 && calls.code == TC_ERR_ABORTED && strstr(calls.message, "aborted by the application") != NULL);
    EXPECT_OK(tc_comm_abort(hooked));
    EXPECT_RC(tc_all_reduce(hooked, x, 8, TC_FLOAT32, sum, NULL, NULL), TC_ERR_ABORTED, "aborted");
    tc_comm_destroy(hooked);
    CHECK(calls.count == 1);
    /* a hook removed with NULL is not called */
    tc_comm_t *unhooked = capi_one_rank_comm("capi-unhooked", store);
    EXPECT_OK(tc_comm_set_abort_hook(unhooked, on_abort, &calls));
    EXPECT_OK(tc_comm_set_abort_hook(unhooked, NULL, NULL));
    EXPECT_OK(tc_comm_abort(unhooked));
    tc_comm_destroy(unhooked);
    CHECK(calls.count == 1);

    /* destroying a comm that was not finalized aborts it with a warning,
       which reaches the log callback */
    EXPECT_OK(tc_set_log_callback(on_log, NULL));
    tc_comm_t *leaky = capi_one_rank_comm("capi-unfinalized", store);
    tc_comm_destroy(leaky);
    EXPECT_OK(tc_set_log_callback(NULL, NULL));
    CHECK(warnings >= 1);

    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_comm");
}
