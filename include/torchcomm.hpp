/*
 * torchcomm.hpp: header-only C++17 interface over the C API of libtorchcomm
 * (torchcomm.h). Link with -ltorchcomm as for C; nothing here is compiled
 * into the library.
 *
 * - Handles are move-only RAII types (tc::Comm, tc::Work, tc::Store,
 *   tc::Window, tc::Batch, tc::Memory, tc::Registration, tc::Reducer,
 *   tc::SparseCoo, tc::AllGatherP, tc::Local): the destructor
 *   calls the C destroy/free function.
 * - A failing call throws tc::Error, carrying the tc_result_t code and the
 *   thread's tc_last_error() detail.
 * - Buffers are tc::Buffer / tc::ConstBuffer: built implicitly from any
 *   contiguous container (std::vector, std::array, C arrays, std::span in
 *   C++20, tc::Span) whose element type maps to a dtype, from
 *   {pointer, count}, or from (void pointer, count, tc::DType) for element
 *   types C++ lacks (float16, bfloat16, float8).
 * - Options are builders: tc::OpOptions().async(true).timeout(...).
 * Every call maps to one C call with the same semantics: see torchcomm.h
 * for ownership, threading and stream ordering.
 */
#ifndef TORCHCOMM_HPP
#define TORCHCOMM_HPP

#include "torchcomm_base.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tc {

/* ------------------------------------------------------------------ comm */

class Comm;

/* A batch of sends and receives issued as one operation (tc_batch_t). */
class Batch {
  public:
    explicit Batch(tc_batch_t *b) noexcept : h_(b) {}
    /* Entries of one (peer, tag) pair up in order; see tc_batch_send_tagged. */
    Batch &send(ConstBuffer buf, int peer, uint32_t tag = 0) {
        detail::check(tc_batch_send_tagged(h_.get(), buf.data(), buf.count(), buf.c_dtype(), peer, tag),
                      "tc_batch_send_tagged");
        return *this;
    }
    Batch &recv(Buffer buf, int peer, uint32_t tag = 0) {
        detail::check(tc_batch_recv_tagged(h_.get(), buf.data(), buf.count(), buf.c_dtype(), peer, tag),
                      "tc_batch_recv_tagged");
        return *this;
    }
    /* Issues everything added so far; the batch is emptied and reusable. */
    Work issue(const OpOptions &o = {}) {
        tc_work_t *w = nullptr;
        o.with_c([&](const tc_op_options_t *c) {
            detail::check(tc_batch_issue(h_.get(), c, &w), "tc_batch_issue");
        });
        return Work(w);
    }
    tc_batch_t *get() const noexcept { return h_.get(); }

  private:
    detail::Handle<tc_batch_t, tc_batch_free> h_;
};

/* Memory from the comm's backend allocator (tc_mem_alloc), freed with
   tc_mem_free on destruction. It refers to its comm: destroy it first. */
class Memory {
  public:
    Memory() noexcept = default;
    Memory(tc_comm_t *comm, void *ptr, size_t bytes) noexcept : comm_(comm), ptr_(ptr), bytes_(bytes) {}
    Memory(Memory &&o) noexcept
        : comm_(o.comm_), ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
    Memory &operator=(Memory &&o) noexcept {
        if (this != &o) {
            reset();
            comm_ = o.comm_, ptr_ = std::exchange(o.ptr_, nullptr), bytes_ = o.bytes_;
        }
        return *this;
    }
    ~Memory() { reset(); }
    void *get() const noexcept { return ptr_; }
    template <class T> T *as() const noexcept { return static_cast<T *>(ptr_); }
    size_t bytes() const noexcept { return bytes_; }
    /* Frees now, reporting a failure (the destructor ignores it). */
    void free() {
        detail::check(tc_mem_free(comm_, std::exchange(ptr_, nullptr)), "tc_mem_free");
    }

  private:
    void reset() noexcept {
        if (ptr_) (void)tc_mem_free(comm_, std::exchange(ptr_, nullptr));
    }
    tc_comm_t *comm_ = nullptr;
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

/* A buffer registration (tc_comm_register), deregistered on destruction.
   It refers to its comm: destroy it first. */
class Registration {
  public:
    Registration() noexcept = default;
    Registration(tc_comm_t *comm, void *handle) noexcept : comm_(comm), handle_(handle) {}
    Registration(Registration &&o) noexcept : comm_(o.comm_), handle_(std::exchange(o.handle_, nullptr)) {}
    Registration &operator=(Registration &&o) noexcept {
        if (this != &o) {
            reset();
            comm_ = o.comm_, handle_ = std::exchange(o.handle_, nullptr);
        }
        return *this;
    }
    ~Registration() { reset(); }
    void *get() const noexcept { return handle_; }
    void deregister() {
        detail::check(tc_comm_deregister(comm_, std::exchange(handle_, nullptr)), "tc_comm_deregister");
    }

