/*
 * torchcomm_base.hpp: the foundation of torchcomm.hpp (errors, dtypes,
 * buffers, option builders, tc::Work, tc::Store, sparse tensors). Include
 * torchcomm.hpp, not this file.
 */
#ifndef TORCHCOMM_BASE_HPP
#define TORCHCOMM_BASE_HPP

#include <torchcomm.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tc {

/* ---------------------------------------------------------------- errors */

/* A failed call: code() is the C result code, detail() the thread's
   tc_last_error() text at the time of the failure. */
class Error : public std::exception {
  public:
    Error(tc_result_t code, std::string detail, const char *call = "")
        : code_(code), detail_(std::move(detail)) {
        // The library's detail usually starts with the call's name already.
        bool named = !*call || detail_.rfind(call, 0) == 0;
        what_ = (named ? std::string() : std::string(call) + ": ") + tc_result_string(code) +
                (detail_.empty() ? "" : ": " + detail_);
    }
    tc_result_t code() const noexcept { return code_; }
    const std::string &detail() const noexcept { return detail_; }
    const char *what() const noexcept override { return what_.c_str(); }

  private:
    tc_result_t code_;
    std::string detail_;
    std::string what_;
};

namespace detail {
inline void check(tc_result_t rc, const char *call) {
    if (rc != TC_SUCCESS) throw Error(rc, tc_last_error(), call);
}
[[noreturn]] inline void invalid(const std::string &detail, const char *call) {
    throw Error(TC_ERR_INVALID_ARGUMENT, detail, call);
}
struct FreeDeleter {
    void operator()(void *p) const noexcept { tc_free(p); }
};
inline std::string take_string(void *p, size_t len) {
    std::unique_ptr<void, FreeDeleter> owned(p);
    return std::string(static_cast<const char *>(p), len);
}

/* Owner of one C handle; Free is its C destroy function (NULL-safe). */
template <class T, void (*Free)(T *)> class Handle {
  public:
    Handle() noexcept = default;
    explicit Handle(T *p) noexcept : p_(p) {}
    Handle(Handle &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
    Handle &operator=(Handle &&o) noexcept {
        if (this != &o) reset(std::exchange(o.p_, nullptr));
        return *this;
    }
    Handle(const Handle &) = delete;
    Handle &operator=(const Handle &) = delete;
    ~Handle() { reset(); }
    T *get() const noexcept { return p_; }
    T *release() noexcept { return std::exchange(p_, nullptr); }
    void reset(T *p = nullptr) noexcept { Free(std::exchange(p_, p)); }

  private:
    T *p_ = nullptr;
};
} // namespace detail

inline const char *result_string(tc_result_t code) noexcept { return tc_result_string(code); }

struct Version {
    int major, minor, patch;
};
/* The loaded library's version (may differ from the header's TC_VERSION_*). */
inline Version version() {
    Version v{};
    detail::check(tc_get_version(&v.major, &v.minor, &v.patch), "tc_get_version");
    return v;
}

/* Sends log lines to `callback` (NULL: stderr again); see tc_set_log_callback. */
inline void set_log_callback(tc_log_callback_t callback, void *user_data = nullptr) {
    detail::check(tc_set_log_callback(callback, user_data), "tc_set_log_callback");
}

/* ----------------------------------------------------------- dtypes, ops */

enum class DType : tc_dtype_t {
    Float32 = TC_FLOAT32,
    Float64 = TC_FLOAT64,
    Float16 = TC_FLOAT16,
    BFloat16 = TC_BFLOAT16,
    Int8 = TC_INT8,
    UInt8 = TC_UINT8,
    Int32 = TC_INT32,
    Int64 = TC_INT64,
    Bool = TC_BOOL,
    UInt32 = TC_UINT32,
    UInt64 = TC_UINT64,
    Float8E4M3 = TC_FLOAT8_E4M3,
    Float8E5M2 = TC_FLOAT8_E5M2,
};

inline size_t dtype_size(DType dt) {
    size_t n = 0;
    detail::check(tc_dtype_size(static_cast<tc_dtype_t>(dt), &n), "tc_dtype_size");
    return n;
}

/* The dtype of element type T. Specialize it for your own 16-bit or 8-bit
   float types: template <> struct tc::dtype_of<half> { static constexpr
   tc::DType value = tc::DType::Float16; }; */
template <class T, class = void> struct dtype_of {};
template <> struct dtype_of<float> {
    static constexpr DType value = DType::Float32;
};
template <> struct dtype_of<double> {
    static constexpr DType value = DType::Float64;
};
template <> struct dtype_of<bool> {
    static_assert(sizeof(bool) == 1, "TC_BOOL is one byte per element");
    static constexpr DType value = DType::Bool;
};
template <class T>
struct dtype_of<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                    (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8)>> {
    static constexpr DType value =
        sizeof(T) == 1   ? (std::is_signed_v<T> ? DType::Int8 : DType::UInt8)
        : sizeof(T) == 4 ? (std::is_signed_v<T> ? DType::Int32 : DType::UInt32)
                         : (std::is_signed_v<T> ? DType::Int64 : DType::UInt64);
};
/* The dtype of T, const and volatile ignored. */
template <class T> inline constexpr DType dtype_v = dtype_of<std::remove_cv_t<T>>::value;

template <class T, class = void> struct has_dtype : std::false_type {};
template <class T>
struct has_dtype<T, std::void_t<decltype(dtype_of<std::remove_cv_t<T>>::value)>> : std::true_type {};

/* A reduction: tc::Sum, ..., or tc::premul_sum(factor). */
struct ReduceOp {
    tc_reduce_op_t c;
    constexpr explicit ReduceOp(tc_red_kind_t kind, double factor = 1.0,
                                const void *factor_ptr = nullptr)
        : c{kind, factor, factor_ptr} {}
};
inline constexpr ReduceOp Sum{TC_SUM};
inline constexpr ReduceOp Product{TC_PRODUCT};
inline constexpr ReduceOp Min{TC_MIN};
inline constexpr ReduceOp Max{TC_MAX};
inline constexpr ReduceOp BitAnd{TC_BAND};
inline constexpr ReduceOp BitOr{TC_BOR};
inline constexpr ReduceOp BitXor{TC_BXOR};
inline constexpr ReduceOp Avg{TC_AVG};
/* Multiplies each input by `factor`, then sums. */
inline constexpr ReduceOp premul_sum(double factor) { return ReduceOp(TC_PREMUL_SUM, factor); }
/* The factor as one element of the operation's dtype (device memory for
   CUDA buffers); it must stay valid until the operation completes. */
inline constexpr ReduceOp premul_sum(const void *factor) {
    return ReduceOp(TC_PREMUL_SUM, 1.0, factor);
}

struct Device {
    tc_device_t c;
    static constexpr Device cpu() { return Device{{TC_DEVICE_CPU, 0}}; }
    /* index -1: local rank % number of visible devices. */
    static constexpr Device cuda(int32_t index = -1) { return Device{{TC_DEVICE_CUDA, index}}; }
    bool is_cuda() const noexcept { return c.type == TC_DEVICE_CUDA; }
    int32_t index() const noexcept { return c.index; }
};

/* --------------------------------------------------------------- buffers */

/* A non-owning view of `size` elements at `data` (std::span for C++17). */
template <class T> class Span {
  public:
    constexpr Span() noexcept = default;
    constexpr Span(T *data, size_t size) noexcept : data_(data), size_(size) {}
    template <class R, class = std::enable_if_t<std::is_convertible_v<
                           decltype(std::data(std::declval<R &>())), T *>>>
    constexpr Span(R &&r) noexcept(noexcept(std::data(r))) : data_(std::data(r)), size_(std::size(r)) {}
    /* A braced list, for arguments: comm.split({0, 1}, "pair"). */
    template <class U = T, class = std::enable_if_t<std::is_const_v<U>>>
    constexpr Span(std::initializer_list<std::remove_const_t<U>> l) noexcept
        : data_(l.begin()), size_(l.size()) {}
    constexpr T *data() const noexcept { return data_; }
    constexpr size_t size() const noexcept { return size_; }
    constexpr T *begin() const noexcept { return data_; }
    constexpr T *end() const noexcept { return data_ + size_; }
    constexpr T &operator[](size_t i) const noexcept { return data_[i]; }

  private:
    T *data_ = nullptr;
    size_t size_ = 0;
};

namespace detail {
template <class R> using element_t = std::remove_pointer_t<decltype(std::data(std::declval<R &>()))>;
template <class R, class = void> struct is_typed_range : std::false_type {};
template <class R>
struct is_typed_range<R, std::void_t<decltype(std::size(std::declval<R &>())), element_t<R>>>
    : has_dtype<element_t<R>> {};

template <bool Mutable> class BufferOf {
  public:
    using pointer = std::conditional_t<Mutable, void *, const void *>;
    /* Untyped memory: `count` elements of `dtype` at `data`. */
    BufferOf(pointer data, size_t count, DType dtype) noexcept
        : data_(data), count_(count), dtype_(dtype) {}
    /* `count` elements at a typed pointer. */
    template <class T, class = std::enable_if_t<has_dtype<T>::value &&
                                                (!Mutable || !std::is_const_v<T>)>>
    BufferOf(T *data, size_t count) noexcept : BufferOf(data, count, dtype_v<T>) {}
    /* A contiguous container or view of a dtype-mapped element type. */
    template <class R,
              class = std::enable_if_t<is_typed_range<R>::value &&
                                       (!Mutable || !std::is_const_v<element_t<R>>)>>
    BufferOf(R &&r) noexcept : BufferOf(std::data(r), std::size(r)) {}
    /* A mutable buffer is also a valid input. */
    template <bool M = Mutable, class = std::enable_if_t<!M>>
    BufferOf(const BufferOf<true> &b) noexcept : BufferOf(b.data(), b.count(), b.dtype()) {}
    pointer data() const noexcept { return data_; }
    size_t count() const noexcept { return count_; }
    DType dtype() const noexcept { return dtype_; }
    tc_dtype_t c_dtype() const noexcept { return static_cast<tc_dtype_t>(dtype_); }

  private:
    pointer data_;
    size_t count_;
    DType dtype_;
};
} // namespace detail

/* Memory written by an operation / memory only read by it. */
using Buffer = detail::BufferOf<true>;
using ConstBuffer = detail::BufferOf<false>;

/* --------------------------------------------------------------- options */

namespace detail {
using Hints = std::vector<std::pair<std::string, std::string>>;
/* The C view of a Hints list; keeps the pointer array alive for one call. */
struct HintArray {
    explicit HintArray(const Hints &h) {
        for (const auto &kv : h) items.push_back({kv.first.c_str(), kv.second.c_str()});
    }
    const tc_hint_t *data() const noexcept { return items.empty() ? nullptr : items.data(); }
    size_t size() const noexcept { return items.size(); }
    std::vector<tc_hint_t> items;
};
inline int64_t to_ms(std::chrono::milliseconds t) { return static_cast<int64_t>(t.count()); }
} // namespace detail

/* Options of one operation (tc_op_options_t), as a builder. */
class OpOptions {
  public:
    OpOptions() noexcept : c_(TC_OP_OPTIONS_INIT) {}
    /* true: the call returns at once; wait on its tc::Work. */
    OpOptions &async(bool on = true) noexcept { return c_.async_op = on ? 1 : 0, *this; }
    OpOptions &timeout(std::chrono::milliseconds t) noexcept {
        return c_.timeout_ms = detail::to_ms(t), *this;
    }
    /* cudaStream_t / CUstream for CUDA buffers. */
    OpOptions &stream(void *s) noexcept { return c_.stream = s, *this; }
    /* Point to point (send, recv): pairs with the peer's call of the same
       tag; 0, the default, is every untagged call's (tc_op_options_t.tag). */
    OpOptions &tag(uint32_t t) noexcept { return c_.tag = t, *this; }
    OpOptions &hint(std::string key, std::string value) {
        return hints_.emplace_back(std::move(key), std::move(value)), *this;
    }
    /* Calls f(const tc_op_options_t *) with the C struct. */
    template <class F> decltype(auto) with_c(F &&f) const {
        detail::HintArray h(hints_);
        tc_op_options_t c = c_;
        c.hints = h.data();
        c.num_hints = h.size();
        return f(&c);
    }

