/* One-sided windows through the C API on a one-rank gloo comm: register,
   put and signal to this rank itself, wait for the signal, map the own
   buffer, and the argument and state errors (out-of-bounds puts, unknown
   ranks, waits with no signal, calls without a registration). Multi-rank
   windows are tested with real processes in tests/gloo_window.rs. */
#include "capi_util.h"

int main(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *comm = capi_one_rank_comm("window", store);
    if (comm == NULL) CAPI_DONE("test_window");

    tc_window_t *win = NULL;
    EXPECT_OK(tc_window_new(comm, &win));
    unsigned char mem[64], src[16];
    memset(mem, 0xa5, sizeof mem);
    for (int i = 0; i < 16; i++) src[i] = (unsigned char)(i + 1);

    /* Nothing registered yet. */
    EXPECT_RC(tc_window_put(win, src, 16, 0, 0, NULL, NULL), TC_ERR_INVALID_USAGE, "no buffer is registered");
    EXPECT_RC(tc_window_deregister(win), TC_ERR_INVALID_USAGE, "no buffer");
    EXPECT_RC(tc_window_register(win, mem, 0), TC_ERR_INVALID_ARGUMENT, "'bytes'");

    EXPECT_OK(tc_window_register(win, mem, sizeof mem));
    EXPECT_RC(tc_window_register(win, mem, sizeof mem), TC_ERR_INVALID_USAGE, "already registered");

    /* A put to this rank lands at the offset and nowhere else. */
    tc_work_t *work = NULL;
    EXPECT_OK(tc_window_put(win, src, 16, 0, 8, NULL, &work));
    CHECK(work != NULL);
    int done = 0;
    EXPECT_OK(tc_work_is_completed(work, &done));
    CHECK(done == 1);
    tc_work_free(work);
    EXPECT_OK(tc_window_signal(win, 0, NULL, NULL));
    EXPECT_OK(tc_window_wait_signal(win, 0, NULL, NULL));
    for (int i = 0; i < 64; i++) CHECK(mem[i] == (i >= 8 && i < 24 ? (unsigned char)(i - 7) : 0xa5));

    /* Signals count: two signals satisfy two waits, a third wait times out. */
    EXPECT_OK(tc_window_signal(win, 0, NULL, NULL));
    EXPECT_OK(tc_window_signal(win, 0, NULL, NULL));
    EXPECT_OK(tc_window_wait_signal(win, 0, NULL, NULL));
    EXPECT_OK(tc_window_wait_signal(win, 0, NULL, NULL));
    tc_op_options_t quick = TC_OP_OPTIONS_INIT;
    quick.timeout_ms = 200;
    EXPECT_RC(tc_window_wait_signal(win, 0, &quick, NULL), TC_ERR_TIMEOUT, NULL);

    /* Bounds and ranks. */
    EXPECT_RC(tc_window_put(win, src, 16, 0, 56, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'dst_offset'");
    EXPECT_RC(tc_window_put(win, src, 16, 0, (size_t)-8, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'dst_offset'");
    EXPECT_RC(tc_window_put(win, src, 16, 1, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'dst_rank'");
    EXPECT_RC(tc_window_signal(win, -1, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'peer'");
    EXPECT_RC(tc_window_wait_signal(win, 3, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "'peer'");
    EXPECT_OK(tc_window_put(win, src, 0, 0, 64, NULL, NULL)); /* empty put at the end */
    for (int i = 24; i < 64; i++) CHECK(mem[i] == 0xa5);

    void *mapped = NULL;
    EXPECT_OK(tc_window_map_remote(win, 0, &mapped));
    CHECK(mapped == (void *)mem);
    EXPECT_RC(tc_window_map_remote(win, 1, &mapped), TC_ERR_INVALID_ARGUMENT, "'rank'");

    /* Deregister, register again (a smaller buffer), free. */
    EXPECT_OK(tc_window_deregister(win));
    EXPECT_RC(tc_window_signal(win, 0, NULL, NULL), TC_ERR_INVALID_USAGE, "no buffer is registered");
    EXPECT_OK(tc_window_register(win, mem, 8));
    EXPECT_RC(tc_window_put(win, src, 16, 0, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "window of 8 bytes");
    EXPECT_OK(tc_window_put(win, src, 8, 0, 0, NULL, NULL));
    CHECK(mem[0] == 1 && mem[7] == 8);
    tc_window_free(win); /* without deregister: frees the registration too */

    /* A window outlives nothing: after finalize, new windows are refused. */
    EXPECT_OK(tc_comm_finalize(comm));
    win = NULL;
    EXPECT_RC(tc_window_new(comm, &win), TC_ERR_INVALID_USAGE, "finalized");
    CHECK(win == NULL);
    tc_comm_destroy(comm);
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_window");
}
