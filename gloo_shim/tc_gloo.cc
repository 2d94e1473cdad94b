// libtorchcomm-gloo.so: a C interface over Gloo's TCP transport for
// libtorchcomm's host backend. See tc_gloo.h for the contract. Every entry
// point runs its body through `guarded`, which catches every exception
// (Gloo's EnforceNotMet derives only from std::exception, so nothing less
// than `catch (...)` is enough) and turns it into a code and a message.
//
// What no guard here can catch: an exception Gloo throws on its own network
// thread (the device loop), which terminates the process. The one callers
// can provoke is a message larger than the receive posted for its slot
// (transport/tcp/pair.cc, `op.preamble.length <= op.nbytes`), when ranks
// call different collectives. The Rust side keeps such messages from ever
// matching: each collective's tag carries a hash of its signature (see
// `tag_salt` in src/backends/gloo/mod.rs), and point-to-point sizes and
// the v-variants' counts are agreed before any transfer.

#include "tc_gloo.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

struct tc_gloo_ctx {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  // The thread that runs the device's event loop (0: not found), and
  // whether it was last set to SCHED_BATCH (tc_gloo_network_thread_batch).
  pid_t loop_tid = 0;
  std::atomic<int> batch{0};
};

struct tc_gloo_ubuf {
  std::unique_ptr<gloo::transport::UnboundBuffer> buf;
  int rank;
  int size;
};

namespace {

using Millis = std::chrono::milliseconds;

// A failure of one of the store callbacks, kept apart from Gloo's errors.
struct StoreFailure : std::runtime_error {
  int code;
  StoreFailure(int code, const std::string &msg) : std::runtime_error(msg), code(code) {}
};

// Blocks SIGPIPE in the calling thread for the guard's lifetime. A SIGPIPE
// raised by this thread meanwhile is consumed before the old mask returns,
// so it is never delivered to the host application.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock &) = delete;
  SigpipeBlock &operator=(const SigpipeBlock &) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// Finds the thread that runs a device's event loop: the handler of an
// eventfd made readable runs there. Both handler signatures are declared
// (Gloo's changed), without `override`, so that either header builds.
class LoopThreadProbe : public gloo::transport::tcp::Handler {
 public:
  explicit LoopThreadProbe(int fd) : fd_(fd) {}
  void handleEvents(int /*events*/) { record(); }
  void handleEvents(gloo::transport::tcp::Loop & /*loop*/, int /*events*/) { record(); }

  // The loop thread's id once its handler ran, 0 after `limit` without.
  pid_t wait(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, limit, [&] { return tid_ != 0; });
    return tid_;
  }

 private:
  void record() {
    uint64_t n;
    if (::read(fd_, &n, sizeof(n)) < 0) return;
    std::lock_guard<std::mutex> lock(m_);
    tid_ = static_cast<pid_t>(syscall(SYS_gettid));
    cv_.notify_all();
  }

  int fd_;
  std::mutex m_;
  std::condition_variable cv_;
  pid_t tid_ = 0;
};

// The id of the thread that runs `device`'s event loop; 0 when it cannot be
// found (within 5 s). Never throws: a failure here only leaves the thread's
// policy alone.
pid_t loop_thread_of(const std::shared_ptr<gloo::transport::Device> &device) {
  auto tcp = std::dynamic_pointer_cast<gloo::transport::tcp::Device>(device);
  if (!tcp) return 0;
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return 0;
  auto *probe = new LoopThreadProbe(fd);
  try {
    tcp->registerDescriptor(fd, EPOLLIN, probe);
  } catch (...) {
    delete probe;
    ::close(fd);
    return 0;
  }
  uint64_t one = 1;
  pid_t tid = ::write(fd, &one, sizeof(one)) == sizeof(one)
                  ? probe->wait(std::chrono::milliseconds(5000))
                  : 0;
  try {
    // Returns once the loop no longer runs the handler.
    tcp->unregisterDescriptor(fd, probe);
  } catch (...) {
    // The loop may still hold the handler: it stays, with its descriptor.
    return tid;
  }
  delete probe;
  ::close(fd);
  return tid;
}

