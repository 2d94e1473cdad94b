// torch.distributed's "torchcomm" backend in C++: a c10d::Backend whose host
// (CPU) operations call libtorchcomm's C API directly, and whose Work follows
// the library's work handles (isCompleted, isSuccess, exception, wait,
// getFuture). The comm itself, the store bridge and everything this file
// does not run (CUDA tensors, sparse tensors, dtypes or shapes it does not
// take, monitored_barrier, split, abort, shutdown) stay with the Python
// backend of torchcomm/distributed.py, which this backend wraps and calls
// for them (torchcomm/distributed.py builds and registers it).
//
// The library's functions are not linked: Python hands over their addresses
// in the libtorchcomm it loaded (bind_library), so that the comm handle it
// passes belongs to the same copy of the library.
//
// One translation unit; scripts/build-torch-ext.sh compiles it.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "torchcomm.h"

namespace py = pybind11;

namespace torchcomm_ext {

// ---------------------------------------------------------------- C API

#define TC_FUNCS(X)                                                           \
  X(tc_all_reduce)                                                            \
  X(tc_broadcast)                                                             \
  X(tc_reduce)                                                                \
  X(tc_all_gather)                                                            \
  X(tc_all_gather_single)                                                     \
  X(tc_reduce_scatter)                                                        \
  X(tc_reduce_scatter_single)                                                 \
  X(tc_all_to_all)                                                            \
  X(tc_all_to_all_single)                                                     \
  X(tc_all_to_all_v_single)                                                   \
  X(tc_gather)                                                                \
  X(tc_scatter)                                                               \
  X(tc_barrier)                                                               \
  X(tc_send)                                                                  \
  X(tc_recv)                                                                  \
  X(tc_batch_begin)                                                           \
  X(tc_batch_send_tagged)                                                     \
  X(tc_batch_recv_tagged)                                                     \
  X(tc_batch_issue)                                                           \
  X(tc_batch_free)                                                            \
  X(tc_work_status)                                                           \
  X(tc_work_source)                                                           \
  X(tc_work_wait)                                                             \
  X(tc_work_free)                                                             \
  X(tc_last_error)                                                            \
  X(tc_result_string)

struct Api {
#define TC_FIELD(f) decltype(&::f) f = nullptr;
  TC_FUNCS(TC_FIELD)
#undef TC_FIELD
};

Api api;
std::atomic<bool> api_bound{false};

std::vector<std::string> needed_symbols() {
  return {
#define TC_NAME(f) #f,
      TC_FUNCS(TC_NAME)
#undef TC_NAME
  };
}

void bind_library(const std::map<std::string, uintptr_t>& addresses) {
  Api a;
#define TC_BIND(f)                                                          \
  {                                                                         \
    auto it = addresses.find(#f);                                           \
    TORCH_CHECK(                                                            \
        it != addresses.end() && it->second != 0,                           \
        "torchcomm C++ backend: bind_library: no address for " #f);         \
    a.f = reinterpret_cast<decltype(&::f)>(it->second);                     \
  }
  TC_FUNCS(TC_BIND)
#undef TC_BIND
  api = a;
  api_bound = true;
}

const char* error_name(tc_result_t rc) {
  switch (rc) {
    case TC_ERR_NULL_ARGUMENT: return "TC_ERR_NULL_ARGUMENT";
    case TC_ERR_INVALID_ARGUMENT: return "TC_ERR_INVALID_ARGUMENT";
    case TC_ERR_INVALID_USAGE: return "TC_ERR_INVALID_USAGE";
    case TC_ERR_UNSUPPORTED: return "TC_ERR_UNSUPPORTED";
    case TC_ERR_UNAVAILABLE: return "TC_ERR_UNAVAILABLE";
    case TC_ERR_TIMEOUT: return "TC_ERR_TIMEOUT";
    case TC_ERR_REMOTE: return "TC_ERR_REMOTE";
    case TC_ERR_ABORTED: return "TC_ERR_ABORTED";
    case TC_ERR_CUDA: return "TC_ERR_CUDA";
    case TC_ERR_NCCL: return "TC_ERR_NCCL";
    case TC_ERR_SYSTEM: return "TC_ERR_SYSTEM";
    case TC_ERR_INTERNAL: return "TC_ERR_INTERNAL";
    case TC_ERR_PANIC: return "TC_ERR_PANIC";
    case TC_ERR_BUFFER_TOO_SMALL: return "TC_ERR_BUFFER_TOO_SMALL";
    case TC_ERR_NOT_FOUND: return "TC_ERR_NOT_FOUND";
    case TC_ERR_OUT_OF_MEMORY: return "TC_ERR_OUT_OF_MEMORY";
    default: return "TC_ERR_?";
  }
}

// The failure of library call `call` (or of the operation a work handle
// follows) that returned `rc`, with this thread's detail, as the Python
// binding words it: "CALL: TC_ERR_NAME (text): detail". A timeout says
// "operation timeout reached": torch's backends word timeouts so, and
// programs and torch's tests match " timeout ".
std::string error_text(const char* call, tc_result_t rc) {
  const char* detail = api.tc_last_error ? api.tc_last_error() : nullptr;
  const char* text = rc == TC_ERR_TIMEOUT ? "operation timeout reached"
      : api.tc_result_string              ? api.tc_result_string(rc)
                                          : nullptr;
  return c10::str(
      "torchcomm backend: ",
      call,
      ": ",
      error_name(rc),
      " (",
      text ? text : "?",
      "): ",
      detail ? detail : "");
}

[[noreturn]] void fail(const char* call, tc_result_t rc) {
  C10_THROW_ERROR(DistBackendError, error_text(call, rc));
}

void check(tc_result_t rc, const char* call) {
  if (rc != TC_SUCCESS) {
    fail(call, rc);
  }
}

tc_op_options_t op_options(bool async, std::chrono::milliseconds timeout) {
  tc_op_options_t o = TC_OP_OPTIONS_INIT;
  o.async_op = async ? 1 : 0;
  o.timeout_ms = timeout.count() > 0 ? timeout.count() : TC_UNSET;
  return o;
}

// A torch dtype as the library's; false when it has none.
bool dtype_of(at::ScalarType s, tc_dtype_t* out) {
  switch (s) {
    case at::kFloat: *out = TC_FLOAT32; return true;
    case at::kDouble: *out = TC_FLOAT64; return true;
    case at::kHalf: *out = TC_FLOAT16; return true;
    case at::kBFloat16: *out = TC_BFLOAT16; return true;
    case at::kChar: *out = TC_INT8; return true;
    case at::kByte: *out = TC_UINT8; return true;
    case at::kInt: *out = TC_INT32; return true;
    case at::kLong: *out = TC_INT64; return true;
    case at::kBool: *out = TC_BOOL; return true;
    case at::kUInt32: *out = TC_UINT32; return true;
    case at::kUInt64: *out = TC_UINT64; return true;
    default: return false;
  }
}

// torch's ReduceOp as the library's; false when this file does not take it
// (a PREMUL_SUM whose factor is a tensor outside host memory).
bool redop_of(const c10d::ReduceOp& op, tc_reduce_op_t* out) {
  *out = tc_reduce_op_t{TC_SUM, 1.0, nullptr};
  switch (op.op_) {
    case c10d::ReduceOp::SUM: out->kind = TC_SUM; return true;
    case c10d::ReduceOp::PRODUCT: out->kind = TC_PRODUCT; return true;
    case c10d::ReduceOp::MIN: out->kind = TC_MIN; return true;
    case c10d::ReduceOp::MAX: out->kind = TC_MAX; return true;
    case c10d::ReduceOp::BAND: out->kind = TC_BAND; return true;
    case c10d::ReduceOp::BOR: out->kind = TC_BOR; return true;
    case c10d::ReduceOp::BXOR: out->kind = TC_BXOR; return true;
    case c10d::ReduceOp::AVG: out->kind = TC_AVG; return true;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      if (s == nullptr) {
        return false;
      }
      out->kind = TC_PREMUL_SUM;
      if (s->tensor_factor.defined()) {
        if (!s->tensor_factor.device().is_cpu()) {
          return false;
        }
        out->premul_factor = s->tensor_factor.item<double>();
      } else {
        out->premul_factor = s->double_factor;
      }
      return true;
    }
    default:
      return false;
  }
}

// A tensor this file runs on: dense, contiguous, in host memory, of a dtype
// the library has.
bool host(const at::Tensor& t) {
  tc_dtype_t dt;
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
      t.is_contiguous() && !t.is_complex() && dtype_of(t.scalar_type(), &dt);
}

bool all_host(const std::vector<at::Tensor>& ts) {
  if (ts.empty()) {
    return false;
  }
  for (const auto& t : ts) {
    if (!host(t)) {
      return false;
    }
  }
  return true;
}

// `ts` are host tensors of `like`'s dtype with `count` elements each.
bool same(const std::vector<at::Tensor>& ts, const at::Tensor& like, int64_t count) {
  for (const auto& t : ts) {
    if (!host(t) || t.scalar_type() != like.scalar_type() || t.numel() != count) {
      return false;
    }
  }
  return true;
}

tc_dtype_t dt(const at::Tensor& t) {
  tc_dtype_t d = TC_FLOAT32;
  dtype_of(t.scalar_type(), &d);
  return d;
}

std::vector<void*> ptrs(const std::vector<at::Tensor>& ts) {
  std::vector<void*> p;
  p.reserve(ts.size());
  for (const auto& t : ts) {
    p.push_back(t.data_ptr());
  }
  return p;
}

// ---------------------------------------------------------------- works

class TcWork;

// One thread per backend that completes the futures of works in issue order
// (a comm's operations complete in order), so that DDP's reducer and comm
// hooks see their futures done without anyone polling. The futures'
// callbacks run on it one at a time. It also waits for the operations of
// works dropped before they finished, keeping their tensors alive until
// then. It holds no reference to its backend and ends when the backend
// does, after the works queued before.
class Completer : public std::enable_shared_from_this<Completer> {
 public:
  // Queues `work` (its future completed, or its operations waited for);
  // false once stopped: the caller does it.
  bool enqueue(c10::intrusive_ptr<TcWork> work);
  bool on_thread() const {
    return started_.load() && thread_id_.load() == std::this_thread::get_id();
  }
  void stop() {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    cv_.notify_all();
  }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<TcWork>> queue_;
  bool stop_ = false;
  std::atomic<bool> started_{false};
  std::atomic<std::thread::id> thread_id_{};
};

// The Work of a delegated (Python) operation: wait() and getFuture() go to
// its C++ side; isCompleted(), isSuccess() and exception() to the Python
// object's methods (which torch's own holder of Python works does not
// forward).
class PyWorkRef : public c10d::Work {
 public:
  PyWorkRef(c10::intrusive_ptr<c10d::Work> work, py::object obj)
      : work_(std::move(work)), obj_(std::move(obj)) {}

  ~PyWorkRef() override {
    if (!Py_IsInitialized()) {
      (void)obj_.release();
      (void)work_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    work_.reset();
    obj_ = py::object();
  }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return obj_.attr("is_completed")().cast<bool>();
  }

  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return obj_.attr("is_success")().cast<bool>();
  }

  std::exception_ptr exception() const override {
    py::gil_scoped_acquire gil;
    py::object e = obj_.attr("exception")();
    if (e.is_none()) {
      return nullptr;
    }
    return std::make_exception_ptr(
        c10::DistBackendError(
            {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
            py::str(e).cast<std::string>()));
  }

  bool wait(std::chrono::milliseconds timeout) override {
    return work_->wait(timeout);
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return work_->getFuture();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object obj_;
};

class TcWork : public c10d::Work {
 public:
  TcWork(
      int rank,
      c10d::OpType type,
      std::vector<at::Tensor> outputs,
      std::shared_ptr<Completer> completer)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        completer_(std::move(completer)) {}

  ~TcWork() override {
    if (!done_.load(std::memory_order_acquire) && !handles_.empty()) {
      // Dropped before its operations finished: they still write the
      // tensors, so a copy of the work keeps those until they have.
      auto orphan = c10::make_intrusive<TcWork>(rank_, retrieveOpType(), std::vector<at::Tensor>{}, nullptr);
      orphan->handles_.swap(handles_);
      orphan->keep_.swap(keep_);
      orphan->keep(outputs_);
      if (!completer_ || !completer_->enqueue(orphan)) {
        orphan->finish();
      }
    }
    for (tc_work_t* h : handles_) {
      api.tc_work_free(h);
    }
  }

  // Set-up, before the work is handed out.
  void add(tc_work_t* h) {
    handles_.push_back(h);
  }
  void add(c10::intrusive_ptr<c10d::Work> w) {
    delegated_.push_back(std::move(w));
  }
  void keep(const at::Tensor& t) {
    keep_.push_back(t);
  }
  void keep(const std::vector<at::Tensor>& ts) {
    keep_.insert(keep_.end(), ts.begin(), ts.end());
  }
  void mark_done() {
    done_ = true;
  }

  bool isCompleted() override {
    if (done_.load(std::memory_order_acquire)) {
      return true;
    }
    for (tc_work_t* h : handles_) {
      int32_t s = TC_WORK_IN_PROGRESS;
      if (api.tc_work_status(h, &s) == TC_SUCCESS &&
          (s == TC_WORK_NOT_STARTED || s == TC_WORK_IN_PROGRESS)) {
        return false;
      }
    }
    for (auto& w : delegated_) {
      if (!w->isCompleted()) {
        return false;
      }
    }
    finish();  // every part has finished: collects their outcome at once
    return true;
  }

  bool isSuccess() const override {
    return done_.load(std::memory_order_acquire) && !error_;
  }

  std::exception_ptr exception() const override {
    return done_.load(std::memory_order_acquire) ? error_ : nullptr;
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  // The sender of a receive (torch's `work._source_rank()`, and `dist.recv`
  // without `src`): what the library tells of its one handle, once the
  // work completed.
  int sourceRank() const override {
    TORCH_CHECK(
        done_.load(std::memory_order_acquire) && handles_.size() == 1,
        "torchcomm backend: sourceRank: the receive has not completed (wait for it first)");
    int32_t r = -1;
    tc_result_t rc = api.tc_work_source(handles_[0], &r);
    if (rc != TC_SUCCESS) {
      C10_THROW_ERROR(DistBackendError, error_text("tc_work_source", rc));
    }
    return r;
  }

  void synchronize() override {}

  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout.count() > 0 && !done_.load(std::memory_order_acquire)) {
      auto deadline = std::chrono::steady_clock::now() + timeout;
      auto pause = std::chrono::microseconds(1);
      while (!isCompleted()) {
        if (std::chrono::steady_clock::now() >= deadline) {
          C10_THROW_ERROR(
              DistBackendError,
              c10::str(
                  "torchcomm backend: wait: ",
                  c10d::opTypeToString(retrieveOpType()),
                  " not completed within ",
                  timeout.count(),
                  " ms"));
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    }
    finish();
    if (error_) {
      std::rethrow_exception(error_);
    }
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    bool watch = false;
    {
      std::lock_guard<std::mutex> g(future_mu_);
      if (future_) {
        return future_;
      }
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()));
      watch = !done_.load(std::memory_order_acquire) && completer_ &&
          !completer_->on_thread();
    }
    if (!watch || !completer_->enqueue(c10::intrusive_ptr<TcWork>::reclaim_copy(this))) {
      // Done already, or asked from the completer's own thread (a future's
      // callback asking for another, as PowerSGD's does): completed here,
      // still in issue order.
      complete_future();
    }
    return future_;
  }

  // Waits for every part once (concurrent callers wait for the first);
  // remembers the first failure.
  void finish() {
    std::lock_guard<std::mutex> g(wait_mu_);
    if (done_.load(std::memory_order_acquire)) {
      return;
    }
    std::exception_ptr err;
    for (tc_work_t* h : handles_) {
      tc_result_t rc = api.tc_work_wait(h, nullptr);
      if (rc != TC_SUCCESS && !err) {
        err = std::make_exception_ptr(c10::DistBackendError(
            {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
            error_text(c10d::opTypeToString(retrieveOpType()).c_str(), rc)));
      }
    }
    for (auto& w : delegated_) {
      try {
        w->wait(kNoTimeout);
      } catch (...) {
        if (!err) {
          err = std::current_exception();
        }
      }
    }
    error_ = err;
    done_.store(true, std::memory_order_release);
  }

  // Finishes; completes the future if there is one (once; its callbacks
  // run here, with no lock held).
  void complete_future() {
    finish();
    c10::intrusive_ptr<c10::ivalue::Future> future;
    {
      std::lock_guard<std::mutex> g(future_mu_);
      if (!future_ || future_completing_) {
        return;
      }
      future_completing_ = true;
      future = future_;
    }
    if (error_) {
      future->setError(error_);
    } else {
      future->markCompleted(c10::IValue(outputs_));
    }
  }

 private:
  std::vector<tc_work_t*> handles_;
  std::vector<c10::intrusive_ptr<c10d::Work>> delegated_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;  // inputs, alive until the work is dropped
  std::shared_ptr<Completer> completer_;
  std::mutex wait_mu_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool future_completing_ = false;
};

bool Completer::enqueue(c10::intrusive_ptr<TcWork> work) {
  std::lock_guard<std::mutex> g(mu_);
  if (stop_) {
    return false;
  }
  queue_.push_back(std::move(work));
  if (!started_.load()) {
    started_ = true;
    std::thread([self = shared_from_this()] { self->run(); }).detach();
  }
  cv_.notify_one();
  return true;
}

void Completer::run() {
  thread_id_ = std::this_thread::get_id();
  for (;;) {
    c10::intrusive_ptr<TcWork> work;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;  // stopped, nothing left
      }
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      work->complete_future();
    } catch (const std::exception& e) {
      TORCH_WARN("torchcomm backend: completing a future: ", e.what());
    }
  }
}

// ---------------------------------------------------------------- backend

class TcBackend : public c10d::Backend {
 public:
  // `py_backend`: the Python backend (torchcomm.distributed.TorchCommBackend)
  // that owns the comms; `comm`: its host comm's tc_comm_t; `wrap`: the
  // Python function that makes one of these over a Python backend (split).
  TcBackend(
      py::object py_backend,
      uintptr_t comm,
      int rank,
      int size,
      std::chrono::milliseconds timeout,
      py::object wrap)
      : c10d::Backend(rank, size),
        py_(std::move(py_backend)),
        wrap_(std::move(wrap)),
        comm_(reinterpret_cast<tc_comm_t*>(comm)),
        completer_(std::make_shared<Completer>()),
        options_(c10::make_intrusive<Options>("torchcomm", timeout)) {
    TORCH_CHECK(api_bound.load(), "torchcomm C++ backend: bind_library was not called");
    TORCH_CHECK(comm != 0, "torchcomm C++ backend: 'comm' is NULL");
  }

