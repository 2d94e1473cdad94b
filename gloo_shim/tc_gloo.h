/*
 * tc_gloo.h: the plain C interface of libtorchcomm-gloo.so, the module that
 * carries libtorchcomm's Gloo-backed host backend. libtorchcomm loads it with
 * dlopen on first use of the "gloo" backend, so that programs using only
 * other backends never need Gloo installed.
 *
 * Conventions:
 *  - every function returns TC_GLOO_OK (0) or a TC_GLOO_ERR_* code, and on
 *    failure writes a NUL-terminated message into err[0..errlen);
 *  - no C++ exception ever leaves this module;
 *  - sizes are bytes unless a name says elements;
 *  - every collective takes a tag that must be the same on all ranks and
 *    unique among the operations in flight on the context;
 *  - timeouts are milliseconds and must be positive.
 *
 * SIGPIPE: Gloo writes to sockets without MSG_NOSIGNAL. This module never
 * changes the process-wide SIGPIPE disposition. Instead, it blocks SIGPIPE
 * in the calling thread for the duration of each call (consuming a SIGPIPE
 * that the call itself raised before restoring the caller's mask), and it
 * creates Gloo's network thread with SIGPIPE blocked, so a write to a peer
 * that vanished fails with EPIPE instead of killing the process.
 */
#ifndef TC_GLOO_H
#define TC_GLOO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TC_GLOO_ABI_VERSION 2

#if defined(__GNUC__)
#define TC_GLOO_API __attribute__((visibility("default")))
#else
#define TC_GLOO_API
#endif

enum {
  TC_GLOO_OK = 0,
  TC_GLOO_ERR_TIMEOUT = 1,  /* an operation did not finish in time */
  TC_GLOO_ERR_REMOTE = 2,   /* a peer closed the connection or I/O failed */
  TC_GLOO_ERR_INVALID = 3,  /* arguments Gloo rejected */
  TC_GLOO_ERR_INTERNAL = 4, /* any other exception */
  TC_GLOO_ERR_STORE = 5,    /* the rendezvous store failed */
  TC_GLOO_ABORTED = 6       /* a wait ended by tc_gloo_ubuf_abort_wait_* (not an error) */
};

typedef struct tc_gloo_ctx tc_gloo_ctx;

/* Elementwise c[i] = a[i] (op) b[i] for i < n elements; c may equal a or b. */
typedef void (*tc_gloo_reduce_fn)(void *c, const void *a, const void *b, size_t n);

/* Hands bytes from a store callback back to the module. */
typedef void (*tc_gloo_sink_fn)(void *sink, const void *data, size_t len);

/* Rendezvous store callbacks; each returns 0 on success, or non-zero with a
 * message in err (timeouts: 1, anything else: 2). Only used during
 * tc_gloo_context_new. */
typedef struct tc_gloo_store_vtable {
  void *user;
  int (*set)(void *user, const char *key, const void *data, size_t len, char *err, size_t errlen);
  int (*get)(void *user, const char *key, void *sink, tc_gloo_sink_fn put, char *err, size_t errlen);
  int (*wait)(void *user, const char *const *keys, size_t nkeys, int64_t timeout_ms, char *err,
              size_t errlen);
} tc_gloo_store_vtable;

TC_GLOO_API int tc_gloo_abi_version(void);
/* GLOO_VERSION of the Gloo headers this module was built with (major * 10000 +
 * minor * 100 + patch). Optional for the library: older modules lack it. */
TC_GLOO_API int tc_gloo_version(void);

/* Makes Gloo's network thread of `ctx` run under SCHED_BATCH (batch != 0),
 * whose wake-ups never preempt the thread running on its CPU, or under the
 * default policy again (0); only while the thread runs under one of those
 * two. Cheap when nothing changes; never fails (TC_GLOO_OK, also for a NULL
 * `ctx` or when the thread was not found). Call it from the thread that runs
 * the context's operations, before one (not concurrently with another call
 * on the same context). Optional for the library: older modules lack it. */
TC_GLOO_API int tc_gloo_network_thread_batch(tc_gloo_ctx *ctx, int batch);

