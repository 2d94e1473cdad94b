/* tc::Local (torchcomm.hpp's device group over tc_local_*): every operation
   on every visible CUDA device (and the CPU where allowed), each output
   element checked; the wrapper's list-length checks and the library's own
   errors thrown as tc::Error naming the argument; moves. Needs a CUDA
   driver: `make sim-gpu-test` runs it on the simulated one with
   TC_SIM_DEVICES=3 (tests/sim_gpu/run-sim.sh). Prints "N passed, M failed". */
#include <torchcomm.hpp>

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static int passed, failed;
#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (cond) {                                                                    \
            passed++;                                                                  \
        } else {                                                                       \
            failed++;                                                                  \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                              \
    } while (0)
#define CU(call)                                                                              \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, (int)r_); \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

static int nd;
static std::vector<CUcontext> ctx;

/* Runs f with device d's context current. */
template <class F> static void on(int d, F &&f) {
    CU(cuCtxPushCurrent(ctx[d]));
    f();
    CUcontext c;
    CU(cuCtxPopCurrent(&c));
}
static void sync_all() {
    for (int d = 0; d < nd; d++) on(d, [] { CU(cuCtxSynchronize()); });
}

/* count elements of T on device d, holding `values`. */
template <class T> static void *dev_buf(int d, const std::vector<T> &values) {
    CUdeviceptr p = 0;
    on(d, [&] {
        CU(cuMemAlloc(&p, values.size() * sizeof(T) + 1));
        if (!values.empty()) CU(cuMemcpyHtoD(p, values.data(), values.size() * sizeof(T)));
        CU(cuCtxSynchronize());
    });
    return reinterpret_cast<void *>(static_cast<uintptr_t>(p));
}
template <class T> static void *dev_zeros(int d, size_t n) { return dev_buf(d, std::vector<T>(n, T(0))); }
template <class T> static std::vector<T> read(int d, const void *p, size_t n) {
    std::vector<T> h(n);
    if (n) on(d, [&] { CU(cuMemcpyDtoH(h.data(), static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)), n * sizeof(T))); });
    return h;
}
static void dev_free(int d, void *p) {
    on(d, [&] { CU(cuMemFree(static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)))); });
}
template <class T> static std::vector<T> iota(size_t n, T start) {
    std::vector<T> v(n);
    for (size_t i = 0; i < n; i++) v[i] = static_cast<T>(start + static_cast<T>(i % 97));
    return v;
}
static std::vector<tc::Device> all_devices() {
    std::vector<tc::Device> d;
    for (int i = 0; i < nd; i++) d.push_back(tc::Device::cuda(i));
    return d;
}

/* Runs f, which must throw tc::Error with `code` and `needle` in what(). */
template <class F> static bool throws(F &&f, tc_result_t code, const char *needle) {
    try {
        f();
    } catch (const tc::Error &e) {
        bool ok = e.code() == code && std::strstr(e.what(), needle) != nullptr;
        if (!ok) std::fprintf(stderr, "unexpected tc::Error %d: %s (expected %d with '%s')\n", e.code(), e.what(), code, needle);
        return ok;
    }
    std::fprintf(stderr, "no tc::Error thrown (expected '%s')\n", needle);
    return false;
}

static void test_broadcast(bool nccl) {
    tc::Local g(all_devices(), tc::LocalOptions().use_nccl(nccl));
    CHECK(g && g.size() == static_cast<size_t>(nd));
    const size_t n = 1000;
    for (int root = 0; root < nd; root++) {
        std::vector<float> want = iota<float>(n, static_cast<float>(root + 1));
        void *src = dev_buf(root, want);
        std::vector<void *> dsts(nd);
        for (int d = 0; d < nd; d++) dsts[d] = d == root ? src : dev_zeros<float>(d, n);
        g.broadcast({src, n, tc::DType::Float32}, root, dsts);
        sync_all();
        for (int d = 0; d < nd; d++) CHECK(read<float>(d, dsts[d], n) == want);
        for (int d = 0; d < nd; d++) dev_free(d, dsts[d]);
    }
}