void put_error(char *err, size_t errlen, const std::string &msg) {
  if (err == nullptr || errlen == 0) return;
  size_t n = std::min(msg.size(), errlen - 1);
  memcpy(err, msg.data(), n);
  err[n] = '\0';
}

std::string lower(std::string s) {
  for (auto &c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}

bool mentions_timeout(const std::string &msg) {
  auto l = lower(msg);
  return l.find("timed out") != std::string::npos || l.find("timeout") != std::string::npos;
}

bool mentions_connection(const std::string &msg) {
  auto l = lower(msg);
  return l.find("closed") != std::string::npos || l.find("connection") != std::string::npos ||
         l.find("connect") != std::string::npos || l.find("socket") != std::string::npos ||
         l.find("read error") != std::string::npos || l.find("write error") != std::string::npos ||
         l.find("broken pipe") != std::string::npos || l.find("reset") != std::string::npos;
}

int classify(const std::string &msg, int fallback) {
  if (mentions_timeout(msg)) return TC_GLOO_ERR_TIMEOUT;
  if (mentions_connection(msg)) return TC_GLOO_ERR_REMOTE;
  return fallback;
}

// Runs `body`, turning every exception into a code and a message.
template <class F>
int guarded(char *err, size_t errlen, F &&body) {
  SigpipeBlock block;
  try {
    body();
    return TC_GLOO_OK;
  } catch (const StoreFailure &e) {
    put_error(err, errlen, std::string("rendezvous store: ") + e.what());
    return e.code == 1 ? TC_GLOO_ERR_TIMEOUT : TC_GLOO_ERR_STORE;
  } catch (const gloo::IoException &e) {
    put_error(err, errlen, e.what());
    return mentions_timeout(e.what()) ? TC_GLOO_ERR_TIMEOUT : TC_GLOO_ERR_REMOTE;
  } catch (const gloo::InvalidOperationException &e) {
    put_error(err, errlen, e.what());
    return TC_GLOO_ERR_INVALID;
  } catch (const gloo::Exception &e) {
    put_error(err, errlen, e.what());
    return classify(e.what(), TC_GLOO_ERR_REMOTE);
  } catch (const gloo::EnforceNotMet &e) {
    put_error(err, errlen, e.what());
    return classify(e.what(), TC_GLOO_ERR_INTERNAL);
  } catch (const std::bad_alloc &) {
    put_error(err, errlen, "out of memory");
    return TC_GLOO_ERR_INTERNAL;
  } catch (const std::exception &e) {
    put_error(err, errlen, e.what());
    return classify(e.what(), TC_GLOO_ERR_INTERNAL);
  } catch (...) {
    put_error(err, errlen, "unknown exception");
    return TC_GLOO_ERR_INTERNAL;
  }
}

// gloo::rendezvous::Store over the Rust store's callbacks.
class CallbackStore : public gloo::rendezvous::Store {
 public:
  CallbackStore(const tc_gloo_store_vtable &vt, Millis timeout) : vt_(vt), timeout_(timeout) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    char err[512] = {0};
    int rc = vt_.set(vt_.user, key.c_str(), data.data(), data.size(), err, sizeof(err));
    if (rc != 0) throw StoreFailure(rc, "set '" + key + "': " + err);
  }

  std::vector<char> get(const std::string &key) override {
    char err[512] = {0};
    std::vector<char> value;
    int rc = vt_.get(vt_.user, key.c_str(), &value, &CallbackStore::sink, err, sizeof(err));
    if (rc != 0) throw StoreFailure(rc, "get '" + key + "': " + err);
    return value;
  }

  void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string> &keys, const Millis &timeout) override {
    std::vector<const char *> ptrs;
    ptrs.reserve(keys.size());
    for (const auto &k : keys) ptrs.push_back(k.c_str());
    char err[512] = {0};
    Millis t = timeout.count() > 0 ? timeout : timeout_;
    int rc = vt_.wait(vt_.user, ptrs.data(), ptrs.size(), t.count(), err, sizeof(err));
    if (rc != 0) throw StoreFailure(rc, std::string("wait: ") + err);
  }

 private:
  static void sink(void *target, const void *data, size_t len) {
    auto *v = static_cast<std::vector<char> *>(target);
    const char *p = static_cast<const char *>(data);
    v->assign(p, p + len);
  }

  tc_gloo_store_vtable vt_;
  Millis timeout_;
};