/* Connects a full mesh of `size` ranks through the store. `hostname` or
 * `iface` (either may be NULL or empty) select the local address to listen
 * on; with both empty, Gloo resolves this host's name. */
TC_GLOO_API int tc_gloo_context_new(int rank, int size, const tc_gloo_store_vtable *store, int64_t timeout_ms,
                        const char *hostname, const char *iface, tc_gloo_ctx **out, char *err,
                        size_t errlen);
/* Closes every connection: blocked operations (on any thread) fail, and the
 * peers see the connection close. The context stays allocated. */
TC_GLOO_API void tc_gloo_context_close(tc_gloo_ctx *ctx);
TC_GLOO_API void tc_gloo_context_free(tc_gloo_ctx *ctx);

/* The local address ("[ip]:port") of this rank's connection to `peer`, as
 * the peer's Gloo messages name it; NUL-terminated into out[0..outlen). */
TC_GLOO_API int tc_gloo_pair_address(tc_gloo_ctx *ctx, int peer, char *out, size_t outlen, char *err,
                                     size_t errlen);

/* In place: root's buf goes to every rank's buf. */
TC_GLOO_API int tc_gloo_broadcast(tc_gloo_ctx *ctx, void *buf, size_t nbytes, int root, uint32_t tag,
                      int64_t timeout_ms, char *err, size_t errlen);
/* out = reduction of every rank's `in` (NULL: in place on out); count
 * elements of elem_size bytes (1, 2, 4 or 8). */
TC_GLOO_API int tc_gloo_allreduce(tc_gloo_ctx *ctx, const void *in, void *out, size_t count, size_t elem_size,
                      tc_gloo_reduce_fn fn, uint32_t tag, int64_t timeout_ms, char *err,
                      size_t errlen);
/* Like allreduce, result on root only; `out` is scratch on other ranks and
 * must always hold count elements. */
TC_GLOO_API int tc_gloo_reduce(tc_gloo_ctx *ctx, const void *in, void *out, size_t count, size_t elem_size,
                   int root, tc_gloo_reduce_fn fn, uint32_t tag, int64_t timeout_ms, char *err,
                   size_t errlen);
/* out holds size * nbytes; rank r's block at r * nbytes. in == NULL: the
 * caller already placed its block in out. */
TC_GLOO_API int tc_gloo_allgather(tc_gloo_ctx *ctx, const void *in, void *out, size_t nbytes, uint32_t tag,
                      int64_t timeout_ms, char *err, size_t errlen);
/* out holds sum(bytes); rank r contributes bytes[r] from in. */
TC_GLOO_API int tc_gloo_allgatherv(tc_gloo_ctx *ctx, const void *in, void *out, const size_t *bytes,
                       uint32_t tag, int64_t timeout_ms, char *err, size_t errlen);
/* Root's out (size * nbytes) receives every rank's in (nbytes). */
TC_GLOO_API int tc_gloo_gather(tc_gloo_ctx *ctx, const void *in, void *out, size_t nbytes, int root,
                   uint32_t tag, int64_t timeout_ms, char *err, size_t errlen);
/* Root's ins[r] (nbytes each) goes to rank r's out. ins is ignored elsewhere. */
TC_GLOO_API int tc_gloo_scatter(tc_gloo_ctx *ctx, const void *const *ins, void *out, size_t nbytes, int root,
                    uint32_t tag, int64_t timeout_ms, char *err, size_t errlen);
/* in and out hold size * nbytes, distinct. */
TC_GLOO_API int tc_gloo_alltoall(tc_gloo_ctx *ctx, const void *in, void *out, size_t nbytes, uint32_t tag,
                     int64_t timeout_ms, char *err, size_t errlen);
/* in_bytes[r] bytes go to rank r, out_bytes[r] come from rank r; in and out
 * distinct, blocks contiguous in rank order. */
TC_GLOO_API int tc_gloo_alltoallv(tc_gloo_ctx *ctx, const void *in, const size_t *in_bytes, void *out,
                      const size_t *out_bytes, uint32_t tag, int64_t timeout_ms, char *err,
                      size_t errlen);
TC_GLOO_API int tc_gloo_barrier(tc_gloo_ctx *ctx, uint32_t tag, int64_t timeout_ms, char *err, size_t errlen);

