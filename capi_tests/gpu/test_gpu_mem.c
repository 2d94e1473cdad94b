/* Memory registration and the nccl backend's allocator on device memory:
   tc_mem_alloc (ncclMemAlloc, or cuMemAlloc with an NCCL older than 2.19),
   an all_reduce on the allocated buffer (sync, then async + wait_blocking),
   tc_comm_register on that buffer and on a cuMemAlloc buffer with
   all_reduces on both, double deregister/free and foreign pointers refused,
   and the rules after finalize (register/alloc refused, free and deregister
   still accepted). Runs as one rank or under tc-run with several ranks on
   one GPU. Prints "N passed, N failed". */
#define _POSIX_C_SOURCE 200809L
#include "gpu_util.h"

static tc_comm_t *comm;
static int R, N;
static CUstream stream;
static int passed, failed, skipped;

static void report(const char *what, int ok) {
    if (ok) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "rank %d: FAIL %s (%s)\n", R, what, tc_last_error());
    }
}

enum { COUNT = 1000 };

/* Fills `d` with rank+1+i%7, sums it over the ranks on `stream` (sync or
   async + wait_blocking) and checks every element. */
static void all_reduce_check(const char *what, void *d, int async_op) {
    float h[COUNT];
    for (int i = 0; i < COUNT; i++) h[i] = (float)(R + 1 + i % 7);
    h2d(d, h, sizeof h);
    tc_op_options_t o = TC_OP_OPTIONS_INIT;
    o.stream = stream;
    o.async_op = async_op;
    tc_work_t *w = NULL;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    tc_result_t rc = tc_all_reduce(comm, d, COUNT, TC_FLOAT32, sum, &o, async_op ? &w : NULL);
    if (rc == TC_SUCCESS && async_op) rc = tc_work_wait_blocking(w);
    tc_work_free(w);
    CU(cuStreamSynchronize(stream));
    int ok = rc == TC_SUCCESS;
    if (ok) {
        d2h(h, d, sizeof h);
        for (int i = 0; i < COUNT && ok; i++) {
            float want = (float)(N * (N + 1) / 2 + N * (i % 7));
            if (h[i] != want) {
                fprintf(stderr, "rank %d: %s: element %d is %g, expected %g\n", R, what, i, h[i], want);
                ok = 0;
            }
        }
    }
    report(what, ok);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    gpu_setup();
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    tc_comm_options_t co = TC_COMM_OPTIONS_INIT;
    co.name = "gpu_mem";
    co.abort_on_error = 0;
    tc_device_t dev = {TC_DEVICE_CUDA, -1};
    tc_result_t rc = tc_comm_new("nccl", dev, &co, &comm);
    if (rc != TC_SUCCESS) {
        fprintf(stderr, "tc_comm_new(nccl): %s: %s\n", tc_result_string(rc), tc_last_error());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    tc_comm_get_rank(comm, &R);
    tc_comm_get_size(comm, &N);
    const size_t bytes = COUNT * sizeof(float);

    /* the allocator */
    void *p = NULL;
    rc = tc_mem_alloc(comm, bytes, &p);
    report("tc_mem_alloc", rc == TC_SUCCESS && p != NULL);
    if (rc != TC_SUCCESS) p = NULL;
    void *untouched = (void *)&rc;
    void *q = untouched;
    report("tc_mem_alloc of 0 bytes refused", tc_mem_alloc(comm, 0, &q) == TC_ERR_INVALID_ARGUMENT && q == untouched);
    if (p) {
        all_reduce_check("all_reduce on tc_mem_alloc memory (sync)", p, 0);
        all_reduce_check("all_reduce on tc_mem_alloc memory (async)", p, 1);
    }

    /* registration of the allocated buffer and of a cuMemAlloc buffer */
    void *plain = dalloc(bytes);
    void *h1 = untouched, *h2 = untouched;
    rc = p ? tc_comm_register(comm, p, bytes, &h1) : TC_ERR_INVALID_USAGE;
    if (rc == TC_ERR_UNSUPPORTED) {
        fprintf(stderr, "rank %d: registration skipped: %s\n", R, tc_last_error());
        skipped++;
    } else {
        report("tc_comm_register(tc_mem_alloc buffer)", rc == TC_SUCCESS && h1 != untouched);
        report("tc_comm_register(cuMemAlloc buffer)", tc_comm_register(comm, plain, bytes, &h2) == TC_SUCCESS && h2 != untouched);
        report("tc_comm_register of 0 bytes refused", tc_comm_register(comm, plain, 0, &q) == TC_ERR_INVALID_ARGUMENT && q == untouched);
        all_reduce_check("all_reduce on a registered tc_mem_alloc buffer", p, 0);
        all_reduce_check("all_reduce on a registered cuMemAlloc buffer", plain, 1);
        report("tc_comm_deregister", tc_comm_deregister(comm, h1) == TC_SUCCESS);
        /* NCCL may register nothing and hand out NULL, which is always fine */
        if (h1 != NULL) {
            report("second tc_comm_deregister refused", tc_comm_deregister(comm, h1) == TC_ERR_INVALID_ARGUMENT);
        }
        report("tc_comm_deregister(NULL)", tc_comm_deregister(comm, NULL) == TC_SUCCESS);
        /* NCCL counts registrations by range: the same buffer again, or a
           part of it, gives the same handle, and each registration needs
           its own deregister (the last one releases it; h2 stays live) */
        void *h3 = untouched, *h4 = untouched;
        rc = tc_comm_register(comm, plain, bytes, &h3);
        tc_result_t rc4 = tc_comm_register(comm, (char *)plain + 64, bytes - 128, &h4);
        report("tc_comm_register of a registered buffer and of a part of it", rc == TC_SUCCESS && rc4 == TC_SUCCESS &&
               (h2 == NULL || (h3 == h2 && h4 == h2)));
        report("tc_comm_deregister of the second registration", rc != TC_SUCCESS || tc_comm_deregister(comm, h3) == TC_SUCCESS);
        report("tc_comm_deregister of the sub-range registration", rc4 != TC_SUCCESS || tc_comm_deregister(comm, h4) == TC_SUCCESS);
        all_reduce_check("all_reduce on a buffer still registered once", plain, 0);
        /* host memory: accepted, and left unregistered by NCCL */
        float *pinned = NULL;
        CU(cuMemHostAlloc((void **)&pinned, bytes, 0));
        void *hh = untouched;
        rc = tc_comm_register(comm, pinned, bytes, &hh);
        report("tc_comm_register of pinned host memory accepted", rc == TC_SUCCESS && hh != untouched);
        report("tc_comm_deregister of pinned host memory", rc != TC_SUCCESS || tc_comm_deregister(comm, hh) == TC_SUCCESS);
        CU(cuMemFreeHost(pinned));
    }

    /* frees: once, own pointers only */
    if (p) {
        report("tc_mem_free", tc_mem_free(comm, p) == TC_SUCCESS);
        report("second tc_mem_free refused", tc_mem_free(comm, p) == TC_ERR_INVALID_ARGUMENT);
    }
    report("tc_mem_free of a cuMemAlloc pointer refused", tc_mem_free(comm, plain) == TC_ERR_INVALID_ARGUMENT);

    /* after finalize: no new registrations or allocations; releasing works */
    void *late = NULL;
    int have_late = tc_mem_alloc(comm, bytes, &late) == TC_SUCCESS;
    report("tc_mem_alloc before finalize", have_late);
    rc = tc_comm_finalize(comm);
    report("finalize", rc == TC_SUCCESS);
    report("tc_mem_alloc after finalize refused", tc_mem_alloc(comm, bytes, &q) == TC_ERR_INVALID_USAGE && q == untouched);
    report("tc_comm_register after finalize refused",
           tc_comm_register(comm, plain, bytes, &q) == TC_ERR_INVALID_USAGE && q == untouched);
    if (h2 != untouched) report("tc_comm_deregister after finalize", tc_comm_deregister(comm, h2) == TC_SUCCESS);
    if (have_late) report("tc_mem_free after finalize", tc_mem_free(comm, late) == TC_SUCCESS);
    tc_comm_destroy(comm);
    dfree(plain);
    CU(cuStreamDestroy(stream));
    printf("rank %d: %d passed, %d failed, %d skipped\n", R, passed, failed, skipped);
    if (R == 0) printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