  private:
    void reset() noexcept {
        if (handle_) (void)tc_comm_deregister(comm_, std::exchange(handle_, nullptr));
    }
    tc_comm_t *comm_ = nullptr;
    void *handle_ = nullptr;
};

/* Called once when the comm becomes aborted; see tc_comm_set_abort_hook.
   Exceptions it throws are swallowed (none may cross the C boundary). */
using AbortHook = std::function<void(tc_result_t code, const char *message)>;

/* An operation hook (Comm::add_pre_hook / add_post_hook): the operation's
   description, valid during the call only. It may run on another thread
   (post hooks of async host operations run on the comm's progress thread),
   so it must be safe to call from any thread. Exceptions it throws are
   swallowed (none may cross the C boundary). */
using OpHook = std::function<void(const tc_op_info_t &info)>;

/* A communicator (tc_comm_t). Every operation returns a tc::Work; with the
   default options it is already complete when the call returns. */
class Comm {
  public:
    Comm() noexcept = default;
    explicit Comm(tc_comm_t *c) noexcept : h_(c) {}
    /* Collective over the job; rank, size and store from `opts` or the
       environment (see tc_comm_new). */
    explicit Comm(const std::string &backend, Device device = Device::cpu(), const CommOptions &opts = {}) {
        tc_comm_t *c = nullptr;
        opts.with_c([&](const tc_comm_options_t *o) {
            detail::check(tc_comm_new(backend.c_str(), device.c, o, &c), "tc_comm_new");
        });
        h_ = Handle(c);
    }
    Comm(Comm &&) noexcept = default;
    Comm &operator=(Comm &&o) noexcept {
        if (this != &o) {
            h_ = std::move(o.h_); // destroys ours first: no hook call after that
            hook_ = std::move(o.hook_);
            op_hooks_ = std::move(o.op_hooks_);
        }
        return *this;
    }
    ~Comm() { h_.reset(); } // before the hooks go away
    explicit operator bool() const noexcept { return h_.get() != nullptr; }
    tc_comm_t *get() const noexcept { return h_.get(); }

    int rank() const { return get_int(tc_comm_get_rank, "tc_comm_get_rank"); }
    int size() const { return get_int(tc_comm_get_size, "tc_comm_get_size"); }
    std::string name() const { return get_str(tc_comm_get_name, "tc_comm_get_name"); }
    std::string backend() const { return get_str(tc_comm_get_backend, "tc_comm_get_backend"); }
    Device device() const {
        Device d{};
        detail::check(tc_comm_get_device(h_.get(), &d.c), "tc_comm_get_device");
        return d;
    }
    /* This comm's ranks in the root comm's numbering (tc_comm_get_ranks). */
    std::vector<int> ranks() const {
        size_t n = 0;
        detail::check(tc_comm_get_ranks(h_.get(), nullptr, &n), "tc_comm_get_ranks");
        std::vector<int> r(n);
        detail::check(tc_comm_get_ranks(h_.get(), r.data(), &n), "tc_comm_get_ranks");
        return r;
    }
    std::string backend_version() const {
        return get_str(tc_comm_get_backend_version, "tc_comm_get_backend_version");
    }
    /* Default timeout of later operations on this rank (tc_comm_set_timeout). */
    void set_timeout(std::chrono::milliseconds t) {
        detail::check(tc_comm_set_timeout(h_.get(), detail::to_ms(t)), "tc_comm_set_timeout");
    }
    /* All or nothing; only hints a live comm can change (tc_comm_set_hints). */
    void set_hints(const std::vector<std::pair<std::string, std::string>> &hints) {
        detail::HintArray h(hints);
        detail::check(tc_comm_set_hints(h_.get(), h.data(), h.size()), "tc_comm_set_hints");
    }
    /* The failure that aborted the comm, if any. */
    std::optional<Error> async_error() const {
        tc_result_t rc = tc_comm_get_async_error(h_.get());
        if (rc == TC_SUCCESS) return std::nullopt;
        return Error(rc, tc_last_error(), "tc_comm_get_async_error");
    }
    std::string dump_flight_recorder() const {
        char *text = nullptr;
        detail::check(tc_comm_dump_flight_recorder(h_.get(), &text), "tc_comm_dump_flight_recorder");
        std::unique_ptr<char, detail::FreeDeleter> owned(text);
        return std::string(text);
    }
    /* An empty hook removes it. */
    void set_abort_hook(AbortHook hook) {
        auto next = hook ? std::make_unique<AbortHook>(std::move(hook)) : nullptr;
        detail::check(tc_comm_set_abort_hook(h_.get(), next ? &Comm::call_hook : nullptr, next.get()),
                      "tc_comm_set_abort_hook");
        hook_ = std::move(next); // the library no longer calls the old one
    }
    /* Operation hooks, called in registration order; the returned id is
       for remove_hook. A C function: `fn` and `user` stay the caller's and
       must stay valid until remove_hook(id) or the comm's destruction. An
       OpHook: the comm keeps it until then. Adding or removing hooks on one
       tc::Comm is not thread-safe (the map of kept hooks is unguarded). */
    uint64_t add_pre_hook(tc_op_hook_t fn, void *user) {
        return add_hook(tc_comm_add_pre_hook, fn, user, "tc_comm_add_pre_hook");
    }
    uint64_t add_post_hook(tc_op_hook_t fn, void *user) {
        return add_hook(tc_comm_add_post_hook, fn, user, "tc_comm_add_post_hook");
    }
    uint64_t add_pre_hook(OpHook hook) {
        return keep_hook(tc_comm_add_pre_hook, std::move(hook), "tc_comm_add_pre_hook");
    }
    uint64_t add_post_hook(OpHook hook) {
        return keep_hook(tc_comm_add_post_hook, std::move(hook), "tc_comm_add_post_hook");
    }
    /* When this returns the hook is not running and never called again. */
    void remove_hook(uint64_t id) {
        detail::check(tc_comm_remove_hook(h_.get(), id), "tc_comm_remove_hook");
        op_hooks_.erase(id);
    }
    /* Parent ranks, the same on every rank; an empty list opts out and
       returns an empty Comm. */
    Comm split(Span<const int> ranks, const std::string &name, const CommOptions &opts = {}) {
        tc_comm_t *c = nullptr;
        opts.with_c([&](const tc_comm_options_t *o) {
            detail::check(tc_comm_split(h_.get(), ranks.data(), ranks.size(), name.c_str(), o, &c),
                          "tc_comm_split");
        });
        return Comm(c);
    }
    /* The comm of the ranks not in `exclude_ranks` (parent ranks, the same
       set on every remaining rank), in their old order; also on an aborted
       comm. Called by the remaining ranks only (see tc_comm_shrink). */
    Comm shrink(Span<const int> exclude_ranks, const std::string &name, const CommOptions &opts = {}) {
        tc_comm_t *c = nullptr;
        opts.with_c([&](const tc_comm_options_t *o) {
            detail::check(tc_comm_shrink(h_.get(), exclude_ranks.data(), exclude_ranks.size(), name.c_str(), o, &c),
                          "tc_comm_shrink");
        });
        return Comm(c);
    }
    /* The init handle of a comm created with enable_reconfigure (see
       tc_comm_get_init_handle): publish it for the members' reconfigure. */
    std::string init_handle() const { return get_str(tc_comm_get_init_handle, "tc_comm_get_init_handle"); }
    /* Re-forms this comm in place from the members' init handles, ranked
       in list order or, with `as_set`, in the handles' byte order;
       collective over the members, blocking (see tc_comm_reconfigure). */
    Work reconfigure(int64_t uuid, const std::vector<std::string> &init_handles, bool as_set = false,
                     const OpOptions &o = {}) {
        std::vector<const char *> list;
        for (const std::string &h : init_handles) list.push_back(h.c_str());
        const int form = as_set ? TC_INIT_HANDLES_SET : TC_INIT_HANDLES_LIST;
        return op("tc_comm_reconfigure", o, [&](auto c, auto w) {
            return tc_comm_reconfigure(h_.get(), uuid, list.data(), list.size(), form, c, w);
        });
    }
    void finalize() { detail::check(tc_comm_finalize(h_.get()), "tc_comm_finalize"); }
    void abort() { detail::check(tc_comm_abort(h_.get()), "tc_comm_abort"); }