// Calls f with a value whose type is an unsigned integer of `size` bytes, so
// that Gloo's templated setters get the right element size.
template <class F>
void with_element(size_t size, F &&f) {
  switch (size) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(uint64_t{}); break;
    default: throw std::invalid_argument("element size must be 1, 2, 4 or 8, not " + std::to_string(size));
  }
}

Millis to_millis(int64_t ms) { return Millis(ms > 0 ? ms : 1); }

void check_ctx(tc_gloo_ctx *ctx) {
  if (ctx == nullptr || !ctx->context) throw std::invalid_argument("NULL gloo context");
}

uint8_t *bytes(const void *p) { return static_cast<uint8_t *>(const_cast<void *>(p)); }

}  // namespace

extern "C" {

int tc_gloo_abi_version(void) { return TC_GLOO_ABI_VERSION; }

int tc_gloo_version(void) { return GLOO_VERSION; }

int tc_gloo_context_new(int rank, int size, const tc_gloo_store_vtable *store, int64_t timeout_ms,
                        const char *hostname, const char *iface, tc_gloo_ctx **out, char *err,
                        size_t errlen) {
  if (out != nullptr) *out = nullptr;
  return guarded(err, errlen, [&] {
    if (store == nullptr || out == nullptr || store->set == nullptr || store->get == nullptr ||
        store->wait == nullptr)
      throw std::invalid_argument("NULL store callbacks or output");
    if (size < 1 || rank < 0 || rank >= size) throw std::invalid_argument("rank outside the world");
    gloo::transport::tcp::attr attr;
    if (hostname != nullptr && hostname[0] != '\0') attr.hostname = hostname;
    if (iface != nullptr && iface[0] != '\0') attr.iface = iface;
    // SIGPIPE is blocked in this thread here (guarded), so Gloo's network
    // thread, created with the device, inherits a mask that blocks it.
    auto handle = std::make_unique<tc_gloo_ctx>();
    handle->device = gloo::transport::tcp::CreateDevice(attr);
    handle->loop_tid = loop_thread_of(handle->device);
    handle->context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    handle->context->setTimeout(to_millis(timeout_ms));
    CallbackStore cs(*store, to_millis(timeout_ms));
    handle->context->connectFullMesh(cs, handle->device);
    *out = handle.release();
  });
}

int tc_gloo_network_thread_batch(tc_gloo_ctx *ctx, int batch) {
  if (ctx == nullptr || ctx->loop_tid == 0) return TC_GLOO_OK;
  batch = batch != 0;
  if (ctx->batch.exchange(batch) == batch) return TC_GLOO_OK;
  // Only between the two policies this module sets: one the application
  // chose for the thread stays.
  int now = sched_getscheduler(ctx->loop_tid);
  if (now != SCHED_OTHER && now != SCHED_BATCH) return TC_GLOO_OK;
  sched_param param{};
  sched_setscheduler(ctx->loop_tid, batch ? SCHED_BATCH : SCHED_OTHER, &param);
  return TC_GLOO_OK;
}

void tc_gloo_context_close(tc_gloo_ctx *ctx) {
  char err[64];
  guarded(err, sizeof(err), [&] {
    if (ctx != nullptr && ctx->context) ctx->context->closeConnections();
  });
}

void tc_gloo_context_free(tc_gloo_ctx *ctx) {
  char err[64];
  guarded(err, sizeof(err), [&] { delete ctx; });
}

int tc_gloo_pair_address(tc_gloo_ctx *ctx, int peer, char *out, size_t outlen, char *err,
                         size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    if (peer < 0 || peer >= ctx->context->size || peer == ctx->context->rank)
      throw std::invalid_argument("peer " + std::to_string(peer) + " is not another rank");
    auto &pair = ctx->context->getPair(peer);
    if (!pair) throw std::invalid_argument("no connection to rank " + std::to_string(peer));
    put_error(out, outlen, pair->address().str());
  });
}

