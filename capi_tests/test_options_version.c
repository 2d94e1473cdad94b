/* The `version` field of every options struct (tc_comm_options_t for
   tc_comm_new and tc_comm_split, tc_op_options_t for operations): version 0
   is refused naming the version; the current version is read; a version one
   newer than the library's, with a larger struct, is accepted and its known
   fields are read (an invalid known field is still refused, a valid one takes
   effect) while the unknown trailing field is ignored. */
#include "capi_util.h"
#include <stdint.h>

/* What a caller compiled against a newer header would pass. */
struct newer_comm_options {
    tc_comm_options_t base;
    uint64_t field_from_the_future;
};
struct newer_op_options {
    tc_op_options_t base;
    uint64_t field_from_the_future;
};

static const tc_device_t cpu = {TC_DEVICE_CPU, 0};

static tc_comm_options_t one_rank(const char *name, tc_store_t *store, uint32_t version) {
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.version = version;
    o.name = name;
    o.rank = 0;
    o.world_size = 1;
    o.store = store;
    o.abort_on_error = 0;
    return o;
}

static void comm_options(tc_store_t *store) {
    tc_comm_t *comm = (tc_comm_t *)&capi_failures;
    tc_comm_options_t v0 = one_rank("v0", store, 0);
    EXPECT_RC(tc_comm_new("gloo", cpu, &v0, &comm), TC_ERR_INVALID_ARGUMENT, "'opts': version 0");
    CHECK(comm == (tc_comm_t *)&capi_failures);

    struct newer_comm_options newer = {one_rank("v-next", store, TC_COMM_OPTIONS_VERSION + 1), ~0ull};
    newer.base.size = sizeof newer;
    newer.base.abort_on_error = 7; /* a known field: still read and checked */
    EXPECT_RC(tc_comm_new("gloo", cpu, &newer.base, &comm), TC_ERR_INVALID_ARGUMENT, "abort_on_error");
    newer.base.abort_on_error = 0;
    comm = NULL;
    EXPECT_OK(tc_comm_new("gloo", cpu, &newer.base, &comm));
    const char *name = NULL;
    if (comm && tc_comm_get_name(comm, &name) == TC_SUCCESS) CHECK(strcmp(name, "v-next") == 0);

    tc_comm_t *parent = comm;
    if (parent == NULL) return;
    int ranks[1] = {0};
    tc_comm_t *child = (tc_comm_t *)&capi_failures;
    EXPECT_RC(tc_comm_split(parent, ranks, 1, "child", &v0, &child), TC_ERR_INVALID_ARGUMENT, "version 0");
    CHECK(child == (tc_comm_t *)&capi_failures);
    tc_comm_options_t current = one_rank(NULL, NULL, TC_COMM_OPTIONS_VERSION);
    current.timeout_ms = 12345;
    EXPECT_OK(tc_comm_split(parent, ranks, 1, "child", &current, &child));
    tc_comm_t *newer_child = NULL;
    EXPECT_OK(tc_comm_split(parent, ranks, 1, "newer-child", &newer.base, &newer_child));
    tc_comm_t *comms[3] = {child, newer_child, parent};
    for (int i = 0; i < 3; i++) {
        if (comms[i] == NULL || comms[i] == (tc_comm_t *)&capi_failures) continue;
        EXPECT_OK(tc_comm_finalize(comms[i]));
        tc_comm_destroy(comms[i]);
    }
}

static void op_options(tc_comm_t *comm) {
    float x = 1;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_work_t *work = (tc_work_t *)&capi_failures;
    tc_op_options_t v0 = TC_OP_OPTIONS_INIT;
    v0.version = 0;
    EXPECT_RC(tc_all_reduce(comm, &x, 1, TC_FLOAT32, sum, &v0, &work), TC_ERR_INVALID_ARGUMENT,
              "'opts': version 0");
    EXPECT_RC(tc_barrier(comm, &v0, &work), TC_ERR_INVALID_ARGUMENT, "version 0");
    CHECK(work == (tc_work_t *)&capi_failures);

    tc_op_options_t current = TC_OP_OPTIONS_INIT;
    current.async_op = 1;
    work = NULL;
    EXPECT_OK(tc_all_reduce(comm, &x, 1, TC_FLOAT32, sum, &current, &work));
    if (work) {
        EXPECT_OK(tc_work_wait(work, NULL));
        tc_work_free(work);
    }

    struct newer_op_options newer = {TC_OP_OPTIONS_INIT, ~0ull};
    newer.base.size = sizeof newer;
    newer.base.version = TC_OP_OPTIONS_VERSION + 1;
    newer.base.async_op = 3; /* a known field: still read and checked */
    EXPECT_RC(tc_barrier(comm, &newer.base, &work), TC_ERR_INVALID_ARGUMENT, "async_op");
    newer.base.async_op = 1;
    work = NULL;
    EXPECT_OK(tc_all_reduce(comm, &x, 1, TC_FLOAT32, sum, &newer.base, &work));
    if (work) {
        EXPECT_OK(tc_work_wait(work, NULL));
        tc_work_free(work);
    }
    CHECK(x == 1.0f);
}

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    comm_options(store);
    tc_comm_t *comm = capi_one_rank_comm("op-versions", store);
    if (comm) {
        op_options(comm);
        EXPECT_OK(tc_comm_finalize(comm));
        tc_comm_destroy(comm);
    }
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_options_version");
}