  ~TcBackend() override {
    completer_->stop();
    if (!Py_IsInitialized()) {
      (void)py_.release();
      (void)wrap_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    py_ = py::object();
    wrap_ = py::object();
  }

  const std::string getBackendName() const override {
    return "torchcomm";
  }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    return options_;
  }

  bool supportsSplitting() const override {
    return true;
  }

  bool supportsCoalescing() const override {
    return true;
  }

  // ---- collectives

  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override {
    tc_reduce_op_t op;
    if (all_host(tensors) && redop_of(opts.reduceOp, &op) &&
        !opts.sparseIndices.has_value()) {
      if (tensors.size() == 1) {
        at::Tensor& t = tensors[0];
        return run(c10d::OpType::ALLREDUCE, tensors, {}, opts.asyncOp, opts.timeout, "tc_all_reduce",
                   [&](const tc_op_options_t* o, tc_work_t** w) {
                     return api.tc_all_reduce(comm(), t.data_ptr(), t.numel(), dt(t), op, o, w);
                   });
      }
      return many(c10d::OpType::ALLREDUCE, tensors, {}, opts.timeout, tensors.size(), "tc_all_reduce",
                  [&](size_t i, const tc_op_options_t* o, tc_work_t** w) {
                    at::Tensor& t = tensors[i];
                    return api.tc_all_reduce(comm(), t.data_ptr(), t.numel(), dt(t), op, o, w);
                  });
    }
    return delegate("allreduce", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    tc_reduce_op_t op;
    if (all_host(tensors) && redop_of(opts.reduceOp, &op)) {
      return many(c10d::OpType::ALLREDUCE_COALESCED, tensors, {}, opts.timeout, tensors.size(),
                  "tc_all_reduce", [&](size_t i, const tc_op_options_t* o, tc_work_t** w) {
                    at::Tensor& t = tensors[i];
                    return api.tc_all_reduce(comm(), t.data_ptr(), t.numel(), dt(t), op, o, w);
                  });
    }
    return delegate("allreduce_coalesced", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override {
    if (opts.rootTensor >= 0 && opts.rootTensor < static_cast<int64_t>(tensors.size()) &&
        host(tensors[opts.rootTensor])) {
      at::Tensor& t = tensors[opts.rootTensor];
      int root = static_cast<int>(opts.rootRank);
      return run(c10d::OpType::BROADCAST, tensors, {}, opts.asyncOp, opts.timeout, "tc_broadcast",
                 [&](const tc_op_options_t* o, tc_work_t** w) {
                   return api.tc_broadcast(comm(), t.data_ptr(), t.numel(), dt(t), root, o, w);
                 });
    }
    return delegate("broadcast", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override {
    tc_reduce_op_t op;
    if (opts.rootTensor >= 0 && opts.rootTensor < static_cast<int64_t>(tensors.size()) &&
        host(tensors[opts.rootTensor]) && redop_of(opts.reduceOp, &op)) {
      at::Tensor& t = tensors[opts.rootTensor];
      int root = static_cast<int>(opts.rootRank);
      return run(c10d::OpType::REDUCE, tensors, {}, opts.asyncOp, opts.timeout, "tc_reduce",
                 [&](const tc_op_options_t* o, tc_work_t** w) {
                   return api.tc_reduce(comm(), t.data_ptr(), t.numel(), dt(t), root, op, o, w);
                 });
    }
    return delegate("reduce", tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    bool ok = all_host(inputs) && outputs.size() == inputs.size();
    for (size_t i = 0; ok && i < inputs.size(); i++) {
      ok = outputs[i].size() == static_cast<size_t>(getSize()) &&
          same(outputs[i], inputs[i], inputs[i].numel());
    }
    if (ok) {
      std::vector<at::Tensor> flat = flatten(outputs);
      return many(c10d::OpType::ALLGATHER, flat, inputs, opts.timeout, inputs.size(), "tc_all_gather",
                  [&](size_t i, const tc_op_options_t* o, tc_work_t** w) {
                    auto p = ptrs(outputs[i]);
                    at::Tensor& in = inputs[i];
                    return api.tc_all_gather(comm(), p.data(), in.data_ptr(), in.numel(), dt(in), o, w);
                  });
    }
    return delegate("allgather", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    // outputs[r][k] receives rank r's inputs[k].
    bool ok = all_host(inputs) && outputs.size() == static_cast<size_t>(getSize());
    for (size_t r = 0; ok && r < outputs.size(); r++) {
      ok = outputs[r].size() == inputs.size();
      for (size_t k = 0; ok && k < inputs.size(); k++) {
        ok = same({outputs[r][k]}, inputs[k], inputs[k].numel());
      }
    }
    if (ok) {
      std::vector<at::Tensor> flat = flatten(outputs);
      return many(c10d::OpType::ALLGATHER_COALESCED, flat, inputs, opts.timeout, inputs.size(),
                  "tc_all_gather", [&](size_t k, const tc_op_options_t* o, tc_work_t** w) {
                    std::vector<void*> p;
                    for (auto& row : outputs) {
                      p.push_back(row[k].data_ptr());
                    }
                    at::Tensor& in = inputs[k];
                    return api.tc_all_gather(comm(), p.data(), in.data_ptr(), in.numel(), dt(in), o, w);
                  });
    }
    return delegate("allgather_coalesced", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override {
    if (host(input) && same({output}, input, input.numel() * getSize())) {
      return run(c10d::OpType::_ALLGATHER_BASE, {output}, {input}, opts.asyncOp, opts.timeout,
                 "tc_all_gather_single", [&](const tc_op_options_t* o, tc_work_t** w) {
                   return api.tc_all_gather_single(comm(), output.data_ptr(), input.data_ptr(),
                                                   input.numel(), dt(input), o, w);
                 });
    }
    return delegate("all_gather_single", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::AllgatherOptions& opts) override {
    return all_gather_single(output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    bool ok = all_host(inputs) && outputs.size() == inputs.size();
    for (size_t i = 0; ok && i < inputs.size(); i++) {
      ok = same({outputs[i]}, inputs[i], inputs[i].numel() * getSize());
    }
    if (ok) {
      return many(c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, outputs, inputs, opts.timeout,
                  inputs.size(), "tc_all_gather_single",
                  [&](size_t i, const tc_op_options_t* o, tc_work_t** w) {
                    return api.tc_all_gather_single(comm(), outputs[i].data_ptr(), inputs[i].data_ptr(),
                                                    inputs[i].numel(), dt(inputs[i]), o, w);
                  });
    }
    return delegate("all_gather_single_coalesced", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return all_gather_single_coalesced(outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    tc_reduce_op_t op;
    bool ok = all_host(outputs) && inputs.size() == outputs.size() && redop_of(opts.reduceOp, &op);
    for (size_t i = 0; ok && i < outputs.size(); i++) {
      ok = inputs[i].size() == static_cast<size_t>(getSize()) &&
          same(inputs[i], outputs[i], outputs[i].numel());
    }
    if (ok) {
      return many(c10d::OpType::REDUCE_SCATTER, outputs, flatten(inputs), opts.timeout, outputs.size(),
                  "tc_reduce_scatter", [&](size_t i, const tc_op_options_t* o, tc_work_t** w) {
                    auto p = ptrs(inputs[i]);
                    std::vector<const void*> cp(p.begin(), p.end());
                    at::Tensor& out = outputs[i];
                    return api.tc_reduce_scatter(comm(), out.data_ptr(), cp.data(), out.numel(), dt(out), op,
                                                 o, w);
                  });
    }
    return delegate("reduce_scatter", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override {
    tc_reduce_op_t op;
    if (host(output) && same({input}, output, output.numel() * getSize()) &&
        redop_of(opts.reduceOp, &op)) {
      return run(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {input}, opts.asyncOp, opts.timeout,
                 "tc_reduce_scatter_single", [&](const tc_op_options_t* o, tc_work_t** w) {
                   return api.tc_reduce_scatter_single(comm(), output.data_ptr(), input.data_ptr(),
                                                       output.numel(), dt(output), op, o, w);
                 });
    }
    return delegate("reduce_scatter_single", output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output,
      at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override {
    return reduce_scatter_single(output, input, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    tc_reduce_op_t op;
    bool ok = all_host(outputs) && inputs.size() == outputs.size() && redop_of(opts.reduceOp, &op);
    for (size_t i = 0; ok && i < outputs.size(); i++) {
      ok = same({inputs[i]}, outputs[i], outputs[i].numel() * getSize());
    }
    if (ok) {
      return many(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs, inputs, opts.timeout,
                  outputs.size(), "tc_reduce_scatter_single",
                  [&](size_t i, const tc_op_options_t* o, tc_work_t** w) {
                    return api.tc_reduce_scatter_single(comm(), outputs[i].data_ptr(), inputs[i].data_ptr(),
                                                        outputs[i].numel(), dt(outputs[i]), op, o, w);
                  });
    }
    return delegate("reduce_scatter_single_coalesced", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return reduce_scatter_single_coalesced(outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> all_to_all_single(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& output_splits,
      std::vector<int64_t>& input_splits,
      const c10d::AllToAllOptions& opts) override {
    const int64_t n = getSize();
    if (host(input) && host(output) && input.scalar_type() == output.scalar_type()) {
      if (output_splits.empty() && input_splits.empty()) {
        if (output.numel() == input.numel() && input.numel() % n == 0) {
          return run(c10d::OpType::ALLTOALL_BASE, {output}, {input}, opts.asyncOp, opts.timeout,
                     "tc_all_to_all_single", [&](const tc_op_options_t* o, tc_work_t** w) {
                       return api.tc_all_to_all_single(comm(), output.data_ptr(), input.data_ptr(),
                                                       input.numel() / n, dt(input), o, w);
                     });
        }
      } else {
        auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits,
                          std::vector<size_t>* out) {
          int64_t rows = t.dim() ? t.size(0) : 0;
          int64_t row = rows ? t.numel() / rows : 0;
          std::vector<int64_t> s = splits;
          if (s.empty()) {
            s.assign(n, rows / n);
          }
          if (static_cast<int64_t>(s.size()) != n) {
            return false;
          }
          int64_t total = 0;
          for (int64_t x : s) {
            if (x < 0) {
              return false;
            }
            out->push_back(static_cast<size_t>(x * row));
            total += x * row;
          }
          return total == t.numel();
        };
        auto oc = std::make_shared<std::vector<size_t>>();
        auto ic = std::make_shared<std::vector<size_t>>();
        if (counts(output, output_splits, oc.get()) && counts(input, input_splits, ic.get())) {
          return run(c10d::OpType::ALLTOALL_BASE, {output}, {input}, opts.asyncOp, opts.timeout,
                     "tc_all_to_all_v_single", [&](const tc_op_options_t* o, tc_work_t** w) {
                       return api.tc_all_to_all_v_single(comm(), output.data_ptr(), oc->data(),
                                                         input.data_ptr(), ic->data(), dt(input), o, w);
                     });
        }
      }
    }
    return delegate("all_to_all_single", output, input, output_splits, input_splits, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& output_splits,
      std::vector<int64_t>& input_splits,
      const c10d::AllToAllOptions& opts) override {
    return all_to_all_single(output, input, output_splits, input_splits, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override {
    if (all_host(inputs) && inputs.size() == static_cast<size_t>(getSize()) &&
        outputs.size() == inputs.size() && same(inputs, inputs[0], inputs[0].numel()) &&
        same(outputs, inputs[0], inputs[0].numel())) {
      return run(c10d::OpType::ALLTOALL, outputs, inputs, opts.asyncOp, opts.timeout, "tc_all_to_all",
                 [&](const tc_op_options_t* o, tc_work_t** w) {
                   auto op = ptrs(outputs);
                   auto ip = ptrs(inputs);
                   std::vector<const void*> cip(ip.begin(), ip.end());
                   return api.tc_all_to_all(comm(), op.data(), cip.data(), inputs[0].numel(), dt(inputs[0]),
                                            o, w);
                 });
    }
    // Sizes that differ per peer: the Python backend's batch of sends and
    // receives.
    return delegate("alltoall", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override {
    int root = static_cast<int>(opts.rootRank);
    bool on_root = getRank() == root;
    bool ok = inputs.size() == 1 && host(inputs[0]);
    if (ok && on_root) {
      ok = outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()) &&
          same(outputs[0], inputs[0], inputs[0].numel());
    }
    if (ok) {
      std::vector<at::Tensor> outs = on_root ? outputs[0] : std::vector<at::Tensor>{};
      return run(c10d::OpType::GATHER, outs, inputs, opts.asyncOp, opts.timeout, "tc_gather",
                 [&](const tc_op_options_t* o, tc_work_t** w) {
                   auto p = ptrs(outs);
                   at::Tensor& in = inputs[0];
                   return api.tc_gather(comm(), on_root ? p.data() : nullptr, in.data_ptr(), in.numel(), dt(in),
                                        root, o, w);
                 });
    }
    return delegate("gather", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override {
    int root = static_cast<int>(opts.rootRank);
    bool on_root = getRank() == root;
    bool ok = outputs.size() == 1 && host(outputs[0]);
    if (ok && on_root) {
      ok = inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()) &&
          same(inputs[0], outputs[0], outputs[0].numel());
    }
    if (ok) {
      std::vector<at::Tensor> ins = on_root ? inputs[0] : std::vector<at::Tensor>{};
      return run(c10d::OpType::SCATTER, outputs, ins, opts.asyncOp, opts.timeout, "tc_scatter",
                 [&](const tc_op_options_t* o, tc_work_t** w) {
                   auto p = ptrs(ins);
                   std::vector<const void*> cp(p.begin(), p.end());
                   at::Tensor& out = outputs[0];
                   return api.tc_scatter(comm(), out.data_ptr(), on_root ? cp.data() : nullptr, out.numel(),
                                         dt(out), root, o, w);
                 });
    }
    return delegate("scatter", outputs, inputs, opts);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return run(c10d::OpType::BARRIER, {}, {}, opts.asyncOp, opts.timeout, "tc_barrier",
               [&](const tc_op_options_t* o, tc_work_t** w) { return api.tc_barrier(comm(), o, w); });
  }

  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    seq_++;
    py::gil_scoped_acquire gil;
    py_.attr("monitored_barrier")(opts, wait_all_ranks);
  }

  // ---- point to point (always asynchronous: torch waits on the work)

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return p2p(true, tensors, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return p2p(false, tensors, src, tag);
  }

  // On host tensors the library's receive from TC_ANY_SOURCE (its work
  // tells the sender); anything else goes to the Python backend.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    if (coalescing_) {
      TORCH_CHECK(false, "torchcomm backend: a receive from any source cannot be coalesced "
                         "(batch_isend_irecv, _coalescing_manager): issue it alone");
    }
    return p2p(false, tensors, TC_ANY_SOURCE, tag);
  }

  // ---- coalescing (batch_isend_irecv, _coalescing_manager)

  void startCoalescing() override {
    TORCH_CHECK(!coalescing_, "torchcomm backend: startCoalescing: coalescing already started");
    coalescing_ = true;
    py_coalescing_ = false;
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    TORCH_CHECK(coalescing_, "torchcomm backend: endCoalescing: coalescing was not started");
    coalescing_ = false;
    std::vector<tc_work_t*> handles;
    std::vector<P2p> p2ps;
    std::vector<at::Tensor> keep;
    handles.swap(co_handles_);
    p2ps.swap(co_p2p_);
    keep.swap(co_keep_);
    auto work = c10::make_intrusive<TcWork>(getRank(), c10d::OpType::COALESCED, std::vector<at::Tensor>{},
                                            completer_);
    for (tc_work_t* h : handles) {
      work->add(h);
    }
    work->keep(keep);
    if (!p2ps.empty()) {
      tc_batch_t* batch = nullptr;
      check(api.tc_batch_begin(comm(), &batch), "tc_batch_begin");
      tc_result_t rc = TC_SUCCESS;
      const char* call = "tc_batch_issue";
      for (const P2p& p : p2ps) {
        if (p.send) {
          rc = api.tc_batch_send_tagged(batch, p.t.data_ptr(), p.t.numel(), dt(p.t), p.peer, p.tag);
          call = "tc_batch_send_tagged";
        } else {
          rc = api.tc_batch_recv_tagged(batch, p.t.data_ptr(), p.t.numel(), dt(p.t), p.peer, p.tag);
          call = "tc_batch_recv_tagged";
        }
        if (rc != TC_SUCCESS) {
          break;
        }
        work->keep(p.t);
      }
      tc_work_t* h = nullptr;
      if (rc == TC_SUCCESS) {
        tc_op_options_t o = op_options(true, c10d::kUnsetTimeout);
        rc = api.tc_batch_issue(batch, &o, &h);
        call = "tc_batch_issue";
      }
      if (rc != TC_SUCCESS) {
        std::string msg = error_text(call, rc);
        api.tc_batch_free(batch);
        C10_THROW_ERROR(DistBackendError, msg);
      }
      api.tc_batch_free(batch);
      work->add(h);
    }
    if (py_coalescing_) {
      py_coalescing_ = false;
      work->add(python_work("end_coalescing"));
    }
    return work;
  }

  // ---- groups and lifetime

  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      const c10::intrusive_ptr<Options>& opts) override {
    py::gil_scoped_acquire gil;
    py::object child = py_.attr("split")(store, ranks, opts);
    if (child.is_none()) {
      return {};
    }
    return wrap_(child).cast<c10::intrusive_ptr<c10d::Backend>>();
  }

  // The group's sequence number: how many operations this rank issued on
  // the group (each collective, send and receive counts one, inside a
  // coalesced block too); every rank starts at 0.
  uint64_t getSequenceNumberForGroup() override {
    return seq_.load();
  }

  // torch calls it when it makes a group; numbering starts at 0 already.
  void setSequenceNumberForGroup() override {}

  void setTimeout(std::chrono::milliseconds timeout) override {
    options_->timeout = timeout;
    py::gil_scoped_acquire gil;
    py_.attr("set_timeout")(timeout);
  }

  void abort() override {
    py::gil_scoped_acquire gil;
    py_.attr("abort")();
  }

  void shutdown() override {
    comm_.store(nullptr);
    py::gil_scoped_acquire gil;
    py_.attr("shutdown")();
  }

  py::object python_backend() const {
    return py_;
  }

 private:
  struct P2p {
    bool send;
    at::Tensor t;
    int peer;
    uint32_t tag;
  };

  tc_comm_t* comm() const {
    tc_comm_t* c = comm_.load();
    TORCH_CHECK(c != nullptr, "torchcomm backend: the group was shut down");
    return c;
  }

  static std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<at::Tensor> out;
    for (const auto& l : lists) {
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  }

  // One operation. Blocking (`async` false, not coalescing): the library's
  // blocking call and a completed work; otherwise a work over its handle.
  template <class Issue>
  c10::intrusive_ptr<c10d::Work> run(
      c10d::OpType type,
      std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> inputs,
      bool async,
      std::chrono::milliseconds timeout,
      const char* call,
      Issue issue) {
    seq_++;
    if (coalescing_) {
      tc_op_options_t o = op_options(true, timeout);
      tc_work_t* h = nullptr;
      check(issue(&o, &h), call);
      co_handles_.push_back(h);
      co_keep_.insert(co_keep_.end(), outputs.begin(), outputs.end());
      co_keep_.insert(co_keep_.end(), inputs.begin(), inputs.end());
      return done(type, std::move(outputs));
    }
    if (!async) {
      tc_op_options_t o = op_options(false, timeout);
      check(issue(&o, nullptr), call);
      return done(type, std::move(outputs));
    }
    tc_op_options_t o = op_options(true, timeout);
    tc_work_t* h = nullptr;
    check(issue(&o, &h), call);
    auto work = c10::make_intrusive<TcWork>(getRank(), type, std::move(outputs), completer_);
    work->add(h);
    work->keep(inputs);
    return work;
  }

  // `n` asynchronous operations under one work.
  template <class Issue>
  c10::intrusive_ptr<c10d::Work> many(
      c10d::OpType type,
      std::vector<at::Tensor> outputs,
      std::vector<at::Tensor> inputs,
      std::chrono::milliseconds timeout,
      size_t n,
      const char* call,
      Issue issue) {
    seq_++;
    tc_op_options_t o = op_options(true, timeout);
    if (coalescing_) {
      for (size_t i = 0; i < n; i++) {
        tc_work_t* h = nullptr;
        check(issue(i, &o, &h), call);
        co_handles_.push_back(h);
      }
      co_keep_.insert(co_keep_.end(), outputs.begin(), outputs.end());
      co_keep_.insert(co_keep_.end(), inputs.begin(), inputs.end());
      return done(type, std::move(outputs));
    }
    auto work = c10::make_intrusive<TcWork>(getRank(), type, outputs, completer_);
    work->keep(inputs);
    for (size_t i = 0; i < n; i++) {
      tc_work_t* h = nullptr;
      check(issue(i, &o, &h), call);  // on failure the issued ones are freed with `work`
      work->add(h);
    }
    return work;
  }

  c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, std::vector<at::Tensor> outputs) {
    auto work = c10::make_intrusive<TcWork>(getRank(), type, std::move(outputs), completer_);
    work->mark_done();
    return work;
  }

  c10::intrusive_ptr<c10d::Work> p2p(bool is_send, std::vector<at::Tensor>& tensors, int peer, int tag) {
    if (tensors.size() != 1 || !host(tensors[0])) {
      return delegate(is_send ? "send" : "recv", tensors, peer, tag);
    }
    at::Tensor& t = tensors[0];
    seq_++;
    if (coalescing_) {
      co_p2p_.push_back(P2p{is_send, t, peer, static_cast<uint32_t>(tag)});
      return done(is_send ? c10d::OpType::SEND : c10d::OpType::RECV, tensors);
    }
    tc_op_options_t o = op_options(true, c10d::kUnsetTimeout);
    o.tag = static_cast<uint32_t>(tag);
    tc_work_t* h = nullptr;
    if (is_send) {
      check(api.tc_send(comm(), t.data_ptr(), t.numel(), dt(t), peer, &o, &h), "tc_send");
    } else {
      check(api.tc_recv(comm(), t.data_ptr(), t.numel(), dt(t), peer, &o, &h), "tc_recv");
    }
    auto work = c10::make_intrusive<TcWork>(getRank(), is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                            tensors, completer_);
    work->add(h);
    return work;
  }

  // An operation this file does not run: the Python backend's method of
  // that name (which runs it or raises naming it).
  template <class... A>
  c10::intrusive_ptr<c10d::Work> delegate(const char* method, A&&... args) {
    seq_++;
    return python_work(method, std::forward<A>(args)...);
  }

  // The Python backend's method `method` and the work it returns.
  template <class... A>
  c10::intrusive_ptr<c10d::Work> python_work(const char* method, A&&... args) {
    py::gil_scoped_acquire gil;
    if (coalescing_ && !py_coalescing_) {
      py_.attr("start_coalescing")();
      py_coalescing_ = true;
    }
    py::object o = py_.attr(method)(std::forward<A>(args)...);
    if (o.is_none()) {
      return {};
    }
    auto w = o.cast<c10::intrusive_ptr<c10d::Work>>();
    return c10::make_intrusive<PyWorkRef>(std::move(w), std::move(o));
  }

  py::object py_;
  py::object wrap_;
  std::atomic<tc_comm_t*> comm_;
  std::shared_ptr<Completer> completer_;
  c10::intrusive_ptr<Options> options_;
  std::atomic<uint64_t> seq_{0};
  bool coalescing_ = false;
  bool py_coalescing_ = false;
  std::vector<tc_work_t*> co_handles_;
  std::vector<P2p> co_p2p_;
  std::vector<at::Tensor> co_keep_;
};

}  // namespace torchcomm_ext

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using torchcomm_ext::TcBackend;
  m.doc() = "torch.distributed's torchcomm backend in C++ (torchcomm/distributed.py uses it)";
  m.def("needed_symbols", &torchcomm_ext::needed_symbols,
        "The libtorchcomm functions bind_library needs the addresses of.");
  m.def("bind_library", &torchcomm_ext::bind_library, py::arg("addresses"),
        "Binds the C API: {name: address} of libtorchcomm's functions, as loaded by torchcomm._lib.");
  py::module_::import("torch._C._distributed_c10d");
  py::class_<TcBackend, c10d::Backend, c10::intrusive_ptr<TcBackend>>(m, "CppBackend")
      .def(py::init<py::object, uintptr_t, int, int, std::chrono::milliseconds, py::object>(),
           py::arg("python_backend"), py::arg("comm"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("wrap"))
      .def_property_readonly("python_backend", &TcBackend::python_backend);
}
