/* Reconfigurable nccl comms (tc_comm_reconfigure) with 3 processes, in the
   GPU suite (part 4) and on the simulated NCCL (make sim-gpu-test, also on
   its NCCL 2.18 double: a reconfigure forms a fresh NCCL comm, so every
   NCCL version can). The processes publish their init handles through the
   job's store; then:
   1. all three form the comm from the list (ranks in list order);
   2. process 1 leaves (finalizes), processes 0 and 2 shrink to two;
   3. process 1 comes back as a newcomer (a new comm, never formed) and
      the three grow the comm, the newcomer last;
   4. the newcomer dies without a word while the others all-reduce; they
      see the failure and re-form the comm of the two survivors.
   After each step: rank and size as listed, and an all_reduce (float32
   SUM on the device, on a stream of the test's) with the right sum; a
   reused uuid is refused. Prints "N passed, N failed" on every rank that
   lives to the end. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "scenario.h"

static tc_store_t *store;
static int P; /* this process's number in the job, 0..2 */

/* A comm with no members yet, its handle published under `key`. */
static tc_comm_t *reconfigurable(const char *key) {
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "recfg";
    co.abort_on_error = 0;
    co.timeout_ms = 60000;
    co.store = store;
    co.enable_reconfigure = 1;
    tc_device_t dev = {TC_DEVICE_CUDA, -1};
    tc_comm_t *comm = NULL;
    if (tc_comm_new("nccl", dev, &co, &comm) != TC_SUCCESS) {
        fprintf(stderr, "tc_comm_new (enable_reconfigure): %s\n", tc_last_error());
        printf("0 passed, 1 failed\n");
        exit(1);
    }
    const char *h = NULL;
    expect(tc_comm_get_init_handle(comm, &h) == TC_SUCCESS && h != NULL, "the comm has an init handle");
    expect(tc_store_set(store, key, h, strlen(h)) == TC_SUCCESS, "the handle is published");
    return comm;
}

/* The handle published under `key` (waits for it); freed by the caller. */
static char *handle_of(const char *key) {
    void *v = NULL;
    size_t n = 0;
    if (tc_store_get_alloc(store, key, &v, &n) != TC_SUCCESS) {
        fprintf(stderr, "store get %s: %s\n", key, tc_last_error());
        printf("%d passed, %d failed\n", passed, failed + 1);
        exit(1);
    }
    char *s = malloc(n + 1);
    memcpy(s, v, n);
    s[n] = 0;
    tc_free(v);
    return s;
}

static void expect_shape(tc_comm_t *comm, int rank, int size, const char *what) {
    int r = -1, n = -1;
    tc_comm_get_rank(comm, &r);
    tc_comm_get_size(comm, &n);
    if (r != rank || n != size) fprintf(stderr, "process %d: rank %d of %d, expected %d of %d\n", P, r, n, rank, size);
    expect(r == rank && n == size, what);
}

static tc_result_t reconfigure(tc_comm_t *comm, int64_t uuid, const char *const *handles, size_t n) {
    tc_result_t rc = tc_comm_reconfigure(comm, uuid, handles, n, TC_INIT_HANDLES_LIST, NULL, NULL);
    if (rc != TC_SUCCESS) fprintf(stderr, "process %d: reconfigure %lld: %s\n", P, (long long)uuid, tc_last_error());
    return rc;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT"), *rank = getenv("RANK"),
               *world = getenv("WORLD_SIZE");
    if (!addr || !port || !rank || !world || atoi(world) != 3) {
        fprintf(stderr, "run with 3 ranks under tc-run (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)\n");
        return 1;
    }
    P = atoi(rank);
    gpu_setup();
    if (tc_store_tcp_new(addr, (uint16_t)atoi(port), 0, 3, 60000, &store) != TC_SUCCESS) {
        fprintf(stderr, "store: %s\n", tc_last_error());
        return 1;
    }
    CUstream stream;
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    void *d = dalloc(4096);

    char key[32];
    snprintf(key, sizeof key, "recfg/h%d", P);
    tc_comm_t *comm = reconfigurable(key);
    char *h[3];
    for (int p = 0; p < 3; p++) {
        snprintf(key, sizeof key, "recfg/h%d", p);
        h[p] = handle_of(key);
    }

    /* 1. form, all three */
    const char *all[3] = {h[0], h[1], h[2]};
    expect(reconfigure(comm, 1, all, 3) == TC_SUCCESS, "the three form the comm");
    expect_shape(comm, P, 3, "formed: ranks in list order");
    expect(scenario_all_reduce_of(comm, d, (float)P + 1, &o) == 6, "all_reduce on the formed comm");
    expect(tc_comm_reconfigure(comm, 1, all, 3, TC_INIT_HANDLES_LIST, NULL, NULL) == TC_ERR_INVALID_USAGE,
           "a uuid used before is refused");

    /* 2. process 1 leaves, 0 and 2 shrink */
    char *newcomer = NULL;
    if (P == 1) {
        expect(tc_comm_finalize(comm) == TC_SUCCESS, "the leaving member finalizes");
        tc_comm_destroy(comm);
        comm = reconfigurable("recfg/h1-again");
    } else {
        const char *two[2] = {h[0], h[2]};
        expect(reconfigure(comm, 2, two, 2) == TC_SUCCESS, "0 and 2 shrink the comm");
        expect_shape(comm, P == 0 ? 0 : 1, 2, "shrunk: ranks 0 and 1");
        expect(scenario_all_reduce_of(comm, d, (float)P + 1, &o) == 1 + 3, "all_reduce on the shrunk comm");
    }

    /* 3. grow: the newcomer joins, last */
    newcomer = handle_of("recfg/h1-again");
    const char *grown[3] = {h[0], h[2], newcomer};
    int grown_rank = P == 0 ? 0 : P == 2 ? 1 : 2;
    expect(reconfigure(comm, 3, grown, 3) == TC_SUCCESS, "the comm grows by the newcomer");
    expect_shape(comm, grown_rank, 3, "grown: the newcomer last");
    expect(scenario_all_reduce_of(comm, d, (float)grown_rank + 1, &o) == 6, "all_reduce on the grown comm");

    /* 4. the newcomer dies mid all_reduce; the survivors re-form */
    if (P == 1) _exit(0); /* gone without a word, as a killed process */
    tc_op_options_t a = o;
    a.async_op = 1;
    tc_work_t *w = NULL;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    expect(tc_all_reduce(comm, d, 64, TC_FLOAT32, sum, &a, &w) == TC_SUCCESS, "the all_reduce is issued");
    tc_result_t rc = tc_work_wait_blocking(w);
    tc_work_free(w);
    printf("process %d: the all_reduce the newcomer left ended with %s\n", P, tc_result_string(rc));
    expect(rc != TC_SUCCESS, "the survivors see the failure");
    const char *survivors[2] = {h[0], h[2]};
    expect(reconfigure(comm, 4, survivors, 2) == TC_SUCCESS, "the survivors re-form the failed comm");
    expect_shape(comm, P == 0 ? 0 : 1, 2, "re-formed: ranks 0 and 1");
    expect(scenario_all_reduce_of(comm, d, 5, &o) == 10, "all_reduce on the re-formed comm");
    expect(tc_comm_finalize(comm) == TC_SUCCESS, "the re-formed comm finalizes");
    tc_comm_destroy(comm);

    for (int p = 0; p < 3; p++) free(h[p]);
    free(newcomer);
    tc_store_free(store);
    dfree(d);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