    Memory mem_alloc(size_t bytes) {
        void *p = nullptr;
        detail::check(tc_mem_alloc(h_.get(), bytes, &p), "tc_mem_alloc");
        return Memory(h_.get(), p, bytes);
    }
    Registration register_buffer(void *buf, size_t bytes) {
        void *handle = nullptr;
        detail::check(tc_comm_register(h_.get(), buf, bytes, &handle), "tc_comm_register");
        return Registration(h_.get(), handle);
    }
    Batch batch() {
        tc_batch_t *b = nullptr;
        detail::check(tc_batch_begin(h_.get(), &b), "tc_batch_begin");
        return Batch(b);
    }

    /* Point to point. */
    Work send(ConstBuffer buf, int peer, const OpOptions &o = {}) {
        return op("tc_send", o, [&](auto c, auto w) {
            return tc_send(h_.get(), buf.data(), buf.count(), buf.c_dtype(), peer, c, w);
        });
    }
    Work recv(Buffer buf, int peer, const OpOptions &o = {}) {
        return op("tc_recv", o, [&](auto c, auto w) {
            return tc_recv(h_.get(), buf.data(), buf.count(), buf.c_dtype(), peer, c, w);
        });
    }

    /* Collectives. */
    Work broadcast(Buffer buf, int root, const OpOptions &o = {}) {
        return op("tc_broadcast", o, [&](auto c, auto w) {
            return tc_broadcast(h_.get(), buf.data(), buf.count(), buf.c_dtype(), root, c, w);
        });
    }
    Work reduce(Buffer buf, int root, ReduceOp red, const OpOptions &o = {}) {
        return op("tc_reduce", o, [&](auto c, auto w) {
            return tc_reduce(h_.get(), buf.data(), buf.count(), buf.c_dtype(), root, red.c, c, w);
        });
    }
    Work all_reduce(Buffer buf, ReduceOp red, const OpOptions &o = {}) {
        return op("tc_all_reduce", o, [&](auto c, auto w) {
            return tc_all_reduce(h_.get(), buf.data(), buf.count(), buf.c_dtype(), red.c, c, w);
        });
    }
    /* One output per rank, each of input.count() elements. */
    Work all_gather(const std::vector<Buffer> &outputs, ConstBuffer input, const OpOptions &o = {}) {
        auto outs = pointers(outputs, input, "outputs");
        return op("tc_all_gather", o, [&](auto c, auto w) {
            return tc_all_gather(h_.get(), outs.data(), input.data(), input.count(), input.c_dtype(), c, w);
        });
    }
    /* output: size() * input.count() elements. */
    Work all_gather_single(Buffer output, ConstBuffer input, const OpOptions &o = {}) {
        same_type(output, input, input.count() * size_t(size()), "output");
        return op("tc_all_gather_single", o, [&](auto c, auto w) {
            return tc_all_gather_single(h_.get(), output.data(), input.data(), input.count(),
                                        input.c_dtype(), c, w);
        });
    }
    /* counts: one per rank; input holds counts[rank()], output their sum. */
    Work all_gather_v(Buffer output, Span<const size_t> counts, ConstBuffer input, const OpOptions &o = {}) {
        same_type(output, input, output.count(), "output");
        return op("tc_all_gather_v", o, [&](auto c, auto w) {
            return tc_all_gather_v(h_.get(), output.data(), counts.data(), input.data(), input.c_dtype(), c, w);
        });
    }
    /* One input per rank, each of output.count() elements. */
    Work reduce_scatter(Buffer output, const std::vector<ConstBuffer> &inputs, ReduceOp red,
                        const OpOptions &o = {}) {
        auto ins = pointers(inputs, output, "inputs");
        return op("tc_reduce_scatter", o, [&](auto c, auto w) {
            return tc_reduce_scatter(h_.get(), output.data(), ins.data(), output.count(), output.c_dtype(),
                                     red.c, c, w);
        });
    }
    /* input: size() * output.count() elements. */
    Work reduce_scatter_single(Buffer output, ConstBuffer input, ReduceOp red, const OpOptions &o = {}) {
        same_type(input, output, output.count() * size_t(size()), "input");
        return op("tc_reduce_scatter_single", o, [&](auto c, auto w) {
            return tc_reduce_scatter_single(h_.get(), output.data(), input.data(), output.count(),
                                            output.c_dtype(), red.c, c, w);
        });
    }
    Work reduce_scatter_v(Buffer output, ConstBuffer input, Span<const size_t> counts, ReduceOp red,
                          const OpOptions &o = {}) {
        same_type(input, output, input.count(), "input");
        return op("tc_reduce_scatter_v", o, [&](auto c, auto w) {
            return tc_reduce_scatter_v(h_.get(), output.data(), input.data(), counts.data(), output.c_dtype(),
                                       red.c, c, w);
        });
    }
    /* One output and one input per rank, each of input-count elements. */
    Work all_to_all(const std::vector<Buffer> &outputs, const std::vector<ConstBuffer> &inputs,
                    const OpOptions &o = {}) {
        if (inputs.empty()) detail::invalid("'inputs' is empty", "tc_all_to_all");
        auto ins = pointers(inputs, inputs[0], "inputs");
        auto outs = pointers(outputs, inputs[0], "outputs");
        return op("tc_all_to_all", o, [&](auto c, auto w) {
            return tc_all_to_all(h_.get(), outs.data(), ins.data(), inputs[0].count(), inputs[0].c_dtype(), c, w);
        });
    }
    /* input and output: size() blocks of count elements. */
    Work all_to_all_single(Buffer output, ConstBuffer input, const OpOptions &o = {}) {
        same_type(output, input, input.count(), "output");
        if (input.count() % size_t(size()) != 0)
            detail::invalid("'input' is not a multiple of the comm's size", "tc_all_to_all_single");
        return op("tc_all_to_all_single", o, [&](auto c, auto w) {
            return tc_all_to_all_single(h_.get(), output.data(), input.data(), input.count() / size_t(size()),
                                        input.c_dtype(), c, w);
        });
    }
    Work all_to_all_v_single(Buffer output, Span<const size_t> output_counts, ConstBuffer input,
                             Span<const size_t> input_counts, const OpOptions &o = {}) {
        same_type(output, input, output.count(), "output");
        return op("tc_all_to_all_v_single", o, [&](auto c, auto w) {
            return tc_all_to_all_v_single(h_.get(), output.data(), output_counts.data(), input.data(),
                                          input_counts.data(), input.c_dtype(), c, w);
        });
    }
    Work barrier(const OpOptions &o = {}) {
        return op("tc_barrier", o, [&](auto c, auto w) { return tc_barrier(h_.get(), c, w); });
    }
    /* inputs: one per rank on root (ignored elsewhere: pass {}). */
    Work scatter(Buffer output, const std::vector<ConstBuffer> &inputs, int root, const OpOptions &o = {}) {
        auto ins = pointers(inputs, output, "inputs");
        return op("tc_scatter", o, [&](auto c, auto w) {
            return tc_scatter(h_.get(), output.data(), inputs.empty() ? nullptr : ins.data(), output.count(),
                              output.c_dtype(), root, c, w);
        });
    }
    /* outputs: one per rank on root (ignored elsewhere: pass {}). */
    Work gather(const std::vector<Buffer> &outputs, ConstBuffer input, int root, const OpOptions &o = {}) {
        auto outs = pointers(outputs, input, "outputs");
        return op("tc_gather", o, [&](auto c, auto w) {
            return tc_gather(h_.get(), outputs.empty() ? nullptr : outs.data(), input.data(), input.count(),
                             input.c_dtype(), root, c, w);
        });
    }
    /* output: size() * input.count() elements on root, rank r's block at
       r * input.count(); ignored elsewhere (pass an empty buffer). */
    Work gather_single(Buffer output, ConstBuffer input, int root, const OpOptions &o = {}) {
        if (rank() == root) same_type(output, input, input.count() * size_t(size()), "output");
        return op("tc_gather_single", o, [&](auto c, auto w) {
            return tc_gather_single(h_.get(), output.data(), input.data(), input.count(), input.c_dtype(), root,
                                    c, w);
        });
    }

