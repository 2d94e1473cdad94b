/* The C contract of the foundation: version, result strings, per-thread last
   error, NULL/enum/options validation, out-parameters untouched on failure,
   NULL accepted by destroy/free functions. */
#include "capi_util.h"
#include <pthread.h>
#include <stddef.h>

static void *other_thread(void *arg) {
    size_t size = 0;
    /* A failure on this thread must not change the main thread's detail. */
    tc_result_t rc = tc_dtype_size(999, &size);
    int ok = rc == TC_ERR_INVALID_ARGUMENT && strstr(tc_last_error(), "dtype") != NULL;
    *(int *)arg = ok;
    return NULL;
}

int main(void) {
    /* version */
    int major = -1, minor = -1, patch = -1;
    EXPECT_OK(tc_get_version(&major, &minor, &patch));
    CHECK(major == TC_VERSION_MAJOR && minor == TC_VERSION_MINOR && patch == TC_VERSION_PATCH);
    int untouched = 42;
    EXPECT_RC(tc_get_version(NULL, &untouched, &untouched), TC_ERR_NULL_ARGUMENT, "major");
    EXPECT_RC(tc_get_version(&untouched, &untouched, NULL), TC_ERR_NULL_ARGUMENT, "patch");
    CHECK(untouched == 42);

    /* result strings: static, distinct, unknown codes handled */
    CHECK(strcmp(tc_result_string(TC_SUCCESS), "success") == 0);
    CHECK(strcmp(tc_result_string(TC_ERR_NULL_ARGUMENT), tc_result_string(TC_ERR_INVALID_ARGUMENT)) != 0);
    CHECK(strcmp(tc_result_string(123456), "unknown result code") == 0);
    CHECK(strcmp(tc_result_string(-1), "unknown result code") == 0);
    CHECK(strcmp(tc_result_string(TC_ERR_OUT_OF_MEMORY), "out of memory") == 0);

    /* dtype sizes, unknown dtype */
    const struct { tc_dtype_t dt; size_t size; } sizes[] = {
        {TC_FLOAT32, 4}, {TC_FLOAT64, 8}, {TC_FLOAT16, 2}, {TC_BFLOAT16, 2}, {TC_INT8, 1},
        {TC_UINT8, 1}, {TC_INT32, 4}, {TC_INT64, 8}, {TC_BOOL, 1}, {TC_UINT32, 4},
        {TC_UINT64, 8}, {TC_FLOAT8_E4M3, 1}, {TC_FLOAT8_E5M2, 1},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t s = 0;
        EXPECT_OK(tc_dtype_size(sizes[i].dt, &s));
        CHECK(s == sizes[i].size);
    }
    size_t keep = 77;
    EXPECT_RC(tc_dtype_size(13, &keep), TC_ERR_INVALID_ARGUMENT, "unknown dtype 13");
    EXPECT_RC(tc_dtype_size(-1, &keep), TC_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT_RC(tc_dtype_size(TC_FLOAT32, NULL), TC_ERR_NULL_ARGUMENT, "size");
    CHECK(keep == 77);

    /* the last error is per thread */
    EXPECT_RC(tc_get_version(NULL, &untouched, &untouched), TC_ERR_NULL_ARGUMENT, "major");
    int thread_ok = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, &thread_ok) == 0);
    pthread_join(t, NULL);
    CHECK(thread_ok);
    CHECK(strstr(tc_last_error(), "tc_get_version") != NULL);
    CHECK(strstr(tc_last_error(), "major") != NULL);

    /* comm creation: NULL and invalid arguments, out-parameter untouched */
    tc_comm_t *comm = (tc_comm_t *)&untouched;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    tc_comm_options_t copts = TC_COMM_OPTIONS_INIT;
    CHECK(copts.size == sizeof(tc_comm_options_t) && copts.magic == TC_COMM_OPTIONS_MAGIC);
    EXPECT_RC(tc_comm_new(NULL, cpu, &copts, &comm), TC_ERR_NULL_ARGUMENT, "backend");
    EXPECT_RC(tc_comm_new("gloo", cpu, &copts, NULL), TC_ERR_NULL_ARGUMENT, "comm");
    EXPECT_RC(tc_comm_new("carrier-pigeon", cpu, &copts, &comm), TC_ERR_INVALID_ARGUMENT, "carrier-pigeon");
    tc_device_t bad_dev = {7, 0};
    EXPECT_RC(tc_comm_new("gloo", bad_dev, &copts, &comm), TC_ERR_INVALID_ARGUMENT, "device.type");
    tc_device_t bad_index = {TC_DEVICE_CUDA, -2};
    EXPECT_RC(tc_comm_new("gloo", bad_index, &copts, &comm), TC_ERR_INVALID_ARGUMENT, "device.index");
    tc_comm_options_t bad_magic = TC_COMM_OPTIONS_INIT;
    bad_magic.magic = 0x12345678u;
    EXPECT_RC(tc_comm_new("gloo", cpu, &bad_magic, &comm), TC_ERR_INVALID_ARGUMENT, "bad magic");
    tc_comm_options_t tiny = TC_COMM_OPTIONS_INIT;
    tiny.size = 4;
    EXPECT_RC(tc_comm_new("gloo", cpu, &tiny, &comm), TC_ERR_INVALID_ARGUMENT, "header");
    tc_comm_options_t bad_abort = TC_COMM_OPTIONS_INIT;
    bad_abort.abort_on_error = 5;
    EXPECT_RC(tc_comm_new("gloo", cpu, &bad_abort, &comm), TC_ERR_INVALID_ARGUMENT, "abort_on_error");
    tc_comm_options_t bad_hints = TC_COMM_OPTIONS_INIT;
    bad_hints.num_hints = 2;
    EXPECT_RC(tc_comm_new("gloo", cpu, &bad_hints, &comm), TC_ERR_NULL_ARGUMENT, "opts.hints");
    CHECK(comm == (tc_comm_t *)&untouched);

    /* operations on a NULL comm; option and enum checks name their argument */
    float buf[4] = {0};
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_op_options_t oopts = TC_OP_OPTIONS_INIT;
    CHECK(oopts.size == sizeof(tc_op_options_t) && oopts.magic == TC_OP_OPTIONS_MAGIC);
    EXPECT_RC(tc_all_reduce(NULL, buf, 4, TC_FLOAT32, sum, &oopts, NULL), TC_ERR_NULL_ARGUMENT, "comm");
    EXPECT_RC(tc_send(NULL, buf, 4, TC_FLOAT32, 0, NULL, NULL), TC_ERR_NULL_ARGUMENT, "comm");
    EXPECT_RC(tc_barrier(NULL, NULL, NULL), TC_ERR_NULL_ARGUMENT, "comm");

    /* queries on NULL handles */
    int rank = -5;
    EXPECT_RC(tc_comm_get_rank(NULL, &rank), TC_ERR_NULL_ARGUMENT, "comm");
    CHECK(rank == -5);
    int done = -5;
    EXPECT_RC(tc_work_is_completed(NULL, &done), TC_ERR_NULL_ARGUMENT, "work");
    EXPECT_RC(tc_work_wait(NULL, NULL), TC_ERR_NULL_ARGUMENT, "work");
    CHECK(done == -5);

    /* destroy/free accept NULL */
    tc_comm_destroy(NULL);
    tc_work_free(NULL);
    tc_batch_free(NULL);
    tc_window_free(NULL);
    EXPECT_OK(tc_set_log_callback(NULL, NULL));

    CAPI_DONE("test_errors");
}
