/* One rank of a 2-rank job on one host doing N blocking 4-byte f32
   all_reduces (the shared-memory path), for counting the instructions per
   call under callgrind (scripts/hook-cost.sh). Usage:
     bench_hook_cost STORE_PATH RANK N [hooks]
   `hooks`: registers a no-op pre and post hook first (looked up at run
   time, so the program also runs on a library without hooks). */
#include "capi_util.h"

#include <dlfcn.h>

static void noop_hook(const void *info, void *user_data) {
    (void)info;
    (void)user_data;
}

typedef tc_result_t (*add_hook_fn)(tc_comm_t *, void (*)(const void *, void *), void *, uint64_t *);

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int rank = atoi(argv[2]), n = atoi(argv[3]);
    tc_store_t *store = NULL;
    EXPECT_OK(tc_store_file_new(argv[1], 2, &store));
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = "hook-cost";
    o.rank = rank;
    o.world_size = 2;
    o.store = store;
    o.timeout_ms = 600000;
    tc_comm_t *comm = NULL;
    tc_device_t cpu = {TC_DEVICE_CPU, 0};
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &comm));
    if (comm == NULL) return 1;
    if (argc > 4 && strcmp(argv[4], "hooks") == 0) {
        const char *names[2] = {"tc_comm_add_pre_hook", "tc_comm_add_post_hook"};
        for (int i = 0; i < 2; i++) {
            add_hook_fn add = (add_hook_fn)(uintptr_t)dlsym(RTLD_DEFAULT, names[i]);
            if (add == NULL) return 3;
            EXPECT_OK(add(comm, noop_hook, NULL, NULL));
        }
    }
    float x = 1;
    tc_reduce_op_t sum = TC_REDUCE_OP(TC_SUM);
    for (int i = 0; i < n; i++) {
        x = 1;
        EXPECT_OK(tc_all_reduce(comm, &x, 1, TC_FLOAT32, sum, NULL, NULL));
    }
    CHECK(x == 2.0f);
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
    tc_store_free(store);
    return capi_failures != 0;
}