  private:
    tc_op_options_t c_;
    detail::Hints hints_;
};

class Store;

/* Options of Comm creation and Comm::split (tc_comm_options_t). */
class CommOptions {
  public:
    CommOptions() noexcept : c_(TC_COMM_OPTIONS_INIT) {}
    CommOptions &name(std::string n) { return name_ = std::move(n), *this; }
    CommOptions &timeout(std::chrono::milliseconds t) noexcept {
        return c_.timeout_ms = detail::to_ms(t), *this;
    }
    CommOptions &abort_on_error(bool on) noexcept { return c_.abort_on_error = on ? 1 : 0, *this; }
    CommOptions &rank(int32_t r) noexcept { return c_.rank = r, *this; }
    CommOptions &world_size(int32_t n) noexcept { return c_.world_size = n, *this; }
    /* A comm with no members until Comm::reconfigure (tc_comm_new only). */
    CommOptions &enable_reconfigure(bool on) noexcept { return c_.enable_reconfigure = on ? 1 : 0, *this; }
    /* Borrowed until the comm is created (the comm keeps its own reference). */
    inline CommOptions &store(const Store &s) noexcept;
    CommOptions &hint(std::string key, std::string value) {
        return hints_.emplace_back(std::move(key), std::move(value)), *this;
    }
    template <class F> decltype(auto) with_c(F &&f) const {
        detail::HintArray h(hints_);
        tc_comm_options_t c = c_;
        c.name = name_ ? name_->c_str() : nullptr;
        c.hints = h.data();
        c.num_hints = h.size();
        return f(&c);
    }

