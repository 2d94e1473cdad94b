// The C++ interface (include/torchcomm.hpp) on every rank of a job started by
// tc-run: every operation with its result checked, errors as tc::Error
// (code and detail), dtype deduction, move-only handles, the store through
// its client to tc-run's server, windows, split and batches, coalesced
// broadcast, the gradient reducer (its hooks too), sparse all-reduce, comm
// settings, gather_single, tags, window get, the persistent all-gather and
// operation hooks. Built as C++17
// and C++20 (std::span) by scripts/test-cpp.sh.
#include <torchcomm.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>
#if __cplusplus >= 202002L
#include <span>
#endif

static int failures = 0;
#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

// Runs `f`, expecting a tc::Error with `code` whose message mentions `needle`.
template <class F> static void expect_error(F &&f, tc_result_t code, const char *needle, int line) {
    try {
        f();
        std::fprintf(stderr, "line %d: no tc::Error thrown\n", line);
        failures++;
    } catch (const tc::Error &e) {
        if (e.code() != code || std::strstr(e.what(), needle) == nullptr) {
            std::fprintf(stderr, "line %d: tc::Error %d \"%s\", expected %d mentioning \"%s\"\n", line, e.code(),
                         e.what(), code, needle);
            failures++;
        }
    }
}
#define EXPECT_ERROR(stmt, code, needle) expect_error([&] { stmt; }, code, needle, __LINE__)

// Compile-time: element types map to dtypes; handles are move-only.
static_assert(tc::dtype_v<float> == tc::DType::Float32);
static_assert(tc::dtype_v<const double> == tc::DType::Float64);
static_assert(tc::dtype_v<int8_t> == tc::DType::Int8 && tc::dtype_v<uint8_t> == tc::DType::UInt8);
static_assert(tc::dtype_v<int32_t> == tc::DType::Int32 && tc::dtype_v<uint32_t> == tc::DType::UInt32);
static_assert(tc::dtype_v<long long> == tc::DType::Int64 && tc::dtype_v<uint64_t> == tc::DType::UInt64);
static_assert(tc::dtype_v<bool> == tc::DType::Bool);
static_assert(!tc::has_dtype<short>::value && !tc::has_dtype<void>::value);
static_assert(!std::is_copy_constructible_v<tc::Comm> && std::is_nothrow_move_constructible_v<tc::Comm>);
static_assert(!std::is_copy_assignable_v<tc::Work> && !std::is_copy_constructible_v<tc::Store>);
static_assert(!std::is_copy_constructible_v<tc::Window> && !std::is_copy_constructible_v<tc::Memory>);
// A read-only container is an input, never an output.
static_assert(std::is_convertible_v<const std::vector<float> &, tc::ConstBuffer>);
static_assert(!std::is_convertible_v<const std::vector<float> &, tc::Buffer>);
static_assert(std::is_convertible_v<std::vector<float> &, tc::Buffer>);
static_assert(!std::is_convertible_v<std::vector<short> &, tc::Buffer>);

static void test_errors_without_comm() {
    tc::Comm empty;
    EXPECT_ERROR(empty.rank(), TC_ERR_NULL_ARGUMENT, "'comm'");
    try {
        tc::Store::tcp("127.0.0.1", 1, false, -1, std::chrono::milliseconds(200));
        CHECK(false);
    } catch (const tc::Error &e) {
        CHECK(e.code() != TC_SUCCESS);
        CHECK(!e.detail().empty() && std::string(e.what()).find(e.detail()) != std::string::npos);
        CHECK(std::string(e.what()).find("tc_store_tcp_new") != std::string::npos);
    }
    EXPECT_ERROR(tc::dtype_size(static_cast<tc::DType>(99)), TC_ERR_INVALID_ARGUMENT, "99");
    CHECK(tc::dtype_size(tc::DType::BFloat16) == 2);
    tc::Version v = tc::version();
    CHECK(v.major == TC_VERSION_MAJOR && v.minor == TC_VERSION_MINOR);
}