/* One point-to-point transfer of a batch. */
typedef struct tc_gloo_transfer {
  int peer;
  int is_send;
  void *buf;
  size_t nbytes;
  uint64_t slot; /* matched with the peer's transfer of the same slot */
} tc_gloo_transfer;

/* Posts every transfer, then waits for all of them until timeout. On
 * failure, *failed_peer (if not NULL) names the peer of the transfer that
 * failed, or -1. Sizes must agree with the peer's (a mismatch kills the
 * receiving process inside Gloo): agree on them first. */
TC_GLOO_API int tc_gloo_p2p(tc_gloo_ctx *ctx, const tc_gloo_transfer *ops, size_t n, int64_t timeout_ms,
                int *failed_peer, char *err, size_t errlen);

/* Unbound buffers (Gloo's transport::UnboundBuffer) over `size` bytes at
 * `ptr`, for one-sided windows: transfers are matched by (peer, slot) in
 * posting order; a send completes once the receiver posted a matching
 * receive and the bytes were written to the socket. `ptr` must stay valid
 * until the buffer is freed. A Gloo timeout in a wait closes every
 * connection of the context (Gloo's behaviour): wait with timeout_ms <= 0
 * (no timeout) where a peer may legitimately stay silent, and stop such a
 * wait with tc_gloo_ubuf_abort_wait_recv/send. Several threads may use
 * different buffers of one context at once. */
typedef struct tc_gloo_ubuf tc_gloo_ubuf;

TC_GLOO_API int tc_gloo_ubuf_new(tc_gloo_ctx *ctx, void *ptr, size_t size, tc_gloo_ubuf **out, char *err,
                                 size_t errlen);
/* Pending operations on the buffer are dropped (Gloo holds weak references). */
TC_GLOO_API void tc_gloo_ubuf_free(tc_gloo_ubuf *buf);
/* Posts a send of bytes [offset, offset + nbytes) to `peer`. */
TC_GLOO_API int tc_gloo_ubuf_send(tc_gloo_ubuf *buf, int peer, uint64_t slot, size_t offset, size_t nbytes,
                                  char *err, size_t errlen);
/* Posts a receive into [offset, offset + nbytes) from `peer`; the sender's
 * byte count must not exceed nbytes (a larger one kills this process inside
 * Gloo): agree on sizes first. */
TC_GLOO_API int tc_gloo_ubuf_recv(tc_gloo_ubuf *buf, int peer, uint64_t slot, size_t offset, size_t nbytes,
                                  char *err, size_t errlen);
/* Like tc_gloo_ubuf_recv from whichever of srcs[0..nsrcs) sends first;
 * srcs == NULL means every other rank. */
TC_GLOO_API int tc_gloo_ubuf_recv_any(tc_gloo_ubuf *buf, const int *srcs, size_t nsrcs, uint64_t slot,
                                      size_t offset, size_t nbytes, char *err, size_t errlen);
/* Waits for one posted operation to complete: TC_GLOO_OK with the peer in
 * *peer (if not NULL), TC_GLOO_ABORTED after an abort, or an error (a
 * failed connection: TC_GLOO_ERR_REMOTE; the timeout: TC_GLOO_ERR_TIMEOUT,
 * after which the context's connections are closed). */
TC_GLOO_API int tc_gloo_ubuf_wait_send(tc_gloo_ubuf *buf, int64_t timeout_ms, int *peer, char *err,
                                       size_t errlen);
TC_GLOO_API int tc_gloo_ubuf_wait_recv(tc_gloo_ubuf *buf, int64_t timeout_ms, int *peer, char *err,
                                       size_t errlen);
/* Ends the current (or the next) wait on the buffer with TC_GLOO_ABORTED;
 * callable from any thread. The posted operation itself stays posted. */
TC_GLOO_API void tc_gloo_ubuf_abort_wait_send(tc_gloo_ubuf *buf);
TC_GLOO_API void tc_gloo_ubuf_abort_wait_recv(tc_gloo_ubuf *buf);

#ifdef __cplusplus
}
#endif

#endif /* TC_GLOO_H */