int tc_gloo_broadcast(tc_gloo_ctx *ctx, void *buf, size_t nbytes, int root, uint32_t tag,
                      int64_t timeout_ms, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    gloo::BroadcastOptions opts(ctx->context);
    opts.setOutput<uint8_t>(bytes(buf), nbytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::broadcast(opts);
  });
}

int tc_gloo_allreduce(tc_gloo_ctx *ctx, const void *in, void *out, size_t count, size_t elem_size,
                      tc_gloo_reduce_fn fn, uint32_t tag, int64_t timeout_ms, char *err,
                      size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    if (fn == nullptr) throw std::invalid_argument("NULL reduce function");
    with_element(elem_size, [&](auto zero) {
      using T = decltype(zero);
      gloo::AllreduceOptions opts(ctx->context);
      opts.setOutput<T>(static_cast<T *>(out), count);
      if (in != nullptr && in != out) opts.setInput<T>(static_cast<T *>(const_cast<void *>(in)), count);
      opts.setReduceFunction([fn](void *c, const void *a, const void *b, size_t n) { fn(c, a, b, n); });
      opts.setTag(tag);
      opts.setTimeout(to_millis(timeout_ms));
      gloo::allreduce(opts);
    });
  });
}

int tc_gloo_reduce(tc_gloo_ctx *ctx, const void *in, void *out, size_t count, size_t elem_size,
                   int root, tc_gloo_reduce_fn fn, uint32_t tag, int64_t timeout_ms, char *err,
                   size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    if (fn == nullptr) throw std::invalid_argument("NULL reduce function");
    with_element(elem_size, [&](auto zero) {
      using T = decltype(zero);
      gloo::ReduceOptions opts(ctx->context);
      opts.setOutput<T>(static_cast<T *>(out), count);
      if (in != nullptr && in != out) opts.setInput<T>(static_cast<T *>(const_cast<void *>(in)), count);
      opts.setRoot(root);
      opts.setReduceFunction([fn](void *c, const void *a, const void *b, size_t n) { fn(c, a, b, n); });
      opts.setTag(tag);
      opts.setTimeout(to_millis(timeout_ms));
      gloo::reduce(opts);
    });
  });
}

int tc_gloo_allgather(tc_gloo_ctx *ctx, const void *in, void *out, size_t nbytes, uint32_t tag,
                      int64_t timeout_ms, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    gloo::AllgatherOptions opts(ctx->context);
    if (in != nullptr) opts.setInput<uint8_t>(bytes(in), nbytes);
    opts.setOutput<uint8_t>(bytes(out), nbytes * ctx->context->size);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::allgather(opts);
  });
}

int tc_gloo_allgatherv(tc_gloo_ctx *ctx, const void *in, void *out, const size_t *sizes,
                       uint32_t tag, int64_t timeout_ms, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    if (sizes == nullptr) throw std::invalid_argument("NULL sizes");
    std::vector<size_t> counts(sizes, sizes + ctx->context->size);
    gloo::AllgathervOptions opts(ctx->context);
    opts.setInput<uint8_t>(bytes(in), counts[ctx->context->rank]);
    opts.setOutput<uint8_t>(bytes(out), counts);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::allgatherv(opts);
  });
}

int tc_gloo_gather(tc_gloo_ctx *ctx, const void *in, void *out, size_t nbytes, int root,
                   uint32_t tag, int64_t timeout_ms, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    gloo::GatherOptions opts(ctx->context);
    opts.setInput<uint8_t>(bytes(in), nbytes);
    if (ctx->context->rank == root) opts.setOutput<uint8_t>(bytes(out), nbytes * ctx->context->size);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::gather(opts);
  });
}

int tc_gloo_scatter(tc_gloo_ctx *ctx, const void *const *ins, void *out, size_t nbytes, int root,
                    uint32_t tag, int64_t timeout_ms, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    gloo::ScatterOptions opts(ctx->context);
    if (ctx->context->rank == root) {
      if (ins == nullptr) throw std::invalid_argument("NULL inputs on the root");
      std::vector<uint8_t *> ptrs;
      for (int r = 0; r < ctx->context->size; r++) ptrs.push_back(bytes(ins[r]));
      opts.setInputs<uint8_t>(ptrs, nbytes);
    }
    opts.setOutput<uint8_t>(bytes(out), nbytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::scatter(opts);
  });
}