/* Host members too (copies path), with one stream per member. */
static void test_broadcast_with_cpu_and_streams() {
    std::vector<tc::Device> devs = all_devices();
    devs.push_back(tc::Device::cpu());
    tc::Local g(devs);
    std::vector<void *> streams(devs.size(), nullptr);
    for (int d = 0; d < nd; d++) on(d, [&] { CU(cuStreamCreate(reinterpret_cast<CUstream *>(&streams[d]), CU_STREAM_NON_BLOCKING)); });
    std::vector<int64_t> want = iota<int64_t>(333, 5), host(333, 0);
    void *src = dev_buf(0, want);
    std::vector<void *> dsts{src};
    for (int d = 1; d < nd; d++) dsts.push_back(dev_zeros<int64_t>(d, 333));
    dsts.push_back(host.data());
    g.broadcast({src, 333, tc::DType::Int64}, 0, dsts, streams);
    CHECK(host == want); // a host destination is there when the call returns
    for (int d = 0; d < nd; d++) on(d, [&] { CU(cuStreamSynchronize(static_cast<CUstream>(streams[d]))); });
    for (int d = 0; d < nd; d++) CHECK(read<int64_t>(d, dsts[d], 333) == want);
    for (int d = 0; d < nd; d++) dev_free(d, dsts[d]);
    for (int d = 0; d < nd; d++) on(d, [&] { CU(cuStreamDestroy(static_cast<CUstream>(streams[d]))); });
}

static void test_broadcast_coalesced() {
    tc::Local g(all_devices(), tc::LocalOptions().bucket_bytes(256));
    std::vector<float> a = iota<float>(100, 1.0f);
    std::vector<int32_t> b = iota<int32_t>(70, 3);
    std::vector<double> c = iota<double>(9, 0.5);
    std::vector<tc::ConstBuffer> srcs{{dev_buf(0, a), a.size(), tc::DType::Float32},
                                      {dev_buf(0, b), b.size(), tc::DType::Int32},
                                      {dev_buf(0, c), c.size(), tc::DType::Float64}};
    std::vector<void *> dsts; // one row per member
    for (int d = 0; d < nd; d++) {
        for (const tc::ConstBuffer &s : srcs)
            dsts.push_back(d == 0 ? const_cast<void *>(s.data()) : dev_zeros<char>(d, s.count() * tc::dtype_size(s.dtype())));
    }
    g.broadcast_coalesced(srcs, dsts, 128); // smaller than one buffer: several buckets
    sync_all();
    for (int d = 0; d < nd; d++) {
        CHECK(read<float>(d, dsts[d * 3], a.size()) == a);
        CHECK(read<int32_t>(d, dsts[d * 3 + 1], b.size()) == b);
        CHECK(read<double>(d, dsts[d * 3 + 2], c.size()) == c);
    }
    for (int d = 0; d < nd; d++)
        for (int t = 0; t < 3; t++) dev_free(d, dsts[d * 3 + t]);
}

