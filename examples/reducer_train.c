/* Data-parallel training with the gradient reducer: a small two-layer
   linear model fitted by SGD, each rank on its own shard of the data.

   Like DDP: the parameters start from rank 0's (tc_broadcast_coalesced);
   each step's backward pass computes the gradients last layer first and
   marks each ready as soon as it is final, so its bucket's all-reduce runs
   while the backward pass goes on; tc_reducer_finalize then leaves every
   rank with the averaged gradients, and the ranks take the same step.
   Checks at the end that every rank holds the same parameters and that the
   loss fell. Run: make run-reducer (tc-run -n 4 -- build/reducer_train). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <torchcomm.h>

#define TRY(call)                                                                        \
    do {                                                                                 \
        tc_result_t rc_ = (call);                                                        \
        if (rc_ != TC_SUCCESS) {                                                         \
            fprintf(stderr, "%s failed: %s: %s\n", #call, tc_result_string(rc_),        \
                    tc_last_error());                                                    \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

enum { IN = 64, HID = 32, OUT = 8, BATCH = 32, STEPS = 300 };
/* Parameters in registration order: w1, b1, w2, b2. */
enum { W1, B1, W2, B2, NPARAMS };
static const size_t counts[NPARAMS] = {HID * IN, HID, OUT * HID, OUT};

static float uniform(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    return ((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* One step's forward and backward on this rank's batch; marks each
   gradient ready as soon as the backward pass has finished it. */
static float forward_backward(float *const p[NPARAMS], float *const g[NPARAMS],
                              const float *teacher, unsigned *seed, tc_reducer_t *reducer) {
    float x[BATCH][IN], h[BATCH][HID], y[BATCH][OUT], dy[BATCH][OUT], dh[BATCH][HID];
    float loss = 0;
    for (int b = 0; b < BATCH; b++) {
        for (int i = 0; i < IN; i++) x[b][i] = uniform(seed);
        for (int j = 0; j < HID; j++) {
            h[b][j] = p[B1][j];
            for (int i = 0; i < IN; i++) h[b][j] += p[W1][j * IN + i] * x[b][i];
        }
        for (int k = 0; k < OUT; k++) {
            float target = 0;
            for (int i = 0; i < IN; i++) target += teacher[k * IN + i] * x[b][i];
            y[b][k] = p[B2][k];
            for (int j = 0; j < HID; j++) y[b][k] += p[W2][k * HID + j] * h[b][j];
            dy[b][k] = 2 * (y[b][k] - target) / (BATCH * OUT);
            loss += (y[b][k] - target) * (y[b][k] - target) / (BATCH * OUT);
        }
    }
    /* Backward, last layer first: b2, w2, then b1, w1. */
    memset(g[B2], 0, counts[B2] * sizeof(float));
    for (int b = 0; b < BATCH; b++)
        for (int k = 0; k < OUT; k++) g[B2][k] += dy[b][k];
    TRY(tc_reducer_mark_ready(reducer, B2));
    memset(g[W2], 0, counts[W2] * sizeof(float));
    for (int b = 0; b < BATCH; b++)
        for (int k = 0; k < OUT; k++)
            for (int j = 0; j < HID; j++) g[W2][k * HID + j] += dy[b][k] * h[b][j];
    TRY(tc_reducer_mark_ready(reducer, W2));
    for (int b = 0; b < BATCH; b++)
        for (int j = 0; j < HID; j++) {
            dh[b][j] = 0;
            for (int k = 0; k < OUT; k++) dh[b][j] += dy[b][k] * p[W2][k * HID + j];
        }
    memset(g[B1], 0, counts[B1] * sizeof(float));
    memset(g[W1], 0, counts[W1] * sizeof(float));
    for (int b = 0; b < BATCH; b++)
        for (int j = 0; j < HID; j++) {
            g[B1][j] += dh[b][j];
            for (int i = 0; i < IN; i++) g[W1][j * IN + i] += dh[b][j] * x[b][i];
        }
    TRY(tc_reducer_mark_ready(reducer, B1));
    TRY(tc_reducer_mark_ready(reducer, W1));
    return loss;
}

int main(void) {
    tc_comm_t *comm;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    TRY(tc_comm_new("gloo", cpu, NULL, &comm));
    int rank, size;
    TRY(tc_comm_get_rank(comm, &rank));
    TRY(tc_comm_get_size(comm, &size));

    float *p[NPARAMS], *g[NPARAMS];
    tc_dtype_t dtypes[NPARAMS];
    unsigned seed = 1000u + (unsigned)rank; /* every rank starts differently */
    for (int i = 0; i < NPARAMS; i++) {
        p[i] = malloc(counts[i] * sizeof(float));
        g[i] = malloc(counts[i] * sizeof(float));
        dtypes[i] = TC_FLOAT32;
        for (size_t k = 0; k < counts[i]; k++) p[i][k] = 0.1f * uniform(&seed);
    }
    /* The model all ranks learn (the same on every rank). */
    float teacher[OUT * IN];
    unsigned tseed = 7;
    for (int i = 0; i < OUT * IN; i++) teacher[i] = 0.2f * uniform(&tseed);

    /* Start from rank 0's parameters, as DDP does. */
    TRY(tc_broadcast_coalesced(comm, (void *const *)p, counts, dtypes, NPARAMS, 1 << 20, 0, NULL,
                               NULL));

    /* Small buckets so that even this model has several: b2 and w2 go out
       while the first layer's gradients are still being computed. */
    tc_reducer_options_t opts = TC_REDUCER_OPTIONS_INIT;
    opts.first_bucket_bytes = 1024;
    opts.bucket_cap_bytes = 4096;
    tc_reducer_t *reducer;
    TRY(tc_reducer_new(comm, (void *const *)g, counts, dtypes, NPARAMS, &opts, &reducer));
    size_t buckets;
    TRY(tc_reducer_num_buckets(reducer, &buckets));

    float first = 0, last = 0;
    for (int step = 0; step < STEPS; step++) {
        float loss = forward_backward(p, g, teacher, &seed, reducer);
        TRY(tc_reducer_finalize(reducer)); /* g now holds the average over ranks */
        for (int i = 0; i < NPARAMS; i++)
            for (size_t k = 0; k < counts[i]; k++) p[i][k] -= 0.2f * g[i][k];
        if (step == 0) first = loss;
        last = loss;
        if (rank == 0 && step % 50 == 0) printf("step %2d  loss %.5f (rank 0's batch)\n", step, loss);
    }

    /* Every rank must hold the same parameters: compare with rank 0's. */
    float *copy[NPARAMS];
    for (int i = 0; i < NPARAMS; i++) {
        copy[i] = malloc(counts[i] * sizeof(float));
        memcpy(copy[i], p[i], counts[i] * sizeof(float));
    }
    TRY(tc_broadcast_coalesced(comm, (void *const *)copy, counts, dtypes, NPARAMS, 1 << 20, 0,
                               NULL, NULL));
    int same = 1;
    for (int i = 0; i < NPARAMS; i++) same &= memcmp(copy[i], p[i], counts[i] * sizeof(float)) == 0;
    int ok = same && last < 0.5f * first && isfinite(last);
    printf("rank %d/%d: %zu buckets, loss %.5f -> %.5f, parameters %s rank 0's: %s\n", rank, size,
           buckets, first, last, same ? "equal" : "DIFFER FROM", ok ? "ok" : "FAILED");

    tc_reducer_free(reducer);
    TRY(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    for (int i = 0; i < NPARAMS; i++) {
        free(p[i]);
        free(g[i]);
        free(copy[i]);
    }
    return ok ? 0 : 1;
}