    /* Broadcasts root's buffers into every rank's, packed into messages of
       at most buffer_bytes per dtype (tc_broadcast_coalesced). */
    Work broadcast_coalesced(const std::vector<Buffer> &bufs, size_t buffer_bytes, int root,
                             const OpOptions &o = {}) {
        std::vector<void *> ptrs;
        std::vector<size_t> counts;
        std::vector<tc_dtype_t> dtypes;
        for (const Buffer &b : bufs) {
            ptrs.push_back(b.data());
            counts.push_back(b.count());
            dtypes.push_back(b.c_dtype());
        }
        return op("tc_broadcast_coalesced", o, [&](auto c, auto w) {
            return tc_broadcast_coalesced(h_.get(), ptrs.data(), counts.data(), dtypes.data(), bufs.size(),
                                          buffer_bytes, root, c, w);
        });
    }
    /* Sums (tc::Sum or tc::Avg) a sparse tensor across the ranks into `out`
       (its previous arrays freed first). With async options `out` must
       live, unread, until the work completes. */
    Work sparse_all_reduce(const SparseView &input, ReduceOp red, SparseCoo &out, const OpOptions &o = {}) {
        tc_sparse_coo_t in = input.c();
        out.reset();
        return op("tc_sparse_all_reduce", o, [&](auto c, auto w) {
            return tc_sparse_all_reduce(h_.get(), &in, red.c, out.c(), c, w);
        });
    }
    /* As above, returning the result once it is complete. */
    SparseCoo sparse_all_reduce(const SparseView &input, ReduceOp red, const OpOptions &o = {}) {
        SparseCoo out;
        sparse_all_reduce(input, red, out, o).wait();
        return out;
    }
    /* Gives up ownership of the handle (the caller frees it). */
    tc_comm_t *release() noexcept { return h_.release(); }

  private:
    using Handle = detail::Handle<tc_comm_t, tc_comm_destroy>;