  private:
    tc_comm_options_t c_;
    std::optional<std::string> name_;
    detail::Hints hints_;
};

/* ------------------------------------------------------------------ work */

enum class WorkStatus : int32_t {
    NotStarted = TC_WORK_NOT_STARTED,
    InProgress = TC_WORK_IN_PROGRESS,
    Completed = TC_WORK_COMPLETED,
    TimedOut = TC_WORK_TIMED_OUT,
    Failed = TC_WORK_ERROR,
};

/* The completion handle of one operation (tc_work_t). */
class Work {
  public:
    Work() noexcept = default;
    explicit Work(tc_work_t *w) noexcept : h_(w) {}
    explicit operator bool() const noexcept { return h_.get() != nullptr; }
    tc_work_t *get() const noexcept { return h_.get(); }
    tc_work_t *release() noexcept { return h_.release(); }

    bool is_completed() const {
        int done = 0;
        detail::check(tc_work_is_completed(h_.get(), &done), "tc_work_is_completed");
        return done != 0;
    }
    WorkStatus status() const {
        int32_t s = 0;
        detail::check(tc_work_status(h_.get(), &s), "tc_work_status");
        return static_cast<WorkStatus>(s);
    }
    /* Host work: returns when finished. CUDA work: `stream` waits for it. */
    void wait(void *stream = nullptr) const { detail::check(tc_work_wait(h_.get(), stream), "tc_work_wait"); }
    void wait_blocking() const { detail::check(tc_work_wait_blocking(h_.get()), "tc_work_wait_blocking"); }