static void test_scatter_gather() {
    tc::Local g(all_devices());
    const size_t count = 3 * static_cast<size_t>(nd) + 1; // torch.chunk: ceil(count / nd) each, the last shorter
    std::vector<float> host = iota<float>(count, 2.0f);
    size_t chunk = (count + nd - 1) / nd;
    std::vector<size_t> sizes(nd);
    std::vector<void *> dsts(nd);
    for (int d = 0, off = 0; d < nd; d++) {
        sizes[d] = std::min(chunk, count - std::min(count, static_cast<size_t>(off)));
        off += static_cast<int>(sizes[d]);
        dsts[d] = dev_zeros<float>(d, chunk);
    }
    g.scatter(host, tc::Device::cpu(), dsts);
    sync_all();
    for (int d = 0, off = 0; d < nd; d++) {
        std::vector<float> want(host.begin() + off, host.begin() + off + static_cast<long>(sizes[d]));
        CHECK(read<float>(d, dsts[d], sizes[d]) == want);
        off += static_cast<int>(sizes[d]);
    }
    /* gather back to the CPU (destination=-1) and to device 0 */
    std::vector<float> back(count, 0.0f);
    std::vector<const void *> srcs(dsts.begin(), dsts.end());
    g.gather(srcs, sizes, tc::DType::Float32, back.data(), tc::Device::cpu());
    CHECK(back == host);
    void *on0 = dev_zeros<float>(0, count);
    g.gather(srcs, sizes, tc::DType::Float32, on0, tc::Device::cuda(0));
    sync_all();
    CHECK(read<float>(0, on0, count) == host);
    dev_free(0, on0);
    /* explicit chunk counts: everything to the last member */
    std::vector<size_t> chunks(nd, 0);
    chunks[nd - 1] = count;
    void *all_last = dev_zeros<float>(nd - 1, count);
    std::vector<void *> dsts2(nd, nullptr);
    dsts2[nd - 1] = all_last;
    void *src_dev = dev_buf(0, host);
    g.scatter({src_dev, count, tc::DType::Float32}, tc::Device::cuda(0), dsts2, chunks);
    sync_all();
    CHECK(read<float>(nd - 1, all_last, count) == host);
    dev_free(nd - 1, all_last);
    dev_free(0, src_dev);
    for (int d = 0; d < nd; d++) dev_free(d, dsts[d]);
}

static void test_reduce_add(bool nccl) {
    tc::Local g(all_devices(), tc::LocalOptions().use_nccl(nccl));
    const size_t n = 513;
    std::vector<int32_t> want(n, 0);
    std::vector<const void *> srcs;
    for (int d = 0; d < nd; d++) {
        std::vector<int32_t> v = iota<int32_t>(n, d * 10);
        for (size_t i = 0; i < n; i++) want[i] += v[i];
        srcs.push_back(dev_buf(d, v));
    }
    const size_t root = static_cast<size_t>(nd - 1);
    void *dst = dev_zeros<int32_t>(static_cast<int>(root), n);
    g.reduce_add(srcs, n, tc::DType::Int32, dst, root);
    sync_all();
    CHECK(read<int32_t>(static_cast<int>(root), dst, n) == want);
    dev_free(static_cast<int>(root), dst);
    for (int d = 0; d < nd; d++) dev_free(d, const_cast<void *>(srcs[d]));
}

static void test_reduce_add_coalesced() {
    tc::Local g(all_devices());
    std::vector<float> sum_a(40, 0.0f);
    std::vector<int64_t> sum_b(25, 0);
    std::vector<const void *> srcs; // one row per member
    for (int d = 0; d < nd; d++) {
        std::vector<float> a = iota<float>(40, static_cast<float>(d));
        std::vector<int64_t> b = iota<int64_t>(25, 100 * d);
        for (size_t i = 0; i < a.size(); i++) sum_a[i] += a[i];
        for (size_t i = 0; i < b.size(); i++) sum_b[i] += b[i];
        srcs.push_back(dev_buf(d, a));
        srcs.push_back(dev_buf(d, b));
    }
    std::vector<tc::Buffer> dsts{{dev_zeros<float>(0, 40), 40, tc::DType::Float32},
                                 {dev_zeros<int64_t>(0, 25), 25, tc::DType::Int64}};
    g.reduce_add_coalesced(srcs, dsts, 0, 64);
    sync_all();
    CHECK(read<float>(0, dsts[0].data(), 40) == sum_a);
    CHECK(read<int64_t>(0, dsts[1].data(), 25) == sum_b);
    for (const tc::Buffer &b : dsts) dev_free(0, b.data());
    for (int d = 0; d < nd; d++) dev_free(d, const_cast<void *>(srcs[2 * d])), dev_free(d, const_cast<void *>(srcs[2 * d + 1]));
}

