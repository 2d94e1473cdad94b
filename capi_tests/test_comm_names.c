/* Comm names are unique among the live comms of a process. Three real
   processes (ranks of one job over a FileStore) each create "world"; a second
   live "world" is refused on every rank before any communication, as are a
   split child named like a live comm and a second live child "pair" (ranks
   0 and 1; rank 2 opts out); a name is free again once its comm is
   destroyed, and the comm made under it then works. In this process, with
   one-rank comms: the same rules for tc_comm_new and tc_comm_split, and an
   unnamed comm never gets the name of a live named one. Under valgrind
   (TC_UNDER_VALGRIND set) only this process's part runs: gloo's multi-rank
   rendezvous hands the store address bytes with uninitialised padding,
   which valgrind reports outside this library's code. */
#include "capi_util.h"
#include <stdint.h>
#include <sys/wait.h>

enum { SIZE = 3 };
static const tc_device_t cpu = {TC_DEVICE_CPU, 0};

static tc_comm_options_t options(const char *name, int rank, int size, tc_store_t *store) {
    tc_comm_options_t o = TC_COMM_OPTIONS_INIT;
    o.name = name;
    o.rank = rank;
    o.world_size = size;
    o.store = store;
    o.abort_on_error = 0;
    o.timeout_ms = 60000; /* a rank left waiting fails instead of hanging */
    return o;
}

/* All-reduces rank + 1 over `comm` and checks the sum. */
static void check_sum(tc_comm_t *comm, int rank, float expected) {
    float x = (float)(rank + 1);
    EXPECT_OK(tc_all_reduce(comm, &x, 1, TC_FLOAT32, (tc_reduce_op_t)TC_REDUCE_OP(TC_SUM), NULL, NULL));
    CHECK(x == expected);
}

static void close_comm(tc_comm_t *comm) {
    EXPECT_OK(tc_comm_finalize(comm));
    tc_comm_destroy(comm);
}

static void pair_names(tc_comm_t *world, tc_store_t *store, int rank) {
    int pair_ranks[2] = {0, 1};
    int in_pair = rank < 2;
    tc_comm_t *pair = NULL, *refused = (tc_comm_t *)&capi_failures;
    EXPECT_OK(tc_comm_split(world, pair_ranks, in_pair ? 2 : 0, "pair", NULL, &pair));
    if (!in_pair) {
        CHECK(pair == NULL);
        return;
    }
    EXPECT_RC(tc_comm_split(world, pair_ranks, 2, "pair", NULL, &refused), TC_ERR_INVALID_ARGUMENT,
              "argument 'name': a live comm of this process is already named \"pair\"");
    EXPECT_RC(tc_comm_split(world, pair_ranks, 2, "world", NULL, &refused), TC_ERR_INVALID_ARGUMENT,
              "\"world\"");
    tc_comm_options_t o = options("pair", rank, SIZE, store);
    EXPECT_RC(tc_comm_new("gloo", cpu, &o, &refused), TC_ERR_INVALID_ARGUMENT, "'opts.name'");
    CHECK(refused == (tc_comm_t *)&capi_failures);
    check_sum(pair, rank, 3.0f);
    close_comm(pair);
    EXPECT_OK(tc_comm_split(world, pair_ranks, 2, "pair", NULL, &pair));
    if (pair) {
        check_sum(pair, rank, 3.0f);
        close_comm(pair);
    }
}

static int rank_main(const char *path, int rank) {
    tc_store_t *store = NULL;
    EXPECT_OK(tc_store_file_new(path, SIZE, &store));
    tc_comm_options_t o = options("world", rank, SIZE, store);
    tc_comm_t *world = NULL, *refused = (tc_comm_t *)&capi_failures;
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &world));
    if (world == NULL) return 1;
    EXPECT_RC(tc_comm_new("gloo", cpu, &o, &refused), TC_ERR_INVALID_ARGUMENT,
              "argument 'opts.name': a live comm of this process is already named \"world\"");
    CHECK(refused == (tc_comm_t *)&capi_failures);
    check_sum(world, rank, 6.0f);
    pair_names(world, store, rank);
    close_comm(world);
    world = NULL;
    EXPECT_OK(tc_comm_new("gloo", cpu, &o, &world));
    if (world) {
        check_sum(world, rank, 6.0f);
        close_comm(world);
    }
    tc_store_free(store);
    return capi_failures ? 1 : 0;
}

/* One-rank comms: a duplicate name refused and free again after destroy,
   for new comms and split children; an unnamed comm made while a comm named
   like a generated name lives. */
static void one_process_names(void) {
    char path[32];
    tc_store_t *store = capi_temp_store(path);
    tc_comm_t *solo = capi_one_rank_comm("solo", store), *refused = (tc_comm_t *)&capi_failures;
    tc_comm_options_t o = options("solo", 0, 1, store);
    EXPECT_RC(tc_comm_new("gloo", cpu, &o, &refused), TC_ERR_INVALID_ARGUMENT, "\"solo\"");
    int ranks[1] = {0};
    tc_comm_t *child = NULL;
    if (solo) EXPECT_OK(tc_comm_split(solo, ranks, 1, "solo-child", NULL, &child));
    if (child) {
        EXPECT_RC(tc_comm_split(solo, ranks, 1, "solo-child", NULL, &refused), TC_ERR_INVALID_ARGUMENT,
                  "\"solo-child\"");
        close_comm(child);
    }
    if (solo) close_comm(solo);
    CHECK(refused == (tc_comm_t *)&capi_failures);
    solo = capi_one_rank_comm("solo", store);
    if (solo) close_comm(solo);

    tc_comm_t *named = capi_one_rank_comm("comm0", store);
    tc_comm_t *unnamed = capi_one_rank_comm(NULL, store);
    const char *name = NULL;
    if (unnamed && tc_comm_get_name(unnamed, &name) == TC_SUCCESS) {
        CHECK(strncmp(name, "comm", 4) == 0 && strcmp(name, "comm0") != 0);
        o = options(name, 0, 1, store);
        EXPECT_RC(tc_comm_new("gloo", cpu, &o, &refused), TC_ERR_INVALID_ARGUMENT, name);
    }
    if (named) close_comm(named);
    if (unnamed) close_comm(unnamed);
    tc_store_free(store);
    unlink(path);
}

static void three_ranks(void) {
    char path[32];
    strcpy(path, "/tmp/tc_names_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) exit(2);
    close(fd);
    unlink(path);
    pid_t pids[SIZE];
    for (int r = 0; r < SIZE; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(path, r));
    }
    for (int r = 0; r < SIZE; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "test_comm_names: rank %d ended with status 0x%x\n", r, status);
            capi_failures++;
        }
    }
    unlink(path);
}

int main(void) {
    if (getenv("TC_UNDER_VALGRIND") == NULL)
        three_ranks();
    else
        fprintf(stderr, "test_comm_names: three-rank part SKIPPED under valgrind (see the file's comment)\n");
    one_process_names();
    CAPI_DONE("test_comm_names");
}