  private:
    detail::Handle<tc_work_t, tc_work_free> h_;
};

/* ----------------------------------------------------------------- store */

/* A key-value store speaking torch's TCPStore protocol, a file store, or a
   prefix view (tc_store_t). Values are bytes, held in std::string. */
class Store {
  public:
    Store() noexcept = default;
    explicit Store(tc_store_t *s) noexcept : h_(s) {}
    explicit operator bool() const noexcept { return h_.get() != nullptr; }
    tc_store_t *get() const noexcept { return h_.get(); }

    /* is_server: host a server on `port` (0: any) and connect to it.
       world_size -1: do not wait for workers. timeout 0: the default. */
    static Store tcp(const std::string &host, uint16_t port, bool is_server, int32_t world_size = -1,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
        tc_store_t *s = nullptr;
        detail::check(tc_store_tcp_new(host.c_str(), port, is_server ? 1 : 0, world_size,
                                       detail::to_ms(timeout), &s),
                      "tc_store_tcp_new");
        return Store(s);
    }
    static Store file(const std::string &path, int32_t world_size = -1) {
        tc_store_t *s = nullptr;
        detail::check(tc_store_file_new(path.c_str(), world_size, &s), "tc_store_file_new");
        return Store(s);
    }
    /* A view in which key k is prefix/k; it keeps `base` alive. */
    static Store prefix(const Store &base, const std::string &prefix) {
        tc_store_t *s = nullptr;
        detail::check(tc_store_prefix_new(base.get(), prefix.c_str(), &s), "tc_store_prefix_new");
        return Store(s);
    }