    /* Runs one C operation with the options' C struct and wraps its work. */
    template <class F> static Work op(const char *call, const OpOptions &o, F &&f) {
        tc_work_t *w = nullptr;
        o.with_c([&](const tc_op_options_t *c) { detail::check(f(c, &w), call); });
        return Work(w);
    }
    int get_int(tc_result_t (*f)(const tc_comm_t *, int *), const char *call) const {
        int v = 0;
        detail::check(f(h_.get(), &v), call);
        return v;
    }
    std::string get_str(tc_result_t (*f)(const tc_comm_t *, const char **), const char *call) const {
        const char *s = nullptr;
        detail::check(f(h_.get(), &s), call);
        return s;
    }
    /* A list of buffers as the C pointer array; each must match `like`'s
       dtype and count, and a list (if given) has one entry per rank. */
    template <class B, class Like>
    std::vector<typename B::pointer> pointers(const std::vector<B> &bufs, const Like &like,
                                              const char *what) const {
        std::vector<typename B::pointer> p;
        if (bufs.empty()) return p;
        if (bufs.size() != size_t(size()))
            detail::invalid("'" + std::string(what) + "' needs one buffer per rank", what);
        for (const auto &b : bufs) {
            if (b.dtype() != like.dtype() || b.count() != like.count())
                detail::invalid("every buffer of '" + std::string(what) + "' needs the same dtype and count",
                                what);
            p.push_back(b.data());
        }
        return p;
    }
    template <class A, class B> static void same_type(const A &a, const B &b, size_t count, const char *what) {
        if (a.dtype() != b.dtype()) detail::invalid("'" + std::string(what) + "' has another dtype", what);
        if (a.count() != count)
            detail::invalid("'" + std::string(what) + "' has " + std::to_string(a.count()) +
                                " elements, expected " + std::to_string(count),
                            what);
    }
    static void call_hook(tc_result_t code, const char *message, void *user) {
        try {
            (*static_cast<AbortHook *>(user))(code, message);
        } catch (...) {
        }
    }
    using AddHook = tc_result_t (*)(tc_comm_t *, tc_op_hook_t, void *, uint64_t *);
    uint64_t add_hook(AddHook add, tc_op_hook_t fn, void *user, const char *call) {
        uint64_t id = 0;
        detail::check(add(h_.get(), fn, user, &id), call);
        return id;
    }
    uint64_t keep_hook(AddHook add, OpHook hook, const char *call) {
        if (!hook) detail::invalid("'hook' is empty", call);
        auto owned = std::make_unique<OpHook>(std::move(hook));
        uint64_t id = add_hook(add, &Comm::call_op_hook, owned.get(), call);
        op_hooks_.emplace(id, std::move(owned));
        return id;
    }
    static void call_op_hook(const tc_op_info_t *info, void *user) {
        try {
            (*static_cast<OpHook *>(user))(*info);
        } catch (...) {
        }
    }

    Handle h_;
    std::unique_ptr<AbortHook> hook_;
    std::map<uint64_t, std::unique_ptr<OpHook>> op_hooks_; // OpHooks the library may call
};

/* A persistent all-gather (tc_all_gather_p_t): the output and per-rank
   count are fixed at set-up, then exec() runs it any number of times. Freed
   on destruction (executions already issued complete on their own); it
   keeps its comm alive. */
class AllGatherP {
  public:
    AllGatherP() noexcept = default;
    /* Collective (same count and dtype on every rank). output: size() blocks
       of the per-rank count; it must stay valid until this is destroyed and
       its last execution completed. */
    AllGatherP(Comm &comm, Buffer output, const OpOptions &o = {}) : dtype_(output.dtype()) {
        const size_t size = size_t(comm.size());
        if (output.count() % size != 0)
            detail::invalid("'output' is not a multiple of the comm's size", "tc_all_gather_p_init");
        count_ = output.count() / size;
        tc_all_gather_p_t *p = nullptr;
        o.with_c([&](const tc_op_options_t *c) {
            detail::check(tc_all_gather_p_init(comm.get(), output.data(), count_, output.c_dtype(), c, &p),
                          "tc_all_gather_p_init");
        });
        h_.reset(p);
    }
    explicit operator bool() const noexcept { return h_.get() != nullptr; }
    tc_all_gather_p_t *get() const noexcept { return h_.get(); }
    size_t count() const noexcept { return count_; }
    /* input: count() elements of the output's dtype (may be this rank's own
       block of the output). Once its work completed it may run again. */
    Work exec(ConstBuffer input, const OpOptions &o = {}) {
        if (input.dtype() != dtype_ || input.count() != count_)
            detail::invalid("'input' needs " + std::to_string(count_) + " elements of the output's dtype",
                            "tc_all_gather_p_exec");
        tc_work_t *w = nullptr;
        o.with_c([&](const tc_op_options_t *c) {
            detail::check(tc_all_gather_p_exec(h_.get(), input.data(), c, &w), "tc_all_gather_p_exec");
        });
        return Work(w);
    }

  private:
    detail::Handle<tc_all_gather_p_t, tc_all_gather_p_free> h_;
    size_t count_ = 0;
    DType dtype_ = DType::Float32;
};

/* ---------------------------------------------------------------- window */

/* A one-sided window over a comm (tc_window_t); it keeps the comm's
   resources alive until destroyed. */
class Window {
  public:
    Window() noexcept = default;
    explicit Window(Comm &comm) {
        tc_window_t *w = nullptr;
        detail::check(tc_window_new(comm.get(), &w), "tc_window_new");
        h_.reset(w);
    }
    explicit operator bool() const noexcept { return h_.get() != nullptr; }
    tc_window_t *get() const noexcept { return h_.get(); }