int tc_gloo_alltoall(tc_gloo_ctx *ctx, const void *in, void *out, size_t nbytes, uint32_t tag,
                     int64_t timeout_ms, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    gloo::AlltoallOptions opts(ctx->context);
    opts.setInput<uint8_t>(bytes(in), nbytes * ctx->context->size);
    opts.setOutput<uint8_t>(bytes(out), nbytes * ctx->context->size);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::alltoall(opts);
  });
}

int tc_gloo_alltoallv(tc_gloo_ctx *ctx, const void *in, const size_t *in_bytes, void *out,
                      const size_t *out_bytes, uint32_t tag, int64_t timeout_ms, char *err,
                      size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    if (in_bytes == nullptr || out_bytes == nullptr) throw std::invalid_argument("NULL sizes");
    const int n = ctx->context->size;
    std::vector<int64_t> ins(in_bytes, in_bytes + n), outs(out_bytes, out_bytes + n);
    gloo::AlltoallvOptions opts(ctx->context);
    opts.setInput<uint8_t>(bytes(in), ins);
    opts.setOutput<uint8_t>(bytes(out), outs);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::alltoallv(opts);
  });
}

int tc_gloo_barrier(tc_gloo_ctx *ctx, uint32_t tag, int64_t timeout_ms, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    gloo::BarrierOptions opts(ctx->context);
    opts.setTag(tag);
    opts.setTimeout(to_millis(timeout_ms));
    gloo::barrier(opts);
  });
}

int tc_gloo_p2p(tc_gloo_ctx *ctx, const tc_gloo_transfer *ops, size_t n, int64_t timeout_ms,
                int *failed_peer, char *err, size_t errlen) {
  if (failed_peer != nullptr) *failed_peer = -1;
  size_t current = 0;
  int rc = guarded(err, errlen, [&] {
    check_ctx(ctx);
    if (n > 0 && ops == nullptr) throw std::invalid_argument("NULL transfers");
    const auto deadline = std::chrono::steady_clock::now() + to_millis(timeout_ms);
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
    bufs.reserve(n);
    for (current = 0; current < n; current++) {
      const auto &op = ops[current];
      if (op.peer < 0 || op.peer >= ctx->context->size || op.peer == ctx->context->rank)
        throw std::invalid_argument("peer " + std::to_string(op.peer) + " is not another rank");
      bufs.push_back(ctx->context->createUnboundBuffer(op.buf, op.nbytes));
      if (op.is_send)
        bufs.back()->send(op.peer, op.slot, 0, op.nbytes);
      else
        bufs.back()->recv(op.peer, op.slot, 0, op.nbytes);
    }
    for (current = 0; current < n; current++) {
      auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
      if (left.count() < 1) left = Millis(1);
      bool ok = ops[current].is_send ? bufs[current]->waitSend(nullptr, left)
                                     : bufs[current]->waitRecv(nullptr, left);
      if (!ok) throw gloo::IoException("transfer aborted");
    }
  });
  if (rc != TC_GLOO_OK && failed_peer != nullptr && ops != nullptr && current < n)
    *failed_peer = ops[current].peer;
  return rc;
}

int tc_gloo_ubuf_new(tc_gloo_ctx *ctx, void *ptr, size_t size, tc_gloo_ubuf **out, char *err,
                     size_t errlen) {
  if (out != nullptr) *out = nullptr;
  return guarded(err, errlen, [&] {
    check_ctx(ctx);
    if (out == nullptr) throw std::invalid_argument("NULL output");
    auto handle = std::make_unique<tc_gloo_ubuf>();
    handle->buf = ctx->context->createUnboundBuffer(ptr, size);
    handle->rank = ctx->context->rank;
    handle->size = ctx->context->size;
    *out = handle.release();
  });
}

void tc_gloo_ubuf_free(tc_gloo_ubuf *buf) {
  char err[64];
  guarded(err, sizeof(err), [&] { delete buf; });
}