static void test_store(const tc::Store &job, int rank, int size) {
    tc::Store s = tc::Store::prefix(job, "cpp-test");
    s.set("k" + std::to_string(rank), std::string("v\0x", 3));
    CHECK(s.add("counter", 2) >= 2);
    std::vector<std::string> keys;
    for (int r = 0; r < size; r++) keys.push_back("k" + std::to_string(r));
    s.wait(keys, std::chrono::milliseconds(60000));
    CHECK(s.check(keys));
    CHECK(s.get("k0") == std::string("v\0x", 3));
    char small[2];
    EXPECT_ERROR(s.get_into("k0", small, sizeof small), TC_ERR_BUFFER_TOO_SMALL, "");
    char big[8];
    CHECK(s.get_into("k0", big, sizeof big) == 3 && big[2] == 'x');
    std::string mine = "cas" + std::to_string(rank);
    CHECK(s.compare_set(mine, "", "one") == "one");
    CHECK(s.compare_set(mine, "one", "two") == "two");
    CHECK(s.compare_set(mine, "nope", "three") == "two");
    CHECK(s.delete_key(mine) && !s.delete_key(mine));
    CHECK(!s.check({"never"}));
    EXPECT_ERROR(s.wait({"never"}, std::chrono::milliseconds(50)), TC_ERR_TIMEOUT, "never");
    CHECK(s.num_keys() >= size);
    tc::Store moved = std::move(s);
    CHECK(!s && moved && moved.get("k0").size() == 3);
}

template <class T> static bool all_equal(const std::vector<T> &v, T x) {
    for (const T &e : v)
        if (e != x) return false;
    return true;
}

static void test_collectives(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    const int64_t tri = int64_t(size) * (size - 1) / 2;  // sum of ranks
    std::vector<float> f(5, float(rank + 1));
    comm.all_reduce(f, tc::Sum);
    CHECK(all_equal(f, float(size * (size + 1) / 2)));
#if __cplusplus >= 202002L
    std::vector<int64_t> backing(3, rank);
    comm.all_reduce(std::span<int64_t>(backing), tc::Max);
    CHECK(all_equal<int64_t>(backing, size - 1));
#endif
    int32_t raw[4] = {rank, rank, rank, rank};
    comm.all_reduce({raw, 4}, tc::Sum);  // pointer + count
    CHECK(raw[3] == tri);
    double d = rank + 1.0;
    comm.all_reduce(tc::Buffer(&d, 1, tc::DType::Float64), tc::premul_sum(0.5));
    CHECK(d == 0.5 * size * (size + 1) / 2);

    std::vector<uint8_t> b(6, uint8_t(rank == 1 ? 42 : 0));
    comm.broadcast(b, 1);
    CHECK(all_equal<uint8_t>(b, 42));
    std::vector<int32_t> r(2, rank + 1);
    comm.reduce(r, 0, tc::Product);
    if (rank == 0) {
        int32_t fact = 1;
        for (int i = 1; i <= size; i++) fact *= i;
        CHECK(r[0] == fact && r[1] == fact);
    }

    std::vector<int64_t> in(2, rank);
    std::vector<int64_t> gathered(2 * size, -1);
    comm.all_gather_single(gathered, in);
    for (int i = 0; i < 2 * size; i++) CHECK(gathered[i] == i / 2);
    std::vector<std::vector<int64_t>> outs(size, std::vector<int64_t>(2, -1));
    comm.all_gather({outs.begin(), outs.end()}, in);
    for (int i = 0; i < size; i++) CHECK(all_equal<int64_t>(outs[i], i));

    // Uneven: rank r contributes r + 1 elements.
    std::vector<size_t> counts(size);
    std::iota(counts.begin(), counts.end(), size_t(1));
    std::vector<int32_t> vin(rank + 1, rank);
    std::vector<int32_t> vout(size_t(size) * (size + 1) / 2, -1);
    comm.all_gather_v(vout, counts, vin);
    for (size_t i = 0, r0 = 0; r0 < size_t(size); r0++)
        for (size_t k = 0; k <= r0; k++) CHECK(vout[i++] == int32_t(r0));

    std::vector<float> rs_in(3 * size, 1.0f), rs_out(3, 0.0f);
    comm.reduce_scatter_single(rs_out, rs_in, tc::Sum);
    CHECK(all_equal(rs_out, float(size)));
    std::vector<std::vector<float>> rs_lists(size, std::vector<float>(3, float(rank)));
    std::vector<tc::ConstBuffer> rs_inputs(rs_lists.begin(), rs_lists.end());
    comm.reduce_scatter(rs_out, rs_inputs, tc::Min);
    CHECK(all_equal(rs_out, 0.0f));
    std::vector<int32_t> rsv_in(vout.size(), 1), rsv_out(rank + 1, 0);
    comm.reduce_scatter_v(rsv_out, rsv_in, counts, tc::Sum);
    CHECK(all_equal(rsv_out, size));

    // all_to_all: block j from rank i holds 10 * i + j.
    std::vector<int32_t> a_in(size), a_out(size, -1);
    for (int j = 0; j < size; j++) a_in[j] = 10 * rank + j;
    comm.all_to_all_single(a_out, a_in);
    for (int i = 0; i < size; i++) CHECK(a_out[i] == 10 * i + rank);
    std::vector<std::vector<int32_t>> l_in(size), l_out(size, std::vector<int32_t>(1, -1));
    for (int j = 0; j < size; j++) l_in[j] = {10 * rank + j};
    comm.all_to_all({l_out.begin(), l_out.end()}, {l_in.begin(), l_in.end()});
    for (int i = 0; i < size; i++) CHECK(l_out[i][0] == 10 * i + rank);
    // v: rank i sends j + 1 elements to rank j, receives rank + 1 from each.
    std::vector<size_t> in_counts(size), out_counts(size, size_t(rank + 1));
    std::iota(in_counts.begin(), in_counts.end(), size_t(1));
    std::vector<int32_t> v_in(size_t(size) * (size + 1) / 2, rank), v_out(size_t(size) * (rank + 1), -1);
    comm.all_to_all_v_single(v_out, out_counts, v_in, in_counts);
    for (size_t i = 0; i < v_out.size(); i++) CHECK(v_out[i] == int32_t(i / (rank + 1)));

    comm.barrier();
    std::vector<std::vector<double>> sc_lists(size, std::vector<double>(2));
    for (int j = 0; j < size; j++) sc_lists[j] = {double(j), double(j)};
    std::vector<double> sc_out(2, -1.0);
    std::vector<tc::ConstBuffer> sc_in;
    if (rank == 0) sc_in.assign(sc_lists.begin(), sc_lists.end());
    comm.scatter(sc_out, sc_in, 0);
    CHECK(all_equal(sc_out, double(rank)));
    std::vector<std::vector<double>> g_lists(size, std::vector<double>(2, -1.0));
    std::vector<tc::Buffer> g_out;
    if (rank == size - 1) g_out.assign(g_lists.begin(), g_lists.end());
    comm.gather(g_out, sc_out, size - 1);
    if (rank == size - 1)
        for (int j = 0; j < size; j++) CHECK(all_equal(g_lists[j], double(j)));
}