static void test_errors() {
    tc::Local g(all_devices());
    std::vector<float> h(4, 1.0f);
    std::vector<void *> short_list(nd - 1 > 0 ? nd - 1 : 0, h.data());
    std::vector<void *> full(nd, nullptr);
    /* lists of the wrong length never reach the library */
    CHECK(throws([&] { g.broadcast(h, 0, short_list); }, TC_ERR_INVALID_ARGUMENT, "'dsts'"));
    CHECK(throws([&] { g.broadcast(h, 0, full, short_list); }, TC_ERR_INVALID_ARGUMENT, "'streams'"));
    CHECK(throws([&] { g.broadcast_coalesced({h, h}, full); }, TC_ERR_INVALID_ARGUMENT, "'dsts'"));
    std::vector<size_t> two(2 * static_cast<size_t>(nd), 1);
    CHECK(throws([&] { g.scatter(h, tc::Device::cpu(), full, two); }, TC_ERR_INVALID_ARGUMENT, "'chunk_counts'"));
    std::vector<const void *> srcs(nd + 1, nullptr);
    CHECK(throws([&] { g.reduce_add(srcs, 0, tc::DType::Float32, nullptr, 0); }, TC_ERR_INVALID_ARGUMENT, "'srcs'"));
    std::vector<size_t> counts(nd, 0);
    CHECK(throws([&] { g.gather(srcs, counts, tc::DType::Float32, nullptr, tc::Device::cpu()); }, TC_ERR_INVALID_ARGUMENT, "'srcs'"));
    /* the library's own checks, as tc::Error */
    std::vector<void *> dsts(nd);
    for (int d = 0; d < nd; d++) dsts[d] = dev_zeros<float>(d, 4);
    CHECK(throws([&] { g.broadcast({dsts[0], 4, tc::DType::Float32}, static_cast<size_t>(nd), dsts); },
                 TC_ERR_INVALID_ARGUMENT, "src_index"));
    /* a host buffer where member 0's device memory is required */
    CHECK(throws([&] { g.broadcast(h, 0, dsts); }, TC_ERR_INVALID_ARGUMENT, "src"));
    for (int d = 0; d < nd; d++) dev_free(d, dsts[d]);
    CHECK(throws([] { tc::Local empty(std::vector<tc::Device>{}); }, TC_ERR_NULL_ARGUMENT, "devices"));
    CHECK(throws([] { tc::Local bad({tc::Device::cuda(-1)}); }, TC_ERR_INVALID_ARGUMENT, "devices[0]"));
}

static void test_moves() {
    tc::Local a(all_devices());
    tc_local_t *raw = a.get();
    tc::Local b(std::move(a));
    CHECK(!a && a.size() == 0 && b.get() == raw && b.size() == static_cast<size_t>(nd));
    tc::Local c;
    c = std::move(b);
    CHECK(!b && c.get() == raw);
    c = tc::Local({tc::Device::cuda(0)}); // the old group is freed, the new one works
    std::vector<float> v = iota<float>(8, 1.0f);
    void *p = dev_buf(0, v);
    std::vector<void *> dsts{p};
    c.broadcast({p, 8, tc::DType::Float32}, 0, dsts);
    sync_all();
    CHECK(c.size() == 1 && read<float>(0, p, 8) == v);
    dev_free(0, p);
}

int main() {
    CU(cuInit(0));
    CU(cuDeviceGetCount(&nd));
    ctx.resize(nd);
    for (int d = 0; d < nd; d++) {
        CUdevice dev;
        CU(cuDeviceGet(&dev, d));
        CU(cuDevicePrimaryCtxRetain(&ctx[d], dev));
    }
    CU(cuCtxSetCurrent(ctx[0]));
    std::printf("test_cpp_local: %d device(s)\n", nd);
    try {
        test_broadcast(true);
        test_broadcast(false);
        test_broadcast_with_cpu_and_streams();
        test_broadcast_coalesced();
        test_scatter_gather();
        test_reduce_add(true);
        test_reduce_add(false);
        test_reduce_add_coalesced();
        test_errors();
        test_moves();
    } catch (const tc::Error &e) {
        std::fprintf(stderr, "unexpected tc::Error: %s\n", e.what());
        failed++;
    }
    for (int d = 0; d < nd; d++) {
        CUdevice dev;
        CU(cuDeviceGet(&dev, d));
        CU(cuDevicePrimaryCtxRelease(dev));
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