namespace {

void check_ubuf(tc_gloo_ubuf *buf) {
  if (buf == nullptr || !buf->buf) throw std::invalid_argument("NULL gloo unbound buffer");
}

// Gloo enforces these too, but by an exception thrown after part of the
// operation's state may be set up; refuse them first.
void check_range(tc_gloo_ubuf *buf, size_t offset, size_t nbytes) {
  if (offset > buf->buf->size || nbytes > buf->buf->size - offset)
    throw std::invalid_argument("range [" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                                ") outside the buffer of " + std::to_string(buf->buf->size) + " bytes");
}

void check_peer(tc_gloo_ubuf *buf, int peer) {
  if (peer < 0 || peer >= buf->size || peer == buf->rank)
    throw std::invalid_argument("peer " + std::to_string(peer) + " is not another rank");
}

// Gloo's "no timeout" is its context default; a wait that may last as long
// as the application is silent uses ten years instead.
Millis wait_millis(int64_t ms) { return ms > 0 ? Millis(ms) : Millis(int64_t{10} * 365 * 24 * 3600 * 1000); }

}  // namespace

int tc_gloo_ubuf_send(tc_gloo_ubuf *buf, int peer, uint64_t slot, size_t offset, size_t nbytes, char *err,
                      size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ubuf(buf);
    check_peer(buf, peer);
    check_range(buf, offset, nbytes);
    buf->buf->send(peer, slot, offset, nbytes);
  });
}

int tc_gloo_ubuf_recv(tc_gloo_ubuf *buf, int peer, uint64_t slot, size_t offset, size_t nbytes, char *err,
                      size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ubuf(buf);
    check_peer(buf, peer);
    check_range(buf, offset, nbytes);
    buf->buf->recv(peer, slot, offset, nbytes);
  });
}

int tc_gloo_ubuf_recv_any(tc_gloo_ubuf *buf, const int *srcs, size_t nsrcs, uint64_t slot, size_t offset,
                          size_t nbytes, char *err, size_t errlen) {
  return guarded(err, errlen, [&] {
    check_ubuf(buf);
    check_range(buf, offset, nbytes);
    std::vector<int> ranks;
    if (srcs == nullptr) {
      for (int r = 0; r < buf->size; r++)
        if (r != buf->rank) ranks.push_back(r);
    } else {
      for (size_t i = 0; i < nsrcs; i++) {
        check_peer(buf, srcs[i]);
        ranks.push_back(srcs[i]);
      }
    }
    if (ranks.empty()) throw std::invalid_argument("no source ranks");
    buf->buf->recv(ranks, slot, offset, nbytes);
  });
}

int tc_gloo_ubuf_wait_send(tc_gloo_ubuf *buf, int64_t timeout_ms, int *peer, char *err, size_t errlen) {
  bool done = false;
  int rc = guarded(err, errlen, [&] {
    check_ubuf(buf);
    done = buf->buf->waitSend(peer, wait_millis(timeout_ms));
  });
  return rc == TC_GLOO_OK && !done ? TC_GLOO_ABORTED : rc;
}

int tc_gloo_ubuf_wait_recv(tc_gloo_ubuf *buf, int64_t timeout_ms, int *peer, char *err, size_t errlen) {
  bool done = false;
  int rc = guarded(err, errlen, [&] {
    check_ubuf(buf);
    done = buf->buf->waitRecv(peer, wait_millis(timeout_ms));
  });
  return rc == TC_GLOO_OK && !done ? TC_GLOO_ABORTED : rc;
}

void tc_gloo_ubuf_abort_wait_send(tc_gloo_ubuf *buf) {
  char err[64];
  guarded(err, sizeof(err), [&] {
    if (buf != nullptr && buf->buf) buf->buf->abortWaitSend();
  });
}

void tc_gloo_ubuf_abort_wait_recv(tc_gloo_ubuf *buf) {
  char err[64];
  guarded(err, sizeof(err), [&] {
    if (buf != nullptr && buf->buf) buf->buf->abortWaitRecv();
  });
}

}  // extern "C"