    uint16_t port() const {
        uint16_t p = 0;
        detail::check(tc_store_tcp_port(h_.get(), &p), "tc_store_tcp_port");
        return p;
    }
    void set(const std::string &key, std::string_view value) const {
        detail::check(tc_store_set(h_.get(), key.c_str(), value.data(), value.size()), "tc_store_set");
    }
    /* Waits (up to the store's timeout) for the key. */
    std::string get(const std::string &key) const {
        void *v = nullptr;
        size_t n = 0;
        detail::check(tc_store_get_alloc(h_.get(), key.c_str(), &v, &n), "tc_store_get_alloc");
        return detail::take_string(v, n);
    }
    /* Copies the value into buf; returns its size (throws
       TC_ERR_BUFFER_TOO_SMALL, copying nothing, when it does not fit). */
    size_t get_into(const std::string &key, void *buf, size_t buf_len) const {
        size_t n = 0;
        detail::check(tc_store_get(h_.get(), key.c_str(), buf, buf_len, &n), "tc_store_get");
        return n;
    }
    int64_t add(const std::string &key, int64_t delta) const {
        int64_t v = 0;
        detail::check(tc_store_add(h_.get(), key.c_str(), delta, &v), "tc_store_add");
        return v;
    }
    /* torch's compare_set; returns the value now current (see the C doc). */
    std::string compare_set(const std::string &key, std::string_view expected,
                            std::string_view desired) const {
        void *v = nullptr;
        size_t n = 0;
        detail::check(tc_store_compare_set(h_.get(), key.c_str(), expected.data(), expected.size(),
                                           desired.data(), desired.size(), &v, &n),
                      "tc_store_compare_set");
        return detail::take_string(v, n);
    }
    bool check(const std::vector<std::string> &keys) const {
        auto k = c_keys(keys);
        int ready = 0;
        detail::check(tc_store_check(h_.get(), k.data(), k.size(), &ready), "tc_store_check");
        return ready != 0;
    }
    /* timeout 0: the store's timeout; throws TC_ERR_TIMEOUT on expiry. */
    void wait(const std::vector<std::string> &keys,
              std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
        auto k = c_keys(keys);
        detail::check(tc_store_wait(h_.get(), k.data(), k.size(), detail::to_ms(timeout)), "tc_store_wait");
    }
    /* Returns whether the key existed. */
    bool delete_key(const std::string &key) const {
        int deleted = 0;
        detail::check(tc_store_delete(h_.get(), key.c_str(), &deleted), "tc_store_delete");
        return deleted != 0;
    }
    int64_t num_keys() const {
        int64_t n = 0;
        detail::check(tc_store_num_keys(h_.get(), &n), "tc_store_num_keys");
        return n;
    }

  private:
    static std::vector<const char *> c_keys(const std::vector<std::string> &keys) {
        std::vector<const char *> k;
        for (const auto &s : keys) k.push_back(s.c_str());
        return k;
    }
    detail::Handle<tc_store_t, tc_store_free> h_;
};

inline CommOptions &CommOptions::store(const Store &s) noexcept { return c_.store = s.get(), *this; }

/* ---------------------------------------------------- sparse, reducer */

/* A sparse COO tensor as input (tc_sparse_coo_t, torch's layout): `shape`
   has sparse_dim + dense sizes; `indices` holds sparse_dim rows of nnz
   indices; `values` holds nnz rows of prod(dense sizes) elements. */
struct SparseView {
    Span<const int64_t> shape;
    size_t sparse_dim = 0;
    Span<const int64_t> indices;
    ConstBuffer values{nullptr, 0, DType::Float32};

    size_t nnz() const { return sparse_dim ? indices.size() / sparse_dim : 0; }
    /* The C struct; throws TC_ERR_INVALID_ARGUMENT when the sizes disagree. */
    tc_sparse_coo_t c() const {
        const char *call = "tc_sparse_all_reduce";
        if (sparse_dim == 0 || sparse_dim > shape.size())
            detail::invalid("'sparse_dim' must be in 1..shape.size()", call);
        if (indices.size() % sparse_dim != 0)
            detail::invalid("'indices' is not sparse_dim rows of nnz indices", call);
        size_t row = 1;
        for (size_t d = sparse_dim; d < shape.size(); d++) row *= size_t(shape[d]);
        if (values.count() != nnz() * row)
            detail::invalid("'values' has " + std::to_string(values.count()) + " elements, expected nnz * " +
                                std::to_string(row) + " = " + std::to_string(nnz() * row),
                            call);
        return tc_sparse_coo_t{sparse_dim,     shape.size() - sparse_dim, shape.data(), nnz(),
                               indices.data(), values.data(),             values.c_dtype()};
    }
};

/* A sparse COO tensor allocated by the library (the result of
   Comm::sparse_all_reduce); its arrays are freed with tc_free. */
class SparseCoo {
  public:
    SparseCoo() : c_(new tc_sparse_coo_t{}) {}
    SparseCoo(SparseCoo &&) noexcept = default;
    SparseCoo &operator=(SparseCoo &&o) noexcept {
        if (this != &o) reset(), c_ = std::move(o.c_);
        return *this;
    }
    ~SparseCoo() { reset(); }