    /* Collective; the memory must stay valid until deregister(). */
    void register_buffer(void *buf, size_t bytes) {
        detail::check(tc_window_register(h_.get(), buf, bytes), "tc_window_register");
    }
    void register_buffer(Buffer buf) { register_buffer(buf.data(), buf.count() * dtype_size(buf.dtype())); }
    void register_buffer(const Memory &m) { register_buffer(m.get(), m.bytes()); }
    void deregister() { detail::check(tc_window_deregister(h_.get()), "tc_window_deregister"); }

    /* Writes src into dst_rank's buffer at byte offset dst_offset. */
    Work put(const void *src, size_t bytes, int32_t dst_rank, size_t dst_offset, const OpOptions &o = {}) {
        tc_work_t *w = nullptr;
        o.with_c([&](const tc_op_options_t *c) {
            detail::check(tc_window_put(h_.get(), src, bytes, dst_rank, dst_offset, c, &w), "tc_window_put");
        });
        return Work(w);
    }
    Work put(ConstBuffer src, int32_t dst_rank, size_t dst_offset, const OpOptions &o = {}) {
        return put(src.data(), src.count() * dtype_size(src.dtype()), dst_rank, dst_offset, o);
    }
    Work signal(int32_t peer, const OpOptions &o = {}) {
        tc_work_t *w = nullptr;
        o.with_c([&](const tc_op_options_t *c) {
            detail::check(tc_window_signal(h_.get(), peer, c, &w), "tc_window_signal");
        });
        return Work(w);
    }
    Work wait_signal(int32_t peer, const OpOptions &o = {}) {
        tc_work_t *w = nullptr;
        o.with_c([&](const tc_op_options_t *c) {
            detail::check(tc_window_wait_signal(h_.get(), peer, c, &w), "tc_window_wait_signal");
        });
        return Work(w);
    }
    /* Reads bytes at byte offset src_offset of src_rank's buffer into dst. */
    Work get(void *dst, size_t bytes, int32_t src_rank, size_t src_offset, const OpOptions &o = {}) {
        tc_work_t *w = nullptr;
        o.with_c([&](const tc_op_options_t *c) {
            detail::check(tc_window_get(h_.get(), dst, bytes, src_rank, src_offset, c, &w), "tc_window_get");
        });
        return Work(w);
    }
    Work get(Buffer dst, int32_t src_rank, size_t src_offset, const OpOptions &o = {}) {
        return get(dst.data(), dst.count() * dtype_size(dst.dtype()), src_rank, src_offset, o);
    }
    template <class T = void> T *map_remote(int32_t rank) const {
        void *p = nullptr;
        detail::check(tc_window_map_remote(h_.get(), rank, &p), "tc_window_map_remote");
        return static_cast<T *>(p);
    }

  private:
    detail::Handle<tc_window_t, tc_window_free> h_;
};

/* --------------------------------------------------------------- reducer */

/* The bucket a communication hook exchanges (a view of tc_grad_bucket_t,
   valid during the hook's call). */
class GradBucket {
  public:
    explicit GradBucket(tc_grad_bucket_t *b) noexcept : b_(b) {}
    size_t index() const noexcept { return b_->index; }
    size_t num_buckets() const noexcept { return b_->num_buckets; }
    bool is_last() const noexcept { return b_->is_last != 0; }
    /* The flat buffer holding the bucket's gradients. */
    Buffer buffer() const noexcept { return Buffer(b_->buffer, b_->count, static_cast<DType>(b_->dtype)); }
    /* Exchange this buffer instead (same count, a floating-point dtype); it
       must stay valid until Reducer::finalize returns, which casts its
       final contents back into the bucket. */
    void set_buffer(Buffer b) {
        if (b.count() != b_->count) detail::invalid("'buffer' needs the bucket's element count", "set_buffer");
        b_->buffer = b.data();
        b_->dtype = b.c_dtype();
    }
    /* Per gradient of the bucket: its index in the reducer's list, its
       offset in the buffer and its length (elements). */
    Span<const size_t> grad_indices() const noexcept { return {b_->grad_indices, b_->num_grads}; }
    Span<const size_t> offsets() const noexcept { return {b_->offsets, b_->num_grads}; }
    Span<const size_t> lengths() const noexcept { return {b_->lengths, b_->num_grads}; }
    tc_grad_bucket_t *c() const noexcept { return b_; }

  private:
    tc_grad_bucket_t *b_;
};

/* A communication hook: issues the bucket's exchange on `comm` (borrowed
   for the call) and returns its work. Every rank must issue the same
   operations. An exception becomes the hook's error result: the call that
   ran the hook (mark_ready or finalize) throws tc::Error with its text. */
using CommHook = std::function<Work(Comm &comm, GradBucket &bucket)>;

/* A gradient reducer (tc_reducer_t): bucketed exchange of gradients as
   DDP does it. `comm` must outlive it; so must the gradient buffers. */
class Reducer {
  public:
    Reducer() noexcept = default;
    /* Collective. With gradient_as_bucket_view, pass buffers whose data is
       nullptr (only their count and dtype are used); grad(i) then gives
       where each gradient lives. */
    Reducer(Comm &comm, const std::vector<Buffer> &grads, const ReducerOptions &opts = {}) {
        std::vector<void *> ptrs;
        std::vector<size_t> counts;
        std::vector<tc_dtype_t> dtypes;
        bool any_data = false;
        for (const Buffer &b : grads) {
            ptrs.push_back(b.data());
            counts.push_back(b.count());
            dtypes.push_back(b.c_dtype());
            any_data = any_data || b.data() != nullptr;
        }
        tc_reducer_t *r = nullptr;
        detail::check(tc_reducer_new(comm.get(), any_data ? ptrs.data() : nullptr, counts.data(), dtypes.data(),
                                     grads.size(), opts.c(), &r),
                      "tc_reducer_new");
        h_.reset(r);
    }
    Reducer(Reducer &&) noexcept = default;
    Reducer &operator=(Reducer &&o) noexcept {
        if (this != &o) {
            h_ = std::move(o.h_); // frees ours first: its hook is no longer called
            hook_ = std::move(o.hook_);
        }
        return *this;
    }
    ~Reducer() { h_.reset(); } // before hook_ goes away
    explicit operator bool() const noexcept { return h_.get() != nullptr; }
    tc_reducer_t *get() const noexcept { return h_.get(); }