static void test_p2p_and_async(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    std::vector<int64_t> out(4, rank), got(4, -1);
    // Operations of a comm run in issue order: even ranks send first.
    tc::Work sw, rw;
    if (rank % 2 == 0) sw = comm.send(out, next, tc::OpOptions().async().timeout(std::chrono::seconds(120)));
    rw = comm.recv(got, prev, tc::OpOptions().async());
    if (rank % 2 == 1) sw = comm.send(out, next, tc::OpOptions().async());
    sw.wait();
    rw.wait_blocking();
    CHECK(rw.is_completed() && rw.status() == tc::WorkStatus::Completed);
    CHECK(all_equal<int64_t>(got, prev));

    std::vector<int64_t> got2(4, -1);
    tc::Batch batch = comm.batch();
    batch.send(out, next).recv(got2, prev);
    tc::Work bw = batch.issue(tc::OpOptions().async().hint("purpose", "test"));
    bw.wait();
    CHECK(all_equal<int64_t>(got2, prev));

    std::vector<float> x(16, 1.0f);
    tc::Work w = comm.all_reduce(x, tc::Sum, tc::OpOptions().async());
    tc::Work moved = std::move(w);
    CHECK(!w && moved);
    moved.wait();
    CHECK(all_equal(x, float(size)));
}