    size_t sparse_dim() const noexcept { return c_ ? c_->sparse_dim : 0; }
    size_t dense_dim() const noexcept { return c_ ? c_->dense_dim : 0; }
    size_t nnz() const noexcept { return c_ ? c_->nnz : 0; }
    DType dtype() const noexcept { return static_cast<DType>(c_ ? c_->dtype : TC_FLOAT32); }
    Span<const int64_t> shape() const noexcept { return {c_ ? c_->shape : nullptr, sparse_dim() + dense_dim()}; }
    /* sparse_dim() rows of nnz() indices. */
    Span<const int64_t> indices() const noexcept { return {c_ ? c_->indices : nullptr, sparse_dim() * nnz()}; }
    /* nnz() rows of prod(dense sizes) elements. */
    ConstBuffer values() const noexcept {
        size_t n = nnz();
        for (size_t d = sparse_dim(); d < sparse_dim() + dense_dim(); d++) n *= size_t(c_->shape[d]);
        return ConstBuffer(c_ ? c_->values : nullptr, n, dtype());
    }
    /* The values as T, which must match dtype(). */
    template <class T> Span<const T> values_as() const {
        if (dtype_v<T> != dtype()) detail::invalid("the values have another dtype", "SparseCoo::values_as");
        return {static_cast<const T *>(values().data()), values().count()};
    }
    /* An input view of this tensor (valid while it lives). */
    SparseView view() const { return SparseView{shape(), sparse_dim(), indices(), values()}; }
    /* The C struct the library writes (its address is stable across moves). */
    tc_sparse_coo_t *c() noexcept { return c_.get(); }
    /* Frees the arrays; the tensor is then empty. */
    void reset() noexcept {
        if (!c_) return;
        tc_free(const_cast<int64_t *>(c_->shape));
        tc_free(const_cast<int64_t *>(c_->indices));
        tc_free(const_cast<void *>(c_->values));
        *c_ = tc_sparse_coo_t{};
    }

  private:
    std::unique_ptr<tc_sparse_coo_t> c_;
};

/* Options of a tc::Reducer (tc_reducer_options_t), as a builder. */
class ReducerOptions {
  public:
    ReducerOptions() noexcept : c_(TC_REDUCER_OPTIONS_INIT) {}
    /* Size at which a bucket is closed; 0: 25 MiB. */
    ReducerOptions &bucket_cap_bytes(size_t n) noexcept { return c_.bucket_cap_bytes = n, *this; }
    /* Size at which each dtype's first bucket is closed; 0: 1 MiB. */
    ReducerOptions &first_bucket_bytes(size_t n) noexcept { return c_.first_bucket_bytes = n, *this; }
    /* The gradients live in the buckets (Reducer::grad gives each one). */
    ReducerOptions &gradient_as_bucket_view(bool on = true) noexcept {
        return c_.gradient_as_bucket_view = on ? 1 : 0, *this;
    }
    const tc_reducer_options_t *c() const noexcept { return &c_; }

  private:
    tc_reducer_options_t c_;
};

/* The built-in communication hooks (TC_HOOK_*). */
enum class Hook : tc_hook_kind_t {
    AllReduce = TC_HOOK_ALLREDUCE,
    Fp16Compress = TC_HOOK_FP16_COMPRESS,
    Bf16Compress = TC_HOOK_BF16_COMPRESS,
    NoOp = TC_HOOK_NOOP,
    PowerSgd = TC_HOOK_POWERSGD, /* default options; see Reducer::set_powersgd */
};



} // namespace tc

#endif /* TORCHCOMM_BASE_HPP */
