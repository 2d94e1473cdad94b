/* A rank that never arrives at comm creation, two ranks of the nccl backend,
   on the simulated driver and NCCL only (a test double scenario: the fake
   NCCL's rendezvous waits for the missing rank like the real bootstrap, and
   gives up only after TC_SIM_NCCL_INIT_TIMEOUT_MS). Rank 1 never creates
   the comm. Rank 0 creates it with a 2 s timeout; the mode comes from the
   command line:
     abort   abort-on-error on: the process must end with SIGABRT and a
             message soon after 2 s (checked by the caller, which sees the
             signal and the output);
     wait    abort-on-error off: a warning at 2 s, then the call fails when
             the simulated rendezvous gives up; prints "N passed, N failed";
     nonblocking  the hint blocking=0: NCCL's init returns at once and
             joins on its own thread, so the library's polling gives up at
             the 2 s timeout (TC_ERR_TIMEOUT) and aborts the comm, long
             before the rendezvous would (TC_SIM_NCCL_INIT_TIMEOUT_MS).
   Rank 1 sleeps past both. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>
#include <unistd.h>
#include "gpu_util.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int abort_mode = argc > 1 && strcmp(argv[1], "abort") == 0;
    int nonblocking = argc > 1 && strcmp(argv[1], "nonblocking") == 0;
    int R = env_int("RANK", -1);
    if (R != 0) {
        sleep(abort_mode ? 6 : 10);
        return 0;
    }
    gpu_setup();
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "sim_init_hang";
    co.abort_on_error = abort_mode;
    co.timeout_ms = 2000;
    tc_hint_t hint = {"nccl.blocking", "0"};
    if (nonblocking) co.hints = &hint, co.num_hints = 1;
    tc_device_t dev = {TC_DEVICE_CUDA, -1};
    tc_comm_t *comm = NULL;
    double t0 = now_s();
    tc_result_t rc = tc_comm_new("nccl", dev, &co, &comm);
    double took = now_s() - t0;
    if (abort_mode) {
        /* Reaching here means the guard did not abort the process. */
        printf("0 passed, 1 failed (tc_comm_new returned %d after %.1f s)\n", (int)rc, took);
        return 1;
    }
    int passed = 0, failed = 0;
#define EXPECT(ok, what) do { if (ok) passed++; else { failed++; fprintf(stderr, "FAIL %s (%s)\n", what, tc_last_error()); } } while (0)
    EXPECT(rc != TC_SUCCESS && comm == NULL, "creation without the second rank fails");
    if (nonblocking) {
        EXPECT(rc == TC_ERR_TIMEOUT, "a non-blocking creation fails with TC_ERR_TIMEOUT");
        EXPECT(took > 1.5 && took < 10, "... at the comm's 2 s timeout, not the rendezvous's");
    } else {
        EXPECT(took > 2.0, "the call waited past the comm's timeout (the guard only warns)");
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