    /* Gradient i is final for this iteration (may run hooks). */
    void mark_ready(size_t i) { run(tc_reducer_mark_ready(h_.get(), i), "tc_reducer_mark_ready"); }
    /* Ends the iteration: every bucket exchanged and written back. */
    void finalize() { run(tc_reducer_finalize(h_.get()), "tc_reducer_finalize"); }
    /* As finalize(), returning at once; read no gradient before the work
       completes. */
    Work finalize_async() {
        tc_work_t *w = nullptr;
        run(tc_reducer_finalize_async(h_.get(), &w), "tc_reducer_finalize_async");
        return Work(w);
    }
    /* Only between iterations. */
    void set_hook(CommHook hook) {
        if (!hook) detail::invalid("'hook' is empty", "tc_reducer_set_hook");
        auto next = std::make_unique<HookState>(HookState{std::move(hook), {}});
        detail::check(tc_reducer_set_hook(h_.get(), &Reducer::call_hook, next.get()), "tc_reducer_set_hook");
        hook_ = std::move(next); // the library no longer calls the old one
    }
    void set_builtin_hook(Hook kind) {
        detail::check(tc_reducer_set_builtin_hook(h_.get(), static_cast<tc_hook_kind_t>(kind)),
                      "tc_reducer_set_builtin_hook");
        hook_.reset();
    }
    /* PowerSGD with `opts` (start from TC_POWERSGD_OPTIONS_INIT; `rows`
       is copied during the call). */
    void set_powersgd(const tc_powersgd_options_t &opts) {
        detail::check(tc_reducer_set_powersgd(h_.get(), &opts), "tc_reducer_set_powersgd");
        hook_.reset();
    }
    /* Where gradient i lives (its buffer, or its place in a bucket). */
    template <class T = void> T *grad(size_t i) const {
        void *p = nullptr;
        detail::check(tc_reducer_get_grad(h_.get(), i, &p), "tc_reducer_get_grad");
        return static_cast<T *>(p);
    }
    size_t num_buckets() const {
        size_t n = 0;
        detail::check(tc_reducer_num_buckets(h_.get(), &n), "tc_reducer_num_buckets");
        return n;
    }

  private:
    struct HookState {
        CommHook fn;
        std::string error; // what the hook threw during the current call
    };

    /* Throws on failure, naming what a hook of ours threw. */
    void run(tc_result_t rc, const char *call) {
        std::string thrown = hook_ ? std::exchange(hook_->error, {}) : std::string();
        if (rc == TC_SUCCESS) return;
        std::string detail = tc_last_error();
        if (!thrown.empty()) detail += " (the hook threw: " + thrown + ")";
        throw Error(rc, detail, call);
    }
    static tc_result_t call_hook(void *state, tc_comm_t *comm, tc_grad_bucket_t *bucket, tc_work_t **work) {
        auto *s = static_cast<HookState *>(state);
        Comm borrowed(comm);
        tc_result_t rc = TC_ERR_INVALID_USAGE;
        try {
            GradBucket b(bucket);
            *work = s->fn(borrowed, b).release();
            rc = TC_SUCCESS;
        } catch (const Error &e) {
            rc = e.code(), s->error = e.what();
        } catch (const std::exception &e) {
            s->error = e.what();
        } catch (...) {
            s->error = "an exception of unknown type";
        }
        borrowed.release(); // the reducer's comm, not ours to destroy
        return rc;
    }

    detail::Handle<tc_reducer_t, tc_reducer_free> h_;
    std::unique_ptr<HookState> hook_;
};

/* ------------------------------------------------------------ local group */

/* Options of tc::Local (tc_local_options_t), as a builder. */
class LocalOptions {
  public:
    LocalOptions() noexcept : c_(TC_LOCAL_OPTIONS_INIT) {}
    /* false: always the copies path; true (default): NCCL where it applies. */
    LocalOptions &use_nccl(bool on) noexcept { return c_.use_nccl = on ? 1 : 0, *this; }
    /* Bucket size of the coalesced forms when a call passes 0 (0: 10 MiB). */
    LocalOptions &bucket_bytes(size_t n) noexcept { return c_.bucket_bytes = n, *this; }
    const tc_local_options_t *c() const noexcept { return &c_; }

  private:
    tc_local_options_t c_;
};

/* A device group (tc_local_t): one process driving several CUDA devices
   (and the CPU where an operation allows it), torch.cuda.comm's broadcast,
   broadcast_coalesced, scatter, gather, reduce_add and
   reduce_add_coalesced. Member i is devices[i]. Buffers are raw device (or
   host) pointers; every list is checked against the group's size before
   the C call (tc::Error TC_ERR_INVALID_ARGUMENT naming the argument).
   `streams`: empty (every member's legacy stream) or one CUstream per
   member. Stream ordering, threading and errors: see tc_local in
   torchcomm.h. */
class Local {
  public:
    using Pointers = Span<void *const>;
    using ConstPointers = Span<const void *const>;

    Local() noexcept = default;
    explicit Local(const std::vector<Device> &devices, const LocalOptions &opts = {}) {
        std::vector<tc_device_t> c;
        for (const Device &d : devices) c.push_back(d.c);
        tc_local_t *g = nullptr;
        detail::check(tc_local_new(c.data(), c.size(), opts.c(), &g), "tc_local_new");
        h_.reset(g);
        size_ = c.size();
    }
    Local(Local &&o) noexcept : h_(std::move(o.h_)), size_(std::exchange(o.size_, 0)) {}
    Local &operator=(Local &&o) noexcept {
        if (this != &o) h_ = std::move(o.h_), size_ = std::exchange(o.size_, 0);
        return *this;
    }
    explicit operator bool() const noexcept { return h_.get() != nullptr; }
    tc_local_t *get() const noexcept { return h_.get(); }
    /* The number of members. */
    size_t size() const noexcept { return size_; }

