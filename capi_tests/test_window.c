/* One-sided windows through the C API on a one-rank gloo comm: register,
   put and signal to this rank itself, wait for the signal, map the own
   buffer, and the argument and state errors (out-of-bounds puts, unknown
   ranks, waits with no signal, calls without a registration). Asynchronous
   calls (async_op = 1): put + signal + wait with their work handles waited
   and freed, argument errors failing the call itself, a wait timing out
   through its work, and a pending wait ended by freeing its window.
   Multi-rank windows are tested with real processes in
   tests/gloo_window.rs. */
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
    EXPECT_RC(tc_window_put(win, src, 16, 0, 0, NULL, NULL), TC_ERR_INVALID_USAGE, "none was registered yet");
    EXPECT_RC(tc_window_get(win, src, 16, 0, 0, NULL, NULL), TC_ERR_INVALID_USAGE, "get on window of comm 'window'");
    EXPECT_RC(tc_window_deregister(win), TC_ERR_INVALID_USAGE, "none was registered yet");
    EXPECT_RC(tc_window_register(win, mem, 0), TC_ERR_INVALID_ARGUMENT, "'bytes'");
    CHECK(strstr(tc_last_error(), "got 0") != NULL);
    /* A window where a comm is expected: says what it is. */
    tc_window_t *not_comm = NULL;
    EXPECT_RC(tc_window_new((tc_comm_t *)win, &not_comm), TC_ERR_INVALID_ARGUMENT, "it is a live tc_window_t");

    EXPECT_OK(tc_window_register(win, mem, sizeof mem));
    EXPECT_RC(tc_window_register(win, mem, sizeof mem), TC_ERR_INVALID_USAGE, "already registered");
    CHECK(strstr(tc_last_error(), "64 bytes") != NULL);

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

    /* Asynchronous put + signal + wait: each returns a work handle; waited
       in reverse order, each ends COMPLETED, and the data is in place. */
    tc_op_options_t async = TC_OP_OPTIONS_INIT;
    async.async_op = 1;
    unsigned char asrc[16];
    for (int i = 0; i < 16; i++) asrc[i] = (unsigned char)(0x40 + i);
    tc_work_t *wput = NULL, *wsig = NULL, *wwait = NULL;
    EXPECT_OK(tc_window_put(win, asrc, 16, 0, 40, &async, &wput));
    EXPECT_OK(tc_window_signal(win, 0, &async, &wsig));
    EXPECT_OK(tc_window_wait_signal(win, 0, &async, &wwait));
    CHECK(wput != NULL && wsig != NULL && wwait != NULL);
    int st = -1;
    EXPECT_OK(tc_work_status(wput, &st));
    CHECK(st == TC_WORK_NOT_STARTED || st == TC_WORK_IN_PROGRESS || st == TC_WORK_COMPLETED);
    EXPECT_OK(tc_work_wait(wwait, NULL));
    EXPECT_OK(tc_work_wait(wsig, NULL));
    EXPECT_OK(tc_work_wait_blocking(wput));
    tc_work_t *ws[3] = {wput, wsig, wwait};
    for (int k = 0; k < 3; k++) {
        st = -1;
        EXPECT_OK(tc_work_status(ws[k], &st));
        CHECK(st == TC_WORK_COMPLETED);
        done = 0;
        EXPECT_OK(tc_work_is_completed(ws[k], &done));
        CHECK(done == 1);
        tc_work_free(ws[k]);
    }
    for (int i = 40; i < 56; i++) CHECK(mem[i] == (unsigned char)(0x40 + i - 40));
    CHECK(mem[39] == 0xa5 && mem[56] == 0xa5);

    /* Argument errors fail an asynchronous call itself; *work is untouched. */
    tc_work_t *bad = NULL;
    EXPECT_RC(tc_window_put(win, asrc, 16, 0, 56, &async, &bad), TC_ERR_INVALID_ARGUMENT, "'dst_offset'");
    EXPECT_RC(tc_window_put(win, NULL, 16, 0, 0, &async, &bad), TC_ERR_NULL_ARGUMENT, "'src'");
    EXPECT_RC(tc_window_signal(win, 2, &async, &bad), TC_ERR_INVALID_ARGUMENT, "'peer'");
    CHECK(bad == NULL);

    /* An asynchronous wait with no signal: the call succeeds, its work
       times out (TC_ERR_TIMEOUT from tc_work_wait, with the detail). */
    tc_op_options_t aquick = async;
    aquick.timeout_ms = 200;
    EXPECT_OK(tc_window_wait_signal(win, 0, &aquick, &wwait));
    EXPECT_RC(tc_work_wait(wwait, NULL), TC_ERR_TIMEOUT, "wait_signal");
    st = -1;
    EXPECT_OK(tc_work_status(wwait, &st));
    CHECK(st == TC_WORK_TIMED_OUT);
    tc_work_free(wwait);

    /* A work handle freed before its signal ran does not cancel it. */
    wsig = NULL;
    EXPECT_OK(tc_window_signal(win, 0, &async, &wsig));
    tc_work_free(wsig);
    EXPECT_OK(tc_window_wait_signal(win, 0, &quick, NULL));

    /* Deregister, register again (a smaller buffer), free. */
    EXPECT_OK(tc_window_deregister(win));
    EXPECT_RC(tc_window_signal(win, 0, NULL, NULL), TC_ERR_INVALID_USAGE, "it was deregistered");
    EXPECT_OK(tc_window_register(win, mem, 8));
    EXPECT_RC(tc_window_put(win, src, 16, 0, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "window of 8 bytes");
    EXPECT_OK(tc_window_put(win, src, 8, 0, 0, NULL, NULL));
    CHECK(mem[0] == 1 && mem[7] == 8);
    tc_window_free(win); /* without deregister: frees the registration too */
    /* A freed window is refused, not used, and the message says why. */
    EXPECT_RC(tc_window_put(win, src, 8, 0, 0, NULL, NULL), TC_ERR_INVALID_ARGUMENT, "freed already");
    CHECK(strstr(tc_last_error(), "'window'") != NULL);

    /* Freeing a window ends its pending asynchronous wait with
       TC_ERR_ABORTED; the work handle stays usable until freed. */
    tc_window_t *win2 = NULL;
    unsigned char mem2[8];
    EXPECT_OK(tc_window_new(comm, &win2));
    EXPECT_OK(tc_window_register(win2, mem2, sizeof mem2));
    tc_work_t *pending = NULL;
    EXPECT_OK(tc_window_wait_signal(win2, 0, &async, &pending)); /* the comm's timeout: minutes */
    done = -1;
    EXPECT_OK(tc_work_is_completed(pending, &done));
    CHECK(done == 0);
    tc_window_free(win2);
    /* "closed" when the wait had started, "freed" when still queued. */
    EXPECT_RC(tc_work_wait(pending, NULL), TC_ERR_ABORTED, "window");
    CHECK(strstr(tc_last_error(), "closed") != NULL || strstr(tc_last_error(), "freed") != NULL);
    st = -1;
    EXPECT_OK(tc_work_status(pending, &st));
    CHECK(st == TC_WORK_ERROR);
    tc_work_free(pending);

    /* A window outlives nothing: after finalize, new windows are refused,
       and a live window's calls name the call, the window and the reason. */
    tc_window_t *win3 = NULL;
    EXPECT_OK(tc_window_new(comm, &win3));
    EXPECT_OK(tc_comm_finalize(comm));
    EXPECT_RC(tc_window_register(win3, mem, sizeof mem), TC_ERR_INVALID_USAGE, "register on window of comm 'window'");
    CHECK(strstr(tc_last_error(), "finalized") != NULL);
    tc_window_free(win3);
    win = NULL;
    EXPECT_RC(tc_window_new(comm, &win), TC_ERR_INVALID_USAGE, "finalized");
    CHECK(win == NULL);
    tc_comm_destroy(comm);
    tc_store_free(store);
    unlink(path);
    CAPI_DONE("test_window");
}
