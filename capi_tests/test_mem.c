/* Memory registration and the backend allocator through the C API with a
   one-rank gloo comm: argument checks (each names its argument, out-pointers
   untouched on failure), the gloo backend's TC_ERR_UNSUPPORTED answer to
   registration naming the backend, its shared-memory allocator, NULL
   accepted by the release calls, and use after finalize and after abort. The nccl side runs in capi_tests/gpu/test_gpu_mem.c. */
#include "capi_util.h"
#include <stdint.h>
#include <unistd.h>

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);

    /* NULL comm, before any comm exists */
    char buf[64];
    void *sentinel = (void *)path;
    void *handle = sentinel, *ptr = sentinel;
    EXPECT_RC(tc_comm_register(NULL, buf, sizeof buf, &handle), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_comm_deregister(NULL, sentinel), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_mem_alloc(NULL, 64, &ptr), TC_ERR_NULL_ARGUMENT, "'comm'");
    EXPECT_RC(tc_mem_free(NULL, sentinel), TC_ERR_NULL_ARGUMENT, "'comm'");
    CHECK(handle == sentinel && ptr == sentinel);

    tc_comm_t *comm = capi_one_rank_comm("capi-mem", store);
    if (comm == NULL) CAPI_DONE("test_mem");

    /* bad arguments with a live comm: named, nothing written */
    EXPECT_RC(tc_comm_register(comm, NULL, sizeof buf, &handle), TC_ERR_NULL_ARGUMENT, "'buf'");
    EXPECT_RC(tc_comm_register(comm, buf, sizeof buf, NULL), TC_ERR_NULL_ARGUMENT, "'handle'");
    EXPECT_RC(tc_comm_register(comm, buf, 0, &handle), TC_ERR_INVALID_ARGUMENT, "'bytes'");
    EXPECT_RC(tc_mem_alloc(comm, 0, &ptr), TC_ERR_INVALID_ARGUMENT, "'bytes'");
    EXPECT_RC(tc_mem_alloc(comm, 64, NULL), TC_ERR_NULL_ARGUMENT, "'ptr'");
    CHECK(handle == sentinel && ptr == sentinel);

    /* gloo has no registration: the answer names the function, the comm
       and the backend */
    EXPECT_RC(tc_comm_register(comm, buf, sizeof buf, &handle), TC_ERR_UNSUPPORTED, "gloo backend");
    CHECK(capi_last_error_mentions("tc_comm_register") && capi_last_error_mentions("capi-mem"));
    EXPECT_RC(tc_comm_deregister(comm, sentinel), TC_ERR_UNSUPPORTED, "gloo backend");
    CHECK(handle == sentinel);

    /* its allocator hands out zeroed shared host memory (windows on it are
       mapped by same-host peers); freeing checks the pointer */
    EXPECT_OK(tc_mem_alloc(comm, 10000, &ptr));
    CHECK(ptr != sentinel && ptr != NULL);
    unsigned char *bytes = ptr;
    int zeroed = 1;
    for (int i = 0; i < 10000; i++) zeroed &= bytes[i] == 0;
    CHECK(zeroed);
    memset(ptr, 0x5a, 10000);
    EXPECT_RC(tc_mem_free(comm, sentinel), TC_ERR_INVALID_ARGUMENT, "not allocated by tc_mem_alloc");
    CHECK(capi_last_error_mentions("tc_mem_free"));
    EXPECT_OK(tc_mem_free(comm, ptr));
    EXPECT_RC(tc_mem_free(comm, ptr), TC_ERR_INVALID_ARGUMENT, "freed already");
    ptr = sentinel;

    /* NULL handle / pointer: no-ops, like free(NULL) */
    EXPECT_OK(tc_comm_deregister(comm, NULL));
    EXPECT_OK(tc_mem_free(comm, NULL));

    /* the comm still works after all of that */
    float x[4] = {1, 2, 3, 4};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    EXPECT_OK(tc_all_reduce(comm, x, 4, TC_FLOAT32, sum, NULL, NULL));
    CHECK(x[3] == 4.0f);

    /* after finalize: registering and allocating are usage errors (checked
       before the backend); releasing still reaches the backend */
    EXPECT_OK(tc_comm_finalize(comm));
    EXPECT_RC(tc_comm_register(comm, buf, sizeof buf, &handle), TC_ERR_INVALID_USAGE, "finalized");
    EXPECT_RC(tc_mem_alloc(comm, 64, &ptr), TC_ERR_INVALID_USAGE, "finalized");
    EXPECT_RC(tc_mem_alloc(comm, 0, &ptr), TC_ERR_INVALID_ARGUMENT, "'bytes'");
    EXPECT_RC(tc_mem_free(comm, sentinel), TC_ERR_INVALID_ARGUMENT, "not allocated by tc_mem_alloc");
    EXPECT_OK(tc_mem_free(comm, NULL));
    CHECK(handle == sentinel && ptr == sentinel);
    tc_comm_destroy(comm);

    /* after abort: TC_ERR_ABORTED */
    tc_comm_t *aborted = capi_one_rank_comm("capi-mem-aborted", store);
    if (aborted) {
        EXPECT_OK(tc_comm_abort(aborted));
        EXPECT_RC(tc_comm_register(aborted, buf, sizeof buf, &handle), TC_ERR_ABORTED, "aborted");
        EXPECT_RC(tc_mem_alloc(aborted, 64, &ptr), TC_ERR_ABORTED, "aborted");
        CHECK(handle == sentinel && ptr == sentinel);
        tc_comm_finalize(aborted);
        tc_comm_destroy(aborted);
    }

    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_mem");
}