    /* src (on member src_index) into dsts[i] on member i; dsts[src_index]
       may be src.data(). */
    void broadcast(ConstBuffer src, size_t src_index, Pointers dsts, Pointers streams = {}) {
        constexpr const char *call = "tc_local_broadcast";
        members(dsts.size(), "dsts", call);
        detail::check(tc_local_broadcast(h_.get(), src.data(), src_index, dsts.data(), src.count(),
                                         src.c_dtype(), streams_of(streams, call)),
                      call);
    }
    /* srcs[t] (on member 0) into dsts[d * srcs.size() + t] on member d;
       buffer_bytes 0: the group's bucket size. */
    void broadcast_coalesced(const std::vector<ConstBuffer> &srcs, Pointers dsts, size_t buffer_bytes = 0,
                             Pointers streams = {}) {
        constexpr const char *call = "tc_local_broadcast_coalesced";
        Lists<ConstBuffer> l(srcs);
        members(dsts.size(), "dsts", call, srcs.size());
        detail::check(tc_local_broadcast_coalesced(h_.get(), l.ptrs.data(), l.counts.data(), l.dtypes.data(),
                                                   srcs.size(), buffer_bytes, dsts.data(),
                                                   streams_of(streams, call)),
                      call);
    }
    /* src (on src_device) split along its first dimension into dsts[i] on
       member i: chunk_counts (one per member, summing to src.count()) or,
       empty, torch.chunk's rule. Counts are elements (rows x row length). */
    void scatter(ConstBuffer src, Device src_device, Pointers dsts, Span<const size_t> chunk_counts = {},
                 Pointers streams = {}) {
        constexpr const char *call = "tc_local_scatter";
        members(dsts.size(), "dsts", call);
        if (chunk_counts.size()) members(chunk_counts.size(), "chunk_counts", call);
        detail::check(tc_local_scatter(h_.get(), src.data(), src_device.c, src.count(), src.c_dtype(),
                                       chunk_counts.size() ? chunk_counts.data() : nullptr, dsts.data(),
                                       streams_of(streams, call)),
                      call);
    }
    /* srcs[i] (counts[i] elements of dtype on member i) concatenated into
       dst on dst_device (Device::cpu(): torch's destination=-1), ordered
       on `stream` of that device (nullptr: its legacy stream). */
    void gather(ConstPointers srcs, Span<const size_t> counts, DType dtype, void *dst, Device dst_device,
                void *stream = nullptr) {
        constexpr const char *call = "tc_local_gather";
        members(srcs.size(), "srcs", call);
        members(counts.size(), "counts", call);
        detail::check(tc_local_gather(h_.get(), srcs.data(), counts.data(), static_cast<tc_dtype_t>(dtype), dst,
                                      dst_device.c, stream),
                      call);
    }
    /* The elementwise sum of srcs[i] (count elements of dtype on member i)
       into dst on member dst_index (dst may be srcs[dst_index]). */
    void reduce_add(ConstPointers srcs, size_t count, DType dtype, void *dst, size_t dst_index,
                    Pointers streams = {}) {
        constexpr const char *call = "tc_local_reduce_add";
        members(srcs.size(), "srcs", call);
        detail::check(tc_local_reduce_add(h_.get(), srcs.data(), count, static_cast<tc_dtype_t>(dtype), dst,
                                          dst_index, streams_of(streams, call)),
                      call);
    }
    /* Buffer t: the sum over members d of srcs[d * dsts.size() + t]
       (dsts[t]'s count and dtype) into dsts[t] on member dst_index. */
    void reduce_add_coalesced(ConstPointers srcs, const std::vector<Buffer> &dsts, size_t dst_index,
                              size_t buffer_bytes = 0, Pointers streams = {}) {
        constexpr const char *call = "tc_local_reduce_add_coalesced";
        Lists<Buffer> l(dsts);
        members(srcs.size(), "srcs", call, dsts.size());
        detail::check(tc_local_reduce_add_coalesced(h_.get(), srcs.data(), l.counts.data(), l.dtypes.data(),
                                                    dsts.size(), buffer_bytes, l.ptrs.data(), dst_index,
                                                    streams_of(streams, call)),
                      call);
    }

  private:
    /* The C arrays of a list of buffers. */
    template <class B> struct Lists {
        explicit Lists(const std::vector<B> &bufs) {
            for (const B &b : bufs) {
                ptrs.push_back(b.data());
                counts.push_back(b.count());
                dtypes.push_back(b.c_dtype());
            }
        }
        std::vector<typename B::pointer> ptrs;
        std::vector<size_t> counts;
        std::vector<tc_dtype_t> dtypes;
    };
    /* A list must hold `per_member` entries per member. */
    void members(size_t n, const char *arg, const char *call, size_t per_member = 1) const {
        if (n != size_ * per_member)
            detail::invalid("argument '" + std::string(arg) + "': " + std::to_string(n) + " entries, expected " +
                                std::to_string(size_ * per_member) +
                                (per_member == 1 ? " (one per member)"
                                                 : " (" + std::to_string(per_member) + " per member)"),
                            call);
    }
    void *const *streams_of(Pointers streams, const char *call) const {
        if (!streams.size()) return nullptr;
        members(streams.size(), "streams", call);
        return streams.data();
    }

    detail::Handle<tc_local_t, tc_local_free> h_;
    size_t size_ = 0;
};

} // namespace tc

#endif /* TORCHCOMM_HPP */