static void test_argument_errors(tc::Comm &comm) {
    const int size = comm.size();
    std::vector<float> in(2), wrong(2 * size + 1);
    EXPECT_ERROR(comm.all_gather_single(wrong, in), TC_ERR_INVALID_ARGUMENT, "'output' has");
    std::vector<int32_t> ints(2 * size);
    EXPECT_ERROR(comm.all_gather_single(ints, in), TC_ERR_INVALID_ARGUMENT, "dtype");
    std::vector<tc::Buffer> one{tc::Buffer(in)};
    if (size > 1) EXPECT_ERROR(comm.all_gather(one, in), TC_ERR_INVALID_ARGUMENT, "one buffer per rank");
    EXPECT_ERROR(comm.broadcast(in, size), TC_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERROR(comm.all_reduce(tc::Buffer(nullptr, 2, tc::DType::Float32), tc::Sum), TC_ERR_NULL_ARGUMENT,
                 "'buf'");
    EXPECT_ERROR(comm.all_reduce(in, tc::BitAnd), TC_ERR_UNSUPPORTED, "float32");
    CHECK(!comm.async_error().has_value());
    // Buffer registration is an nccl feature: gloo says so.
    EXPECT_ERROR(comm.register_buffer(in.data(), 8), TC_ERR_UNSUPPORTED, "");
}

static void test_split_window_memory(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    // The pair {0, 1}; other ranks opt out with an empty list.
    std::vector<int> pair_ranks;
    if (rank < 2) pair_ranks = {0, 1};
    tc::Comm pair = comm.split(pair_ranks, "cpp-pair");
    CHECK(bool(pair) == (rank < 2));
    if (pair) {
        CHECK(pair.size() == 2 && pair.rank() == rank && pair.name() == "cpp-pair");
        int v = rank + 1;
        pair.all_reduce({&v, 1}, tc::Sum);
        CHECK(v == 3);
        pair.finalize();
    }
    // The last rank excluded (it takes no part); the others keep their ranks.
    if (rank < size - 1) {
        std::vector<int> last{size - 1};
        tc::Comm small = comm.shrink(last, "cpp-shrunk");
        CHECK(small.size() == size - 1 && small.rank() == rank && small.name() == "cpp-shrunk");
        int v = rank + 1;
        small.all_reduce({&v, 1}, tc::Sum);
        CHECK(v == (size - 1) * size / 2);
        small.finalize();
    }

    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    tc::Memory mem = comm.mem_alloc(8 * sizeof(int64_t));
    {
        tc::Window win(comm);
        win.register_buffer(mem);
        CHECK(win.map_remote<int64_t>(rank) == mem.as<int64_t>());
        std::array<int64_t, 2> src{rank, rank * 100};
        win.put(src, next, 2 * sizeof(int64_t)).wait();
        win.signal(next);
        win.wait_signal(prev, tc::OpOptions().timeout(std::chrono::seconds(120)));
        CHECK(mem.as<int64_t>()[2] == prev && mem.as<int64_t>()[3] == prev * 100);
        EXPECT_ERROR(win.put(src, next, 7 * sizeof(int64_t)), TC_ERR_INVALID_ARGUMENT, "");
        win.deregister();
    }
    mem.free();
    CHECK(mem.get() == nullptr);
}

static void test_broadcast_coalesced(tc::Comm &comm) {
    const int rank = comm.rank(), root = comm.size() - 1;
    // Mixed dtypes and sizes, 16-byte messages: several buckets per dtype.
    std::vector<float> a(7, -1.0f), c(1, -1.0f);
    std::vector<int64_t> b(5, -1);
    std::vector<double> empty;
    if (rank == root) {
        std::iota(a.begin(), a.end(), 0.5f);
        std::iota(b.begin(), b.end(), int64_t(100));
        c[0] = 42.0f;
    }
    comm.broadcast_coalesced({a, b, empty, c}, 16, root);
    for (size_t i = 0; i < a.size(); i++) CHECK(a[i] == 0.5f + float(i));
    for (size_t i = 0; i < b.size(); i++) CHECK(b[i] == int64_t(100 + i));
    CHECK(c[0] == 42.0f);
    std::vector<int32_t> d(3, rank == 0 ? 9 : 0);
    tc::Work w = comm.broadcast_coalesced({d}, 1 << 20, 0, tc::OpOptions().async());
    w.wait();
    CHECK(all_equal(d, 9));
    EXPECT_ERROR(comm.broadcast_coalesced({d}, 0, 0), TC_ERR_INVALID_ARGUMENT, "buffer_bytes");
}

// Three gradients (float32, float64, float32), 16-byte buckets; rank r's
// gradient i holds r + 1 + i everywhere.
static void fill_grads(std::vector<float> &g0, std::vector<double> &g1, std::vector<float> &g2, int rank) {
    std::fill(g0.begin(), g0.end(), float(rank + 1));
    std::fill(g1.begin(), g1.end(), double(rank + 2));
    std::fill(g2.begin(), g2.end(), float(rank + 3));
}
static void mark_all(tc::Reducer &r, size_t n) {
    for (size_t i = n; i-- > 0;) r.mark_ready(i);  // backward order
}
template <class T> static bool near_all(const std::vector<T> &v, double x, double tol) {
    for (const T &e : v)
        if (std::abs(double(e) - x) > tol * std::abs(x)) return false;
    return true;
}

static void test_reducer(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    const double mean = (size + 1) / 2.0;  // mean over ranks of rank + 1
    std::vector<float> g0(5), g2(7);
    std::vector<double> g1(3);
    tc::Reducer red(comm, {g0, g1, g2}, tc::ReducerOptions().bucket_cap_bytes(16).first_bucket_bytes(16));
    CHECK(red.num_buckets() >= 3 && red.grad<double>(1) == g1.data());
    for (int iter = 0; iter < 2; iter++) {  // the default hook averages
        fill_grads(g0, g1, g2, rank);
        mark_all(red, 3);
        red.finalize();
        CHECK(near_all(g0, mean, 1e-6) && near_all(g1, mean + 1, 1e-12) && near_all(g2, mean + 2, 1e-6));
    }

    // A hook of our own: the maximum, asynchronous; bucket fields checked.
    // (A hook must not call its own reducer.)
    const size_t buckets = red.num_buckets();
    size_t calls = 0, grads_seen = 0;
    red.set_hook([&](tc::Comm &c, tc::GradBucket &b) {
        calls++;
        CHECK(b.num_buckets() == buckets && b.index() < b.num_buckets());
        CHECK(b.is_last() == (b.index() + 1 == b.num_buckets()) && c.size() == size);
        size_t total = 0;
        for (size_t k = 0; k < b.grad_indices().size(); k++) total += b.lengths()[k], grads_seen++;
        CHECK(total == b.buffer().count());
        return c.all_reduce(b.buffer(), tc::Max, tc::OpOptions().async());
    });
    fill_grads(g0, g1, g2, rank);
    mark_all(red, 3);
    tc::Work fw = red.finalize_async();
    fw.wait();
    CHECK(calls == buckets && grads_seen == 3);
    CHECK(all_equal(g0, float(size)) && all_equal(g1, double(size + 1)) && all_equal(g2, float(size + 2)));

    // A hook that throws: the exception stays on our side of the boundary,
    // the call that ran it throws tc::Error with its text, and the reducer
    // serves the next iteration.
    red.set_hook([](tc::Comm &, tc::GradBucket &) -> tc::Work { throw std::runtime_error("hook says no"); });
    fill_grads(g0, g1, g2, rank);
    EXPECT_ERROR(mark_all(red, 3), TC_ERR_INVALID_USAGE, "hook says no");
    try {
        red.finalize();
        CHECK(false);
    } catch (const tc::Error &e) {
        CHECK(e.code() != TC_SUCCESS);
    }
    CHECK(all_equal(g0, float(rank + 1)));  // nothing written back

    red.set_builtin_hook(tc::Hook::Fp16Compress);
    fill_grads(g0, g1, g2, rank);
    int refused = 0;  // the float64 bucket: refused by its hook
    for (size_t i = 3; i-- > 0;) {
        try {
            red.mark_ready(i);
        } catch (const tc::Error &e) {
            refused += e.code() == TC_ERR_UNSUPPORTED;
        }
    }
    CHECK(refused == 1);
    EXPECT_ERROR(red.finalize(), TC_ERR_UNSUPPORTED, "");
    EXPECT_ERROR(red.mark_ready(3), TC_ERR_INVALID_ARGUMENT, "");
}

// Rank-1 PowerSGD reproduces a rank-1 average up to rounding.
static void test_reducer_powersgd(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    std::vector<float> m(6 * 8);
    for (size_t i = 0; i < 6; i++)
        for (size_t j = 0; j < 8; j++) m[i * 8 + j] = float(rank + 1) * float(i + 1) * (float(j) - 3.5f);
    tc::Reducer red(comm, {m});
    tc_powersgd_options_t opts = TC_POWERSGD_OPTIONS_INIT;
    size_t rows[] = {6};
    opts.rows = rows;
    opts.num_rows = 1;
    opts.start_iter = 0;
    red.set_powersgd(opts);
    red.mark_ready(0);
    red.finalize();
    const double mean = (size + 1) / 2.0;
    for (size_t i = 0; i < 6; i++)
        for (size_t j = 0; j < 8; j++) {
            const double want = mean * double(i + 1) * (double(j) - 3.5);
            CHECK(std::abs(m[i * 8 + j] - want) <= 1e-5 * 30);
        }
    opts.matrix_approximation_rank = 0;
    EXPECT_ERROR(red.set_powersgd(opts), TC_ERR_INVALID_ARGUMENT, "matrix_approximation_rank");
}

static void test_reducer_views(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    tc::Reducer red(comm, {tc::Buffer(nullptr, 4, tc::DType::Float32), tc::Buffer(nullptr, 2, tc::DType::Float32)},
                    tc::ReducerOptions().gradient_as_bucket_view());
    red.set_builtin_hook(tc::Hook::Fp16Compress);
    float *g0 = red.grad<float>(0), *g1 = red.grad<float>(1);
    CHECK(g0 != nullptr && g1 != nullptr && g0 != g1);
    // Values exact in float16; (r + 1) * 2 / size summed in float16 rounds
    // at most once (relative 2^-11).
    for (int k = 0; k < 4; k++) g0[k] = float(2 * (rank + 1));
    for (int k = 0; k < 2; k++) g1[k] = -1.0f;
    red.mark_ready(1);
    red.mark_ready(0);
    red.finalize();
    std::vector<float> v0(g0, g0 + 4), v1(g1, g1 + 2);
    CHECK(near_all(v0, double(size + 1), 1.0 / 1024) && near_all(v1, -1.0, 1.0 / 1024));
}

static void test_sparse_all_reduce(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    // Shape (size + 1, 2), one sparse and one dense dimension: rank r
    // writes rows r + 1 and r (in that order, r + 1 twice).
    std::vector<int64_t> shape{size + 1, 2}, idx{rank + 1, rank, rank + 1};
    std::vector<float> vals{1, 2, 10, 20, 100, 200};
    tc::SparseView in{shape, 1, idx, vals};
    tc::SparseCoo out = comm.sparse_all_reduce(in, tc::Sum);
    CHECK(out.sparse_dim() == 1 && out.dense_dim() == 1 && out.dtype() == tc::DType::Float32);
    CHECK(out.shape().size() == 2 && out.shape()[0] == size + 1 && out.shape()[1] == 2);
    CHECK(out.nnz() == size_t(size + 1));
    auto v = out.values_as<float>();
    for (int row = 0; row <= size; row++) {
        // Row j: 101 from rank j - 1 (twice-written row), 10 from rank j.
        float expect = (row >= 1 ? 101.0f : 0.0f) + (row < size ? 10.0f : 0.0f);
        CHECK(out.indices()[row] == row && v[2 * row] == expect && v[2 * row + 1] == 2 * expect);
    }
    // Its view is a valid input; async into an existing result.
    tc::SparseCoo twice;
    tc::Work w = comm.sparse_all_reduce(out.view(), tc::Avg, twice, tc::OpOptions().async());
    w.wait();
    CHECK(twice.nnz() == out.nnz());
    for (size_t k = 0; k < v.size(); k++) CHECK(twice.values_as<float>()[k] == v[k]);
    EXPECT_ERROR(out.values_as<double>(), TC_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT_ERROR(comm.sparse_all_reduce(in, tc::Max), TC_ERR_UNSUPPORTED, "");
    tc::SparseView short_values{shape, 1, idx, tc::ConstBuffer(vals.data(), 5)};
    EXPECT_ERROR(comm.sparse_all_reduce(short_values, tc::Sum), TC_ERR_INVALID_ARGUMENT, "'values' has 5");
    tc::SparseCoo moved = std::move(out);
    CHECK(out.nnz() == 0 && moved.nnz() == size_t(size + 1));
}

// Comm queries and settings: ranks, backend version, timeout, hints.
static void test_comm_settings(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size();
    std::vector<int> all(size);
    std::iota(all.begin(), all.end(), 0);
    CHECK(comm.ranks() == all);
    if (rank > 0) { // rank 0 left out: the others keep their root-comm ranks
        std::vector<int> first{0};
        tc::Comm rest = comm.shrink(first, "cpp-rest");
        CHECK(rest.ranks() == std::vector<int>(all.begin() + 1, all.end()));
        rest.finalize();
    }
    CHECK(comm.backend_version().rfind("gloo ", 0) == 0);
    EXPECT_ERROR(comm.set_timeout(std::chrono::milliseconds(0)), TC_ERR_INVALID_ARGUMENT, "timeout");
    comm.set_timeout(std::chrono::seconds(300));
    comm.set_hints({{"timeout_ms", "300000"}, {"abort_on_error", "0"}});
    EXPECT_ERROR(comm.set_hints({{"gloo.iface", "lo"}}), TC_ERR_UNSUPPORTED, "gloo.iface");
    EXPECT_ERROR(comm.set_hints({{"no.such.hint", "1"}}), TC_ERR_INVALID_ARGUMENT, "no.such.hint");
}

// Every rank's reconfigurable comm formed in reverse rank order, then
// shrunk to all but the first rank (which leaves).
static void test_reconfigure(const tc::Store &job, int rank, int size) {
    tc::Comm elastic("gloo", tc::Device::cpu(),
                     tc::CommOptions().name("cpp-elastic").store(job).abort_on_error(false).enable_reconfigure(true));
    EXPECT_ERROR(elastic.rank(), TC_ERR_INVALID_USAGE, "tc_comm_reconfigure");
    tc::Store s = tc::Store::prefix(job, "cpp-elastic-handles");
    s.set(std::to_string(rank), elastic.init_handle());
    std::vector<std::string> reversed;
    for (int r = size - 1; r >= 0; r--) {
        s.wait({std::to_string(r)}, std::chrono::milliseconds(60000));
        reversed.push_back(s.get(std::to_string(r)));
    }
    CHECK(elastic.reconfigure(1, reversed).is_completed());
    CHECK(elastic.rank() == size - 1 - rank && elastic.size() == size);
    int v = rank + 1;
    elastic.all_reduce({&v, 1}, tc::Sum);
    CHECK(v == size * (size + 1) / 2);
    if (rank == 0) {
        elastic.finalize();
        return;
    }
    reversed.pop_back(); // rank 0's handle
    elastic.reconfigure(2, reversed);
    CHECK(elastic.rank() == size - 1 - rank && elastic.size() == size - 1);
    EXPECT_ERROR(elastic.reconfigure(2, reversed), TC_ERR_INVALID_USAGE, "uuid 2");
    elastic.finalize();
}

static void test_gather_single_and_tags(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size(), root = size - 1;
    std::array<int32_t, 2> in{rank * 10, rank * 10 + 1};
    std::vector<int32_t> out(rank == root ? 2 * size : 0, -1);
    comm.gather_single(out, in, root);
    for (int r = 0; rank == root && r < size; r++) CHECK(out[2 * r] == r * 10 && out[2 * r + 1] == r * 10 + 1);
    if (rank == root) {
        std::vector<int32_t> small(2 * size - 1);
        EXPECT_ERROR(comm.gather_single(small, in, root), TC_ERR_INVALID_ARGUMENT, "'output' has");
    }
    // The library: tags are for send and recv only.
    EXPECT_ERROR(comm.barrier(tc::OpOptions().tag(5)), TC_ERR_INVALID_ARGUMENT, "tag");
    if (rank > 1) return;
    // Ranks 0 and 1: tag 7 is sent first and received second.
    const int peer = 1 - rank;
    std::vector<int64_t> a(3, 7), b(5, 3), got_a(3, -1), got_b(5, -1);
    tc::Batch batch = comm.batch();
    if (rank == 0) batch.send(a, peer, 7).send(b, peer, 3);
    else batch.recv(got_b, peer, 3).recv(got_a, peer, 7);
    batch.issue().wait();
    if (rank == 1) CHECK(all_equal<int64_t>(got_a, 7) && all_equal<int64_t>(got_b, 3));
    std::array<int64_t, 1> v{rank + 40};
    if (rank == 0) comm.send(v, peer, tc::OpOptions().tag(9));
    else comm.recv(v, peer, tc::OpOptions().tag(9));
    CHECK(v[0] == 40);
}

static void test_window_get_and_all_gather_p(tc::Comm &comm) {
    const int rank = comm.rank(), size = comm.size(), next = (rank + 1) % size;
    std::vector<int64_t> mine{rank, rank * 100, rank * 1000};
    tc::Window win(comm);
    win.register_buffer(mine);
    comm.barrier();
    std::array<int64_t, 2> got{-1, -1};
    win.get(got, next, sizeof(int64_t)).wait();
    CHECK(got[0] == next * 100 && got[1] == next * 1000);
    win.get(got.data(), sizeof(int64_t), next, 0, tc::OpOptions().async()).wait();
    CHECK(got[0] == next);
    EXPECT_ERROR(win.get(got, next, 2 * sizeof(int64_t)), TC_ERR_INVALID_ARGUMENT, "src_offset");
    comm.barrier();
    win.deregister();

    std::vector<float> out(2 * size, -1.0f);
    tc::AllGatherP ag(comm, out);
    CHECK(ag && ag.count() == 2);
    for (int round = 0; round < 2; round++) {
        std::array<float, 2> in{float(rank + round), float(-rank)};
        ag.exec(in, tc::OpOptions().async()).wait();
        for (int r = 0; r < size; r++) CHECK(out[2 * r] == float(r + round) && out[2 * r + 1] == float(-r));
    }
    std::array<float, 3> wrong{};
    EXPECT_ERROR(ag.exec(wrong), TC_ERR_INVALID_ARGUMENT, "'input' needs 2");
    tc::AllGatherP moved = std::move(ag);
    CHECK(!ag && moved);
}

static void count_call(const tc_op_info_t *info, void *user) {
    if (info->phase == TC_HOOK_POST) ++*static_cast<std::atomic<int> *>(user);
}

static void test_op_hooks(tc::Comm &comm) {
    std::atomic<int> pre{0}, post{0}, raw_post{0};
    std::string last_op;
    uint64_t pre_id = comm.add_pre_hook([&](const tc_op_info_t &info) {
        last_op = info.op_name;
        CHECK(info.phase == TC_HOOK_PRE && info.rank == comm.rank());
        pre++;
    });
    uint64_t post_id = comm.add_post_hook([&](const tc_op_info_t &info) {
        CHECK(info.phase == TC_HOOK_POST && info.status == TC_SUCCESS);
        post++;
    });
    uint64_t raw_id = comm.add_post_hook(&count_call, &raw_post);
    std::vector<float> x(4, 1.0f);
    comm.all_reduce(x, tc::Sum);
    comm.barrier(tc::OpOptions().async()).wait(); // post hooks ran before completion
    CHECK(pre == 2 && post == 2 && raw_post == 2 && last_op == "barrier");
    comm.remove_hook(pre_id);
    comm.remove_hook(post_id);
    comm.remove_hook(raw_id);
    EXPECT_ERROR(comm.remove_hook(raw_id), TC_ERR_NOT_FOUND, "");
    EXPECT_ERROR(comm.add_pre_hook(tc::OpHook()), TC_ERR_INVALID_ARGUMENT, "'hook'");
    comm.all_reduce(x, tc::Sum);
    CHECK(pre == 2 && post == 2 && raw_post == 2);
}

int main() {
    test_errors_without_comm();
    const char *addr = std::getenv("MASTER_ADDR"), *port = std::getenv("MASTER_PORT");
    if (!addr || !port) {
        std::fprintf(stderr, "test_cpp: run under tc-run (MASTER_ADDR/MASTER_PORT unset)\n");
        return 1;
    }
    try {
        tc::Store job = tc::Store::tcp(addr, uint16_t(std::atoi(port)), false);
        int hook_calls = 0;
        tc::Comm comm("gloo", tc::Device::cpu(),
                      tc::CommOptions().name("cpp").store(job).abort_on_error(false).timeout(
                          std::chrono::seconds(300)));
        comm.set_abort_hook([&](tc_result_t, const char *) { hook_calls++; });
        CHECK(comm.backend() == "gloo" && comm.name() == "cpp" && !comm.device().is_cuda());
        CHECK(job.port() == std::atoi(port));
        test_store(job, comm.rank(), comm.size());
        test_collectives(comm);
        test_p2p_and_async(comm);
        test_argument_errors(comm);
        test_split_window_memory(comm);
        test_broadcast_coalesced(comm);
        test_reducer(comm);
        test_reducer_views(comm);
        test_reducer_powersgd(comm);
        test_sparse_all_reduce(comm);
        test_comm_settings(comm);
        test_gather_single_and_tags(comm);
        test_window_get_and_all_gather_p(comm);
        test_op_hooks(comm);
        test_reconfigure(job, comm.rank(), comm.size());
        CHECK(comm.dump_flight_recorder().find("all_reduce") != std::string::npos);
        tc::Comm moved(std::move(comm));
        CHECK(!comm && moved.size() >= 1);
        moved.finalize();
        EXPECT_ERROR(moved.barrier(), TC_ERR_INVALID_USAGE, "");
        CHECK(hook_calls == 0);
    } catch (const tc::Error &e) {
        std::fprintf(stderr, "test_cpp: unexpected tc::Error: %s\n", e.what());
        return 1;
    }
    if (failures) {
        std::fprintf(stderr, "test_cpp (C++%ld): %d check(s) failed\n", __cplusplus / 100 % 100, failures);
        return 1;
    }
    std::printf("test_cpp (C++%ld): all checks passed\n", __cplusplus / 100 % 100);
    return 0;
}
