/*
 * torchcomm.h: the C API of libtorchcomm.
 * Generated from the Rust sources by cbindgen (`make header`); do not edit.
 *
 * Conventions: every fallible call returns tc_result_t (TC_SUCCESS == 0) and
 * records per-thread detail for tc_last_error(). Out-parameters are written
 * only on success. Destroy/free functions accept NULL. Operations return when
 * enqueued; buffers must stay valid until their work completes. A `const`
 * handle argument means the call does not change the object. Handles are
 * checked on entry: one that is not live (freed or destroyed, of another
 * type, never made by the library) gives TC_ERR_INVALID_ARGUMENT.
 *
 * A collective, or a call built on collectives (coalesced broadcast, reducer
 * set-up, sparse all-reduce, persistent all-gather), that one rank refuses
 * (a bad argument there) fails on every rank: the refusing rank still takes
 * its place in the comm's sequence, and on gloo its peers fail at once with
 * TC_ERR_INVALID_USAGE naming it and the argument (over TCP the comm is then
 * unusable unless every rank refused); on nccl they fail at their timeout,
 * which names it. A refused send or receive fails only its rank. See
 * docs/conventions.md.
 */

#ifndef TORCHCOMM_H
#define TORCHCOMM_H

#include <stddef.h>
#include <stdint.h>
/* Initializers of the versioned option structs: start from these, then set
   the fields you need. Unset fields take the library's defaults. */
#define TC_COMM_OPTIONS_INIT                                                    \
    { sizeof(tc_comm_options_t), TC_COMM_OPTIONS_MAGIC, TC_COMM_OPTIONS_VERSION, \
      NULL, TC_UNSET, TC_UNSET, TC_UNSET, TC_UNSET, NULL, NULL, 0, 0 }
#define TC_OP_OPTIONS_INIT                                                      \
    { sizeof(tc_op_options_t), TC_OP_OPTIONS_MAGIC, TC_OP_OPTIONS_VERSION,      \
      0, TC_UNSET, NULL, NULL, 0, 0 }
#define TC_REDUCER_OPTIONS_INIT                                                 \
    { sizeof(tc_reducer_options_t), TC_REDUCER_OPTIONS_MAGIC,                   \
      TC_REDUCER_OPTIONS_VERSION, 0, 0, 0, NULL }
#define TC_POWERSGD_OPTIONS_INIT                                                \
    { sizeof(tc_powersgd_options_t), TC_POWERSGD_OPTIONS_MAGIC,                 \
      TC_POWERSGD_OPTIONS_VERSION, 1, 1000, 2.0, 0.0, 1, 1, 0, NULL, 0 }
#define TC_LOCAL_OPTIONS_INIT                                                   \
    { sizeof(tc_local_options_t), TC_LOCAL_OPTIONS_MAGIC, TC_LOCAL_OPTIONS_VERSION, \
      TC_UNSET, 0 }
#define TC_STORE_CALLBACKS_INIT                                                 \
    { sizeof(tc_store_callbacks_t), TC_STORE_CALLBACKS_MAGIC,                   \
      TC_STORE_CALLBACKS_VERSION, NULL, NULL, NULL, NULL, NULL, NULL, NULL,     \
      NULL, NULL, NULL, TC_UNSET }
/* A reduce op without a factor: TC_REDUCE_OP(TC_SUM). */
#define TC_REDUCE_OP(kind) { (kind), 1.0, NULL }


#define TC_VERSION_MAJOR 0

#define TC_VERSION_MINOR 1

#define TC_VERSION_PATCH 0

/*
 `tc_op_info_t.phase` of a pre hook's call.
 */
#define TC_HOOK_PRE 0

/*
 `tc_op_info_t.phase` of a post hook's call.
 */
#define TC_HOOK_POST 1

/*
 The `tc_op_info_t.version` this library writes. Later versions only add
 fields at the end (`struct_size` grows); read a field only when
 `struct_size` covers it. Version 2 added `tag`, `input_tags`,
 `output_tags` and `window_offset`.
 */
#define TC_OP_INFO_VERSION 2

#define TC_LOCAL_OPTIONS_MAGIC 1413696591

#define TC_LOCAL_OPTIONS_VERSION 1

/*
 Log levels passed to a log callback (and named by `TORCHCOMM_DEBUG`).
 */
#define TC_LOG_WARN 1

#define TC_LOG_INFO 2

#define TC_LOG_TRACE 3

/*
 `form` of `tc_comm_reconfigure`: the handles are a list, ranked in
 their order.
 */
#define TC_INIT_HANDLES_LIST 0

/*
 `form` of `tc_comm_reconfigure`: the handles are a set, ranked in the
 byte order of their text (the same on every member whatever order each
 passed).
 */
#define TC_INIT_HANDLES_SET 1

#define TC_REDUCER_OPTIONS_MAGIC 1413698116

#define TC_REDUCER_OPTIONS_VERSION 2

#define TC_POWERSGD_OPTIONS_MAGIC 1413697619

#define TC_POWERSGD_OPTIONS_VERSION 1

#define TC_STORE_CALLBACKS_MAGIC 1413698371

#define TC_STORE_CALLBACKS_VERSION 1

/*
 Status values written by `tc_work_status`.
 */
#define TC_WORK_NOT_STARTED 0

#define TC_WORK_IN_PROGRESS 1

#define TC_WORK_COMPLETED 2

#define TC_WORK_TIMED_OUT 3

#define TC_WORK_ERROR 4

/*
 torch's default bucket size of the coalesced forms.
 */
#define DEFAULT_BUCKET_BYTES (10 << 20)

/*
 "Not set" value of integer option fields: the library picks the default.
 */
#define TC_UNSET -1

/*
 The `peer` of a `tc_recv` that takes a message from any other rank
 (as MPI_ANY_SOURCE; see `tc_recv`).
 */
#define TC_ANY_SOURCE -1

#define TC_COMM_OPTIONS_MAGIC 1413697357

/*
 Version 2 added `enable_reconfigure`.
 */
#define TC_COMM_OPTIONS_VERSION 2

#define TC_OP_OPTIONS_MAGIC 1413697360

/*
 Version 2 added `tag`.
 */
#define TC_OP_OPTIONS_VERSION 2

/*
 Longest store token accepted.
 */
#define MAX_TOKEN_LEN 4096

/*
 Limits of torch's libuv server; a request beyond them closes the
 connection. Keys are counted as they travel (torch's leading `/` included).
 */
#define MAX_KEY_LEN (8 * 1024)

#define MAX_VALUE_LEN ((8 * 1024) * 1024)

#define MAX_KEYS_PER_REQUEST (128 * 1024)

/*
 Device kind, the `type` field of `tc_device_t`.
 */
#define TC_DEVICE_CPU 0

#define TC_DEVICE_CUDA 1

/*
 A persistent all-gather made by `tc_all_gather_p_init`.
 */
typedef struct tc_all_gather_p tc_all_gather_p;

/*
 A batch of sends and receives issued together by `tc_batch_issue`.
 Not thread-safe: build a batch from one thread.
 */
typedef struct tc_batch tc_batch;

/*
 A communicator. Operations on one comm may be issued from several threads;
 they run in the order the library received them, so ranks must agree on
 that order (as with NCCL, serialize issuing if threads race).
 */
typedef struct tc_comm tc_comm;

/*
 A device group: CUDA devices (and, where a function allows it, the CPU)
 driven by this one process, with its NCCL communicators once made.

 Conventions of the `tc_local_*` operations:
 - `g` is a group from `tc_local_new`; member i is `devices[i]`.
 - `streams`: NULL (every device's legacy default stream) or an array of
   one `CUstream`/`cudaStream_t` per member (entries of CPU members are
   ignored; a NULL entry is that device's legacy stream); each stream must
   belong to its member's device.
 - Stream ordering: work on device buffers is enqueued on the members'
   streams, after the work already enqueued on them, and the call returns
   without waiting for the device, as torch's functions do; copies
   between devices are ordered with the streams of both devices by
   events. Where a destination is host memory the call returns once the
   data is there (torch's copies to the CPU are blocking too); pageable
   host sources are read during the call, pinned ones when the stream
   reaches the copy (keep them unchanged until then).
 - Errors (`TC_ERR_NULL_ARGUMENT`, `TC_ERR_INVALID_ARGUMENT` naming the
   argument: an index out of range, a buffer on another device than its
   member's, checked with `cuPointerGetAttribute`, overlapping
   destinations, overflowing counts) are found before anything is
   enqueued: nothing is written. NULL buffers are accepted only where
   they hold 0 bytes.
 - Which path ran (NCCL or copies) is logged at `TORCHCOMM_DEBUG=INFO`.
 - Thread-safe: calls on one group may come from several threads; NCCL
   path calls are serialized.
 */
typedef struct tc_local tc_local;

/*
 A gradient reducer (see `tc_reducer_new`). Not thread-safe: call its
 functions from one thread at a time.
 */
typedef struct tc_reducer tc_reducer;

/*
 A key-value store handle. Thread-safe: one handle may be used from several
 threads at once. Comms created with it keep their own reference, so it
 may be freed while they live.
 */
typedef struct tc_store tc_store;

/*
 Where a callback puts its answer: a value (`tc_store_reply_value`) and,
 on failure, a message (`tc_store_reply_error`). Valid only during the
 callback's call, on the thread that called it.
 */
typedef struct tc_store_reply_t tc_store_reply_t;

/*
 A one-sided communication window over a comm.
 */
typedef struct tc_window tc_window;

/*
 The completion handle of one operation. It keeps its communicator alive
 (the comm's memory, not its ability to run operations). A work handle may
 be queried and waited on from several threads at once.
 */
typedef struct tc_work tc_work;

/*
 Result code of every fallible call: `TC_SUCCESS` (0) or a `TC_ERR_*` value.
 */
typedef int32_t tc_result_t;

typedef tc_comm tc_comm_t;

/*
 Element type of a buffer (`TC_FLOAT32`, ...).
 */
typedef int32_t tc_dtype_t;

/*
 A backend hint: a key/value pair of NUL-terminated strings, copied by the
 library during the call that receives it.
 */
typedef struct {
    const char *key;
    const char *value;
} tc_hint_t;

/*
 Options of every operation. Initialize with `TC_OP_OPTIONS_INIT`.
 */
typedef struct {
    /*
     `sizeof(tc_op_options_t)` as the caller compiled it.
     */
    size_t size;
    /*
     Must be `TC_OP_OPTIONS_MAGIC`.
     */
    uint32_t magic;
    /*
     `TC_OP_OPTIONS_VERSION` as the caller compiled it. Fields added after
     that version keep their defaults; a newer version than the library's
     is accepted and its unknown fields ignored; 0 is refused.
     */
    uint32_t version;
    /*
     0: the call returns when the operation is complete (CPU) or enqueued
     on `stream` (CUDA). 1: asynchronous; use the work handle.
     */
    int32_t async_op;
    /*
     Timeout in milliseconds; 0 or `TC_UNSET`: the comm's timeout.
     */
    int64_t timeout_ms;
    /*
     `cudaStream_t`/`CUstream` for CUDA buffers; NULL: the legacy default
     stream. Ignored for host buffers.
     */
    void *stream;
    /*
     Backend hints, copied during the call; NULL when `num_hints` is 0.
     */
    const tc_hint_t *hints;
    size_t num_hints;
    /*
     (Version 2.) Tag of `tc_send`/`tc_recv`: a send matches a receive of
     the same (peer, tag). 0, the default and what version-1 callers get,
     is the tag of every untagged call. Non-zero on any other call:
     `TC_ERR_INVALID_ARGUMENT` (batch entries carry their own, see
     `tc_batch_send_tagged`). On `nccl`, non-zero: `TC_ERR_UNSUPPORTED`.
     */
    uint32_t tag;
} tc_op_options_t;

typedef tc_work tc_work_t;

/*
 A device: `TC_DEVICE_CPU` (index ignored) or `TC_DEVICE_CUDA` with an
 index, -1 meaning local rank % number of visible devices.
 */
typedef struct {
    int32_t type;
    int32_t index;
} tc_device_t;

typedef tc_store tc_store_t;

/*
 Options of `tc_comm_new` and `tc_comm_split`. Initialize with
 `TC_COMM_OPTIONS_INIT`, then set the fields you need.
 */
typedef struct {
    /*
     `sizeof(tc_comm_options_t)` as the caller compiled it.
     */
    size_t size;
    /*
     Must be `TC_COMM_OPTIONS_MAGIC`.
     */
    uint32_t magic;
    /*
     `TC_COMM_OPTIONS_VERSION` as the caller compiled it. Fields added after
     that version keep their defaults; a newer version than the library's
     is accepted and its unknown fields ignored; 0 is refused.
     */
    uint32_t version;
    /*
     Communicator name, unique among the live comms of this process
     (`tc_comm_new` refuses a name in use with `TC_ERR_INVALID_ARGUMENT`;
     `tc_comm_destroy` frees it); keys in the store are scoped by it.
     NULL: a generated name, the first `comm<N>` not in use. Copied during
     the call. `tc_comm_split` takes the name as an argument instead.
     */
    const char *name;
    /*
     Default timeout of every operation, in milliseconds. `TC_UNSET`:
     `TORCHCOMM_TIMEOUT_SECONDS`, else 600 s.
     */
    int64_t timeout_ms;
    /*
     1: abort the process on a timeout or remote failure; 0: abort the
     communicator and fail later calls. `TC_UNSET`: `TORCHCOMM_ABORT_ON_ERROR`,
     else 1.
     */
    int32_t abort_on_error;
    /*
     This process's rank. `TC_UNSET`: from the environment.
     */
    int32_t rank;
    /*
     Number of ranks. `TC_UNSET`: from the environment.
     */
    int32_t world_size;
    /*
     Rendezvous store, borrowed for the call (the comm keeps its own
     reference). NULL: bootstrap from `MASTER_ADDR`/`MASTER_PORT`.
     */
    tc_store_t *store;
    /*
     Backend hints, copied during the call; NULL when `num_hints` is 0.
     */
    const tc_hint_t *hints;
    size_t num_hints;
    /*
     (Version 2.) 1: `tc_comm_new` makes a comm with no members yet, to be
     formed by `tc_comm_reconfigure` (torchcomms' `enable_reconfigure`);
     `rank` and `world_size` are then not the comm's (see
     `tc_comm_reconfigure`). 0, the default and what version-1 callers
     get: a comm formed at creation, which cannot be reconfigured.
     `tc_comm_split` and `tc_comm_shrink` refuse 1.
     */
    int32_t enable_reconfigure;
} tc_comm_options_t;

/*
 Function called when a comm becomes aborted: `code` is the failure's
 result code (`TC_ERR_TIMEOUT`, `TC_ERR_REMOTE`, ... or `TC_ERR_ABORTED`
 for `tc_comm_abort`), `message` its detail, valid only during the call.
 */
typedef void (*tc_abort_hook_t)(tc_result_t code, const char *message, void *user_data);

typedef tc_batch tc_batch_t;

/*
 Reduction kind (`TC_SUM`, ...), the `kind` field of `tc_reduce_op_t`.
 */
typedef int32_t tc_red_kind_t;

/*
 A reduction: its kind and, for `TC_PREMUL_SUM`, the factor.
 */
typedef struct {
    /*
     One of `TC_SUM` ... `TC_AVG`.
     */
    tc_red_kind_t kind;
    /*
     `TC_PREMUL_SUM` factor when `premul_factor_ptr` is NULL.
     */
    double premul_factor;
    /*
     `TC_PREMUL_SUM` factor as one element of the operation's dtype, in
     device memory for CUDA buffers or host memory otherwise; NULL to use
     `premul_factor`.
     */
    const void *premul_factor_ptr;
} tc_reduce_op_t;

/*
 One buffer of an operation, as hooks see it.
 */
typedef struct {
    /*
     The caller's address (a device address for CUDA buffers).
     */
    void *ptr;
    /*
     Elements of `dtype`.
     */
    size_t count;
    tc_dtype_t dtype;
    /*
     The peer of a batch member or of a send/recv (-1, `TC_ANY_SOURCE`,
     on a receive from any source); -1 otherwise.
     */
    int32_t peer;
} tc_op_buffer_t;

/*
 The description of one operation given to a hook. It and everything it
 points to are valid only during the hook's call (copy what you keep).
 Buffers are the caller's addresses (device addresses for CUDA buffers);
 a hook may read a pre hook's inputs and a completed post hook's outputs
 if they are host memory; it must not write them.
 */
typedef struct {
    /*
     `sizeof(tc_op_info_t)` of the library that wrote it.
     */
    size_t struct_size;
    /*
     `TC_OP_INFO_VERSION` of the library that wrote it.
     */
    uint32_t version;
    /*
     `TC_HOOK_PRE` or `TC_HOOK_POST`.
     */
    int phase;
    /*
     The operation's name without `tc_` ("all_reduce", "send",
     "batch_p2p", ...); a static string.
     */
    const char *op_name;
    /*
     The comm's name.
     */
    const char *comm_name;
    /*
     The operation's sequence number on this comm: the number the flight
     recorder shows (`tc_comm_dump_flight_recorder`), from 1; collectives
     issued in the same order have the same numbers on every rank. A
     window call: its number among the comm's window calls, from 1 (not
     in the flight recorder).
     */
    uint64_t seq;
    int rank;
    int size;
    /*
     The element type, or -1 (a barrier; a batch mixing types).
     */
    tc_dtype_t dtype;
    /*
     The root of a rooted collective, else -1.
     */
    int root;
    /*
     The peer of a send or recv, else -1 (a batch's peers are in its
     buffers); `TC_ANY_SOURCE` (also -1) on a receive from any source
     (a pre hook runs before its sender is known).
     */
    int peer;
    /*
     The reduction of a reducing operation; `kind` -1 otherwise.
     */
    tc_reduce_op_t reduce_op;
    /*
     1 when issued with `async_op = 1`.
     */
    int async_op;
    /*
     The buffers the operation reads on this rank (in-place buffers are
     listed as inputs and outputs).
     */
    const tc_op_buffer_t *inputs;
    size_t num_inputs;
    /*
     The buffers it writes on this rank.
     */
    const tc_op_buffer_t *outputs;
    size_t num_outputs;
    /*
     Post hooks: `TC_SUCCESS` or the operation's error code. Pre: 0.
     */
    tc_result_t status;
    /*
     Post hooks: the error's detail (as `tc_last_error` would give it),
     or NULL on success. Pre: NULL.
     */
    const char *message;
    /*
     Post hooks: 1 when the operation finished; 0 when it is a device
     operation only enqueued on its stream. Pre: 0.
     */
    int completed;
    /*
     Version 2. The tag of a send or recv (`opts->tag`, 0 when untagged);
     0 for other operations (a batch's tags are in `input_tags` /
     `output_tags`).
     */
    uint32_t tag;
    /*
     Version 2. Send, recv and batch: `input_tags[i]` is the tag of
     `inputs[i]` (a send) and `output_tags[i]` that of `outputs[i]` (a
     receive). NULL for other operations.
     */
    const uint32_t *input_tags;
    const uint32_t *output_tags;
    /*
     Version 2. A window put or get: the byte offset in the target's
     window (the rank is `peer`, the local buffer and its size in bytes
     the one input of a put or output of a get); 0 otherwise.
     */
    size_t window_offset;
} tc_op_info_t;

/*
 An operation hook: called with the operation's description and the
 `user_data` given at registration; returns nothing.
 */
typedef void (*tc_op_hook_t)(const tc_op_info_t *info, void *user_data);

/*
 Options of `tc_local_new`. Initialize with `TC_LOCAL_OPTIONS_INIT`.
 */
typedef struct {
    /*
     `sizeof(tc_local_options_t)` as the caller compiled it.
     */
    size_t size;
    /*
     Must be `TC_LOCAL_OPTIONS_MAGIC`.
     */
    uint32_t magic;
    /*
     `TC_LOCAL_OPTIONS_VERSION` as the caller compiled it.
     */
    uint32_t version;
    /*
     0: never use NCCL (always the copies path). `TC_UNSET` or 1: NCCL
     where it applies and loads.
     */
    int32_t use_nccl;
    /*
     Bucket size in bytes of the coalesced forms when a call passes 0;
     0: 10 MiB (torch's default).
     */
    size_t bucket_bytes;
} tc_local_options_t;

typedef tc_local tc_local_t;

/*
 A log sink: `level` is `TC_LOG_*`; `message` is valid during the call only.
 */
typedef void (*tc_log_callback_t)(int32_t level, const char *message, void *user_data);

typedef tc_all_gather_p tc_all_gather_p_t;

/*
 Options of `tc_reducer_new`. Initialize with `TC_REDUCER_OPTIONS_INIT`.
 */
typedef struct {
    /*
     `sizeof(tc_reducer_options_t)` as the caller compiled it.
     */
    size_t size;
    /*
     Must be `TC_REDUCER_OPTIONS_MAGIC`.
     */
    uint32_t magic;
    /*
     `TC_REDUCER_OPTIONS_VERSION` as the caller compiled it.
     */
    uint32_t version;
    /*
     Size at which a bucket is closed, in bytes; 0: 25 MiB (DDP's default).
     */
    size_t bucket_cap_bytes;
    /*
     Size at which each dtype's first bucket (the first gradients a
     backward pass produces) is closed; 0: 1 MiB (DDP's default).
     */
    size_t first_bucket_bytes;
    /*
     1: the gradients live in the reducer's buckets (no copy in or out);
     `grads` must then be NULL and `tc_reducer_get_grad` gives each
     gradient's address. 0 (default): the caller's gradient buffers.
     */
    int32_t gradient_as_bucket_view;
    /*
     (Version 2.) CUDA gradients: the stream they are produced on (NULL:
     the legacy default stream). The copies into and out of the buckets
     and the built-in hooks are ordered on it. Ignored for host memory.
     */
    void *stream;
} tc_reducer_options_t;

typedef tc_reducer tc_reducer_t;

/*
 The bucket a hook sees, as c10d's `GradBucket`.
 */
typedef struct {
    /*
     Position of the bucket in launch order, from 0.
     */
    size_t index;
    /*
     Number of buckets of the reducer.
     */
    size_t num_buckets;
    /*
     1 for the last bucket of an iteration, else 0.
     */
    int is_last;
    /*
     The flat buffer holding the bucket's gradients. A hook may point it at
     a buffer of its own (the same element count, any floating-point
     dtype, written in `dtype`) that stays valid until
     `tc_reducer_finalize` returns; the reducer then casts that buffer's
     final contents back into the bucket.
     */
    void *buffer;
    /*
     Number of elements of `buffer`.
     */
    size_t count;
    /*
     Element type of `buffer`.
     */
    tc_dtype_t dtype;
    /*
     Number of gradients in the bucket; the arrays below have this many
     entries and are owned by the reducer.
     */
    size_t num_grads;
    /*
     Index of each gradient in the reducer's list.
     */
    const size_t *grad_indices;
    /*
     Offset of each gradient in the buffer, in elements.
     */
    const size_t *offsets;
    /*
     Number of elements of each gradient.
     */
    const size_t *lengths;
} tc_grad_bucket_t;

/*
 A communication hook: exchanges `bucket` (see `tc_grad_bucket_t`) over
 `comm` and returns the exchange's work in `*work` (which the reducer
 frees). Called from `tc_reducer_mark_ready` or `tc_reducer_finalize`, on
 their thread; it must not call functions of its own reducer: such a call
 fails with `TC_ERR_INVALID_USAGE` (`tc_reducer_free` leaves the reducer as
 it is, with a warning and `tc_last_error` set). Every rank's
 hook must issue the same operations; a hook returning an error without
 issuing them on some ranks leaves the others waiting until the comm's
 timeout.
 */
typedef tc_result_t (*tc_comm_hook_fn)(void *state, tc_comm_t *comm, tc_grad_bucket_t *bucket, tc_work_t **work);

/*
 Built-in communication hook (`tc_reducer_set_builtin_hook`).
 */
typedef int32_t tc_hook_kind_t;

/*
 Parameters of `TC_HOOK_POWERSGD` (`tc_reducer_set_powersgd`), named as
 PyTorch's `PowerSGDState`. Initialize with `TC_POWERSGD_OPTIONS_INIT`,
 which holds PyTorch's defaults.
 */
typedef struct {
    /*
     `sizeof(tc_powersgd_options_t)` as the caller compiled it.
     */
    size_t size;
    /*
     Must be `TC_POWERSGD_OPTIONS_MAGIC`.
     */
    uint32_t magic;
    /*
     `TC_POWERSGD_OPTIONS_VERSION` as the caller compiled it.
     */
    uint32_t version;
    /*
     Rank r of the approximation (at least 1; per gradient at most its
     rows and columns). Default 1.
     */
    size_t matrix_approximation_rank;
    /*
     Iterations exchanged with the plain all-reduce (`TC_HOOK_ALLREDUCE`)
     before compression starts (`start_powerSGD_iter`). Default 1000.
     0 compresses from the first iteration (PyTorch requires at least 2
     with error feedback or warm start, for DDP's bucket rebuild, which
     this reducer does not do).
     */
    uint64_t start_iter;
    /*
     A rows x cols gradient is compressed only when
     (rows + cols) * r * `min_compression_rate` < rows * cols; the others
     are all-reduced as they are. Finite, >= 0. Default 2.
     */
    double min_compression_rate;
    /*
     Added to each column's norm in Gram-Schmidt, in float32: 0, or a
     finite value between float32's smallest (1.4e-45) and largest
     (3.4e38); others are `TC_ERR_INVALID_ARGUMENT`, never rounded to 0
     or inf. Default 0 (a zero column then stays zeros).
     */
    double orthogonalization_epsilon;
    /*
     1: each rank adds its previous compression error to the bucket
     before compressing. Default 1.
     */
    int32_t use_error_feedback;
    /*
     1: Q starts from the previous iteration's Q; 0: from fresh values
     every iteration. Default 1.
     */
    int32_t warm_start;
    /*
     Seed of the starting values of Q, the same on every rank. Default 0.
     */
    uint64_t seed;
    /*
     Leading dimension of each gradient (its shape[0]): gradient i is
     viewed as a `rows[i]` x (counts[i] / `rows[i]`) matrix, so `rows[i]`
     must divide counts[i] (anything for an empty gradient). NULL: every
     gradient is a column (count x 1), as a 1-D tensor is for PyTorch,
     and with the default `min_compression_rate` nothing is compressed.
     Copied during the call. Default NULL.
     */
    const size_t *rows;
    /*
     Entries of `rows`: the reducer's gradient count (0 with NULL).
     */
    size_t num_rows;
} tc_powersgd_options_t;

/*
 A sparse COO tensor, torch's layout: `shape` has `sparse_dim + dense_dim`
 sizes; `indices` holds `sparse_dim` rows of `nnz` indices (row-major, as
 torch's `indices()`); `values` holds `nnz` rows of prod(dense sizes)
 elements of `dtype` (row-major, as torch's `values()`).
 */
typedef struct {
    /*
     Number of sparse dimensions.
     */
    size_t sparse_dim;
    /*
     Number of dense dimensions.
     */
    size_t dense_dim;
    /*
     `sparse_dim + dense_dim` sizes.
     */
    const int64_t *shape;
    /*
     Number of stored entries.
     */
    size_t nnz;
    /*
     `sparse_dim x nnz` indices, row-major.
     */
    const int64_t *indices;
    /*
     `nnz x prod(dense sizes)` values, row-major.
     */
    const void *values;
    /*
     Element type of `values`.
     */
    tc_dtype_t dtype;
} tc_sparse_coo_t;

/*
 `set(user_data, key, value, len, reply)`: store `len` bytes at `key`.
 */
typedef tc_result_t (*tc_store_set_fn)(void *user_data, const char *key, const void *value, size_t len, tc_store_reply_t *reply);

/*
 `get(user_data, key, reply)`: wait (up to the store's timeout) for `key`,
 then answer its value with `tc_store_reply_value`.
 */
typedef tc_result_t (*tc_store_get_fn)(void *user_data, const char *key, tc_store_reply_t *reply);

/*
 `add(user_data, key, delta, new_value, reply)`: add to the decimal
 integer at `key` (missing: 0) and write the result to `*new_value`.
 */
typedef tc_result_t (*tc_store_add_fn)(void *user_data, const char *key, int64_t delta, int64_t *new_value, tc_store_reply_t *reply);

/*
 `check(user_data, keys, n, ready, reply)`: write 1 to `*ready` when all
 `n` keys exist, else 0, without waiting.
 */
typedef tc_result_t (*tc_store_check_fn)(void *user_data, const char *const *keys, size_t n, int *ready, tc_store_reply_t *reply);

/*
 `wait(user_data, keys, n, timeout_ms, reply)`: wait until all `n` keys
 exist, at most `timeout_ms` (always positive); `TC_ERR_TIMEOUT` after.
 */
typedef tc_result_t (*tc_store_wait_fn)(void *user_data, const char *const *keys, size_t n, int64_t timeout_ms, tc_store_reply_t *reply);

/*
 `delete_key(user_data, key, deleted, reply)`: delete `key`; write 1 to
 `*deleted` when it existed, else 0.
 */
typedef tc_result_t (*tc_store_delete_fn)(void *user_data, const char *key, int *deleted, tc_store_reply_t *reply);

/*
 `compare_set(user_data, key, expected, expected_len, desired,
 desired_len, reply)`: torch's compare_set (see `tc_store_compare_set`);
 answer the value now current with `tc_store_reply_value`.
 */
typedef tc_result_t (*tc_store_compare_set_fn)(void *user_data, const char *key, const void *expected, size_t expected_len, const void *desired, size_t desired_len, tc_store_reply_t *reply);

/*
 `num_keys(user_data, n, reply)`: write the number of keys to `*n`.
 */
typedef tc_result_t (*tc_store_num_keys_fn)(void *user_data, int64_t *n, tc_store_reply_t *reply);

/*
 `destroy(user_data)`: the store is gone; release `user_data`.
 */
typedef void (*tc_store_destroy_fn)(void *user_data);

/*
 The functions of a store served by the application
 (`tc_store_new_callbacks`). Initialize with `TC_STORE_CALLBACKS_INIT`,
 then set the functions. Each returns `TC_SUCCESS` or an error code
 (`TC_ERR_TIMEOUT` for a get or wait that ran out of time; another code of
 this library is kept; any other nonzero value becomes `TC_ERR_REMOTE`),
 with a message through `tc_store_reply_error` if it likes. Keys are
 NUL-terminated UTF-8 and every pointer argument is valid only during the
 call. A callback must not unwind (no C++ exception, no longjmp) through
 the library.
 */
typedef struct {
    /*
     `sizeof(tc_store_callbacks_t)` as the caller compiled it.
     */
    size_t size;
    /*
     Must be `TC_STORE_CALLBACKS_MAGIC`.
     */
    uint32_t magic;
    /*
     `TC_STORE_CALLBACKS_VERSION` as the caller compiled it.
     */
    uint32_t version;
    /*
     Passed to every callback as is.
     */
    void *user_data;
    /*
     Required.
     */
    tc_store_set_fn set;
    /*
     Required.
     */
    tc_store_get_fn get;
    /*
     Required.
     */
    tc_store_add_fn add;
    /*
     Required.
     */
    tc_store_check_fn check;
    /*
     Required.
     */
    tc_store_wait_fn wait;
    /*
     Optional: NULL makes `tc_store_delete` fail with `TC_ERR_UNSUPPORTED`.
     */
    tc_store_delete_fn delete_key;
    /*
     Optional: NULL makes `tc_store_compare_set` fail with
     `TC_ERR_UNSUPPORTED`.
     */
    tc_store_compare_set_fn compare_set;
    /*
     Optional: NULL makes `tc_store_num_keys` fail with `TC_ERR_UNSUPPORTED`.
     */
    tc_store_num_keys_fn num_keys;
    /*
     Optional: called once, when the last reference to the store (the
     handle, prefix stores over it, comms bootstrapped with it) is gone,
     possibly on a library thread.
     */
    tc_store_destroy_fn destroy;
    /*
     The timeout the store's own get and wait keep, in milliseconds (the
     wait callback gets it when the library waits with the store's
     timeout). 0 or `TC_UNSET`: `TORCHCOMM_TIMEOUT_SECONDS`, else 600 s.
     */
    int64_t timeout_ms;
} tc_store_callbacks_t;

typedef tc_window tc_window_t;

/*
 The call succeeded.
 */
#define TC_SUCCESS 0

/*
 A pointer argument that must not be NULL was NULL (the message names it).
 */
#define TC_ERR_NULL_ARGUMENT 1001

/*
 An argument has a value outside its domain: unknown enum value, negative or
 overflowing count, rank out of range, bad options magic, invalid UTF-8.
 */
#define TC_ERR_INVALID_ARGUMENT 1002

/*
 The call is not valid in the object's current state (use after finalize,
 mismatched collective across ranks, ...).
 */
#define TC_ERR_INVALID_USAGE 1003

/*
 The operation is not implemented for this backend, dtype or reduce op.
 */
#define TC_ERR_UNSUPPORTED 1004

/*
 A library, driver or device that the call needs is not present.
 */
#define TC_ERR_UNAVAILABLE 1005

/*
 The operation did not finish within its timeout.
 */
#define TC_ERR_TIMEOUT 1006

/*
 A peer failed, vanished or reported an error.
 */
#define TC_ERR_REMOTE 1007

/*
 The communicator was aborted (by the caller or after an earlier failure).
 */
#define TC_ERR_ABORTED 1008

/*
 A CUDA driver call failed (the message carries CUDA's error name).
 */
#define TC_ERR_CUDA 1009

/*
 An NCCL call failed (the message carries NCCL's error string).
 */
#define TC_ERR_NCCL 1010

/*
 An operating-system call (socket, file, thread) failed.
 */
#define TC_ERR_SYSTEM 1011

/*
 A bug in libtorchcomm: an invariant did not hold.
 */
#define TC_ERR_INTERNAL 1012

/*
 A panic inside libtorchcomm was caught at the C boundary.
 */
#define TC_ERR_PANIC 1013

/*
 A caller-provided output buffer is too small; the needed size was reported.
 */
#define TC_ERR_BUFFER_TOO_SMALL 1014

/*
 A key or object that was asked for does not exist.
 */
#define TC_ERR_NOT_FOUND 1015

/*
 Memory of a size the caller chose (a gradient, a sparse tensor's
 entries, ...) could not be allocated; the message names the argument and
 the number of bytes. Nothing was changed.
 */
#define TC_ERR_OUT_OF_MEMORY 1016

/*
 Divide by the world size, then all-reduce (sum): DDP's default.
 */
#define TC_HOOK_ALLREDUCE 0

/*
 Cast the bucket to float16, divide by the world size in float16,
 all-reduce (sum), cast back: PyTorch's `fp16_compress_hook`.
 */
#define TC_HOOK_FP16_COMPRESS 1

/*
 As `TC_HOOK_FP16_COMPRESS` with bfloat16 (`bf16_compress_hook`).
 */
#define TC_HOOK_BF16_COMPRESS 2

/*
 No communication: the gradients keep their local values.
 */
#define TC_HOOK_NOOP 3

/*
 PowerSGD low-rank compression with error feedback (PyTorch's
 `powerSGD_hook`) with the default `tc_powersgd_options_t`; see
 `tc_reducer_set_powersgd` for the algorithm and its parameters.
 */
#define TC_HOOK_POWERSGD 4

#define TC_FLOAT32 0

#define TC_FLOAT64 1

#define TC_FLOAT16 2

#define TC_BFLOAT16 3

#define TC_INT8 4

#define TC_UINT8 5

#define TC_INT32 6

#define TC_INT64 7

/*
 One byte per element, 0 or 1.
 */
#define TC_BOOL 8

#define TC_UINT32 9

#define TC_UINT64 10

#define TC_FLOAT8_E4M3 11

#define TC_FLOAT8_E5M2 12

#define TC_SUM 0

#define TC_PRODUCT 1

#define TC_MIN 2

#define TC_MAX 3

/*
 Bitwise and; integer and bool dtypes only.
 */
#define TC_BAND 4

/*
 Bitwise or; integer and bool dtypes only.
 */
#define TC_BOR 5

/*
 Bitwise xor; integer and bool dtypes only.
 */
#define TC_BXOR 6

/*
 Multiply each input by a factor, then sum.
 */
#define TC_PREMUL_SUM 7

/*
 Sum, then divide by the world size (integer division truncates).
 */
#define TC_AVG 8

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/*
 Broadcasts root's `bufs[i]` (`counts[i]` elements of `dtypes[i]`) into
 every rank's, as c10d's `broadcast_coalesced` does: buffers
 are grouped by dtype, in list order, into buckets of at most
 `buffer_bytes` bytes (a larger buffer is a bucket of its own), each bucket
 is packed into one staging buffer, broadcast as one message and unpacked;
 empty buffers are skipped. Collective: every rank passes the same `n`,
 `counts`, `dtypes`, `buffer_bytes` and `root`; a difference fails every
 rank with `TC_ERR_INVALID_USAGE` naming the first difference, and no
 buffer is written. The check is one 16-byte all-reduce, done during the
 call even with `async_op = 1`.

 With `async_op = 0` the call returns when every buffer holds root's data
 and at most two buckets are staged at a time. With `async_op = 1` every
 bucket is staged and enqueued before the call returns (so later
 operations on the comm follow it in the same order on every rank) and the
 buffers are written when the work completes. `*work` (may be NULL when
 not wanted) receives one work for the whole call, to free with
 `tc_work_free`. The arrays are read during the call only; the buffers
 must stay valid until the work completes. Thread-safe as the other
 operations.

 Device memory. On an nccl comm the buffers are device memory and the
 call is stream-ordered: the list check runs on `opts->stream` (the host
 waits for it), then the packing into a staging buffer from the comm's
 allocator (`tc_mem_alloc`), one broadcast per bucket and the unpacking
 are enqueued on `opts->stream` (`async_op = 0`, the call returns once
 enqueued) or on a stream of the call's own that waits for
 `opts->stream` (`async_op = 1`; `tc_work_wait` makes a stream wait for
 the work). On a gloo comm CUDA buffers are copied to and from host
 staging on `opts->stream`, which the call synchronizes. A capturing
 stream is `TC_ERR_UNSUPPORTED` on nccl.
 */
tc_result_t tc_broadcast_coalesced(tc_comm_t *comm, void *const *bufs, const size_t *counts, const tc_dtype_t *dtypes, size_t n, size_t buffer_bytes, int root, const tc_op_options_t *opts, tc_work_t **work);

/*
 Creates a communicator over `backend` ("gloo" for host memory, "nccl" for
 CUDA memory) on `device`. Collective: every rank of the job calls it.
 Rank, size and store come from `opts` or, when unset, from the
 environment (TORCHCOMM_RANK/SIZE, Open MPI, PMI, torchrun, Slurm; store
 at MASTER_ADDR:MASTER_PORT, under Slurm by default the step's first node).
 `opts` may be NULL (defaults) and is copied.
 On success `*comm` receives a handle to destroy with `tc_comm_destroy`;
 on failure it is left untouched.

 With `opts->enable_reconfigure = 1` the call is not collective and the
 comm has no members yet: only the store is resolved (`opts->store`, else
 the environment as above, which may need the launcher's rank to know who
 hosts it); the comm takes part in nothing until `tc_comm_reconfigure`
 forms it (see there), and until then every call on it but
 `tc_comm_get_name`, `tc_comm_get_backend`, `tc_comm_get_device`,
 `tc_comm_get_async_error` (`TC_SUCCESS`), `tc_comm_get_init_handle`,
 `tc_comm_reconfigure`, `tc_comm_finalize`, `tc_comm_abort` and
 `tc_comm_destroy` fails with `TC_ERR_INVALID_USAGE`. The backend must
 be able to run here (`TC_ERR_UNAVAILABLE` saying what is missing, e.g.
 NCCL or the CUDA driver for `nccl`).
 */
tc_result_t tc_comm_new(const char *backend, tc_device_t device, const tc_comm_options_t *opts, tc_comm_t **comm);

/*
 Writes this process's rank in the comm. Thread-safe.
 */
tc_result_t tc_comm_get_rank(const tc_comm_t *comm, int *rank);

/*
 Writes the number of ranks of the comm. Thread-safe.
 */
tc_result_t tc_comm_get_size(const tc_comm_t *comm, int *size);

/*
 Writes the comm's name; the string is owned by the comm and valid until
 `tc_comm_destroy`. Thread-safe.
 */
tc_result_t tc_comm_get_name(const tc_comm_t *comm, const char **name);

/*
 Writes the comm's backend name ("gloo", "nccl"); owned by the comm, valid
 until `tc_comm_destroy`. Thread-safe.
 */
tc_result_t tc_comm_get_backend(const tc_comm_t *comm, const char **backend);

/*
 Writes the comm's device. Thread-safe.
 */
tc_result_t tc_comm_get_device(const tc_comm_t *comm, tc_device_t *device);

/*
 Returns `TC_SUCCESS` while the comm is healthy, else the code of the
 failure that aborted it (found by a background thread), with its detail in
 `tc_last_error`. Thread-safe.
 */
tc_result_t tc_comm_get_async_error(const tc_comm_t *comm);

/*
 Writes to `*text` the comm's flight recorder: a NUL-terminated table of
 its most recent operations, oldest first (sequence number, operation,
 dtype, elements, root or peer, async, time issued since the comm's
 creation, status now, age). Collectives get the same sequence numbers on
 every rank, so the dumps of a stuck job's ranks show which rank is behind
 and where. How many operations are kept: `TORCHCOMM_FLIGHT_RECORDER`
 (default 64; 0 turns recording off, and the text says so). The comm also
 logs this table when an operation fails or times out.

 `*text` is allocated: release it with `tc_free`. Works in every state of
 the comm, after an abort or finalize included (until `tc_comm_destroy`).
 `text` must not be NULL; untouched on failure. Thread-safe; the status
 of each operation is read at the call, without waiting for any.
 */
tc_result_t tc_comm_dump_flight_recorder(const tc_comm_t *comm, char **text);

/*
 Sets `hook`, called once when the comm becomes aborted: by an operation
 that failed or timed out (before the process aborts, when abort-on-error
 is on: the place to flush logs or checkpoints), or by `tc_comm_abort`.
 It is not called for the abort of a comm destroyed without finalize, and
 never after `tc_comm_destroy` returned. A NULL `hook` removes it; a new
 one replaces the old. It runs on the thread that found the failure (the
 comm's background threads, or the thread of the failing or aborting
 call) with no lock of the comm held; it may query the comm (e.g.
 `tc_comm_dump_flight_recorder`) but must not destroy it. `user_data` is
 passed through untouched. Thread-safe.
 */
tc_result_t tc_comm_set_abort_hook(tc_comm_t *comm, tc_abort_hook_t hook, void *user_data);

/*
 Creates a sub-communicator of the ranks listed in `ranks` (parent ranks,
 no duplicates); the new rank is the caller's index in the list.
 Collective: every rank of `comm` calls it with the same list and name.
 An empty list (`n == 0`, `ranks` may be NULL) opts out: `*out = NULL`.
 A non-empty list without the caller is `TC_ERR_INVALID_ARGUMENT`. `name`
 must be unique among the live comms of this process (parent included):
 a name in use is `TC_ERR_INVALID_ARGUMENT`, refused before any
 communication. `opts` may be NULL (inherit timeout and abort-on-error
 from the parent); its `name` is ignored.
 */
tc_result_t tc_comm_split(tc_comm_t *comm, const int *ranks, size_t n, const char *name, const tc_comm_options_t *opts, tc_comm_t **out);

/*
 Waits for every operation issued on the comm, and for the asynchronous
 calls (put, signal, wait_signal) of its windows not yet freed (a pending
 `tc_window_wait_signal` up to its timeout), then releases its backend
 resources. Later operations fail with `TC_ERR_INVALID_USAGE`, window
 calls included (such a window can only be freed: deregister windows
 before finalize). Returns `TC_ERR_ABORTED` if the comm was aborted, else
 the first failure of any operation, else the first failure of an
 asynchronous call of a window not yet freed (a window freed earlier is
 not reported). Call `tc_comm_destroy` afterwards. From inside an
 operation hook (`tc_comm_add_pre_hook` / `tc_comm_add_post_hook`; a post
 hook may run on the comm's progress thread, which finalize would wait
 for) it fails with `TC_ERR_INVALID_USAGE` and changes nothing.
 */
tc_result_t tc_comm_finalize(tc_comm_t *comm);

/*
 Aborts the comm without waiting for peers: running and pending operations
 fail with `TC_ERR_ABORTED`, as do later ones. So do the outstanding
 asynchronous calls of its windows: queued ones at once, the running put,
 signal or wait by the window being closed as `tc_window_free` closes it
 (the window then only accepts `tc_window_free`). Thread-safe.
 */
tc_result_t tc_comm_abort(tc_comm_t *comm);

/*
 Destroys the handle. NULL is ignored. A comm that was not finalized is
 aborted first, with a warning. Outstanding work handles stay valid. No
 other call may use the handle during or after this one; one that does
 anyway (a second destroy, say) gets `TC_ERR_INVALID_ARGUMENT` ("not a
 live tc_comm_t"), here a warning with `tc_last_error` set. Its name is
 free for a new comm once this returns. From inside an operation hook it
 is refused (`TC_ERR_INVALID_USAGE` in `tc_last_error`, a warning) and the
 comm stays as it was.
 */
void tc_comm_destroy(tc_comm_t *comm);

/*
 For a binding whose own checks refuse a collective before calling it
 (a Python dtype the library has no code for, a list of the wrong
 length): issues the refusal of `call` in the call's place, as the
 library does for the arguments it refuses itself, so that the call
 fails on every rank instead of the peers pairing it with this rank's
 next collective (see the header's preamble on refusals). `call` is the
 C name of the refused call (`"tc_all_reduce"`, ..., `"tc_barrier"`,
 `"tc_broadcast_coalesced"`, `"tc_reducer_new"`, `"tc_sparse_all_reduce"`,
 `"tc_all_gather_p_init"`, `"tc_all_gather_p_exec"`; not a point-to-point
 call); `reason` (UTF-8, copied) is what the peers are told, naming the
 argument. Returns `TC_ERR_INVALID_ARGUMENT` with `reason` as this
 thread's error once the refusal is issued (`tc_last_error`); a NULL
 `comm`, `call` or `reason` is `TC_ERR_NULL_ARGUMENT` and an unknown
 `call` `TC_ERR_INVALID_ARGUMENT` naming it, neither issuing anything.
 Thread safety and ordering as for the refused call: it takes that
 call's place in the comm's sequence of collectives.
 */
tc_result_t tc_comm_refuse(tc_comm_t *comm, const char *call, const char *reason);

/*
 Sends `count` elements at `buf` to rank `peer`; pairs with the receive
 of `peer` with the same tag (`opts->tag`, version 2 of the options; 0
 when unset). Matching is by (peer, tag); sends and receives of one
 (peer, tag) pair up in issue order. Operations of a comm run in issue
 order (as on NCCL), so a receive waits for the send of its tag even if
 the peer issues that send after others: a tag selects among transfers in
 flight together (a batch), and never lets a receive take the data of a
 send with another tag. On `nccl`, a non-zero tag is refused
 (`TC_ERR_UNSUPPORTED`: NCCL matches by peer and order only). A send
 refused here (a bad argument) fails only this rank: the peer's receive
 waits until its timeout, or takes this rank's next send to it.
 `work` may be NULL. `opts` may be NULL (defaults).
 */
tc_result_t tc_send(tc_comm_t *comm, const void *buf, size_t count, tc_dtype_t dt, int peer, const tc_op_options_t *opts, tc_work_t **work);

/*
 Receives `count` elements from rank `peer` into `buf`, from the send of
 `peer` with the same tag (`opts->tag`; see `tc_send`). The sizes of a
 send/recv pair must agree (`TC_ERR_INVALID_USAGE` otherwise, naming
 both).

 `peer` may be `TC_ANY_SOURCE`: the receive then takes the first message
 with its tag from whichever other rank's send comes first (never from
 this rank itself: a send to self pairs only with a receive naming this
 rank). Messages of one sender with one tag are still taken in that
 sender's issue order (non-overtaking, as MPI), and the receive runs in
 this comm's issue order like every operation. `tc_work_source` on its
 work gives the sender (ask for the work, also with `async_op = 0`). A
 size mismatch fails it with `TC_ERR_INVALID_USAGE` naming the sender;
 that message is consumed. Waiting for it, the loss of any other rank
 (its process exited, it destroyed the comm) fails it with
 `TC_ERR_REMOTE` naming that rank, the comm's timeout with
 `TC_ERR_TIMEOUT`. Host comms only: on `nccl` it fails with
 `TC_ERR_UNSUPPORTED`; a comm of one rank refuses it
 (`TC_ERR_INVALID_USAGE`); batches do not take it (see
 `tc_batch_recv`).
 */
tc_result_t tc_recv(tc_comm_t *comm, void *buf, size_t count, tc_dtype_t dt, int peer, const tc_op_options_t *opts, tc_work_t **work);

/*
 Starts an empty batch of point-to-point operations on `comm`. Free it with
 `tc_batch_free` (after `tc_batch_issue` or instead of it).
 */
tc_result_t tc_batch_begin(tc_comm_t *comm, tc_batch_t **batch);

/*
 Adds a send of `count` elements at `buf` to `peer` to the batch (tag 0).
 */
tc_result_t tc_batch_send(tc_batch_t *batch, const void *buf, size_t count, tc_dtype_t dt, int peer);

/*
 Adds a receive of `count` elements from `peer` into `buf` to the batch
 (tag 0). `peer` must name a rank: `TC_ANY_SOURCE` makes `tc_batch_issue`
 fail with `TC_ERR_UNSUPPORTED` naming `batch[i].peer` (its match would
 depend on which of the batch's other receives matched first).
 */
tc_result_t tc_batch_recv(tc_batch_t *batch, void *buf, size_t count, tc_dtype_t dt, int peer);

/*
 Adds a send of `count` elements at `buf` to `peer` with tag `tag` to the
 batch: it matches the receive of `peer` with the same tag, whatever the
 order of the entries in either rank's batch (the entries of a batch are
 in flight together). Entries of one (peer, tag) pair up in order. On
 `nccl`, a non-zero tag makes `tc_batch_issue` fail with
 `TC_ERR_UNSUPPORTED`. `tc_batch_send` is this with tag 0.
 */
tc_result_t tc_batch_send_tagged(tc_batch_t *batch, const void *buf, size_t count, tc_dtype_t dt, int peer, uint32_t tag);

/*
 Adds a receive of `count` elements from `peer` into `buf`, matching the
 send of `peer` with tag `tag` (see `tc_batch_send_tagged`).
 `tc_batch_recv` is this with tag 0.
 */
tc_result_t tc_batch_recv_tagged(tc_batch_t *batch, void *buf, size_t count, tc_dtype_t dt, int peer, uint32_t tag);

/*
 Issues every operation of the batch as one operation with one work. The
 batch stays owned by the caller (free it with `tc_batch_free`) and is
 emptied.
 */
tc_result_t tc_batch_issue(tc_batch_t *batch, const tc_op_options_t *opts, tc_work_t **work);

/*
 Frees a batch. NULL is ignored; a handle that is not a live batch (freed
 already) is left alone with a warning and `tc_last_error` set.
 */
void tc_batch_free(tc_batch_t *batch);

/*
 Broadcasts `count` elements of `buf` from `root` to every rank, in place.
 */
tc_result_t tc_broadcast(tc_comm_t *comm, void *buf, size_t count, tc_dtype_t dt, int root, const tc_op_options_t *opts, tc_work_t **work);

/*
 Reduces `buf` across ranks with `op`, in place; the result is defined on
 `root` only.
 */
tc_result_t tc_reduce(tc_comm_t *comm, void *buf, size_t count, tc_dtype_t dt, int root, tc_reduce_op_t op, const tc_op_options_t *opts, tc_work_t **work);

/*
 Reduces `buf` across ranks with `op`, in place, on every rank.
 */
tc_result_t tc_all_reduce(tc_comm_t *comm, void *buf, size_t count, tc_dtype_t dt, tc_reduce_op_t op, const tc_op_options_t *opts, tc_work_t **work);

/*
 Gathers `count` elements of `input` from every rank into `outputs[r]`
 (an array of size-of-comm buffers of `count` elements each).
 */
tc_result_t tc_all_gather(tc_comm_t *comm, void *const *outputs, const void *input, size_t count, tc_dtype_t dt, const tc_op_options_t *opts, tc_work_t **work);

/*
 Gathers `count` elements of `input` from every rank into `output`
 (`count * size` elements, rank r's at offset `r * count`).
 */
tc_result_t tc_all_gather_single(tc_comm_t *comm, void *output, const void *input, size_t count, tc_dtype_t dt, const tc_op_options_t *opts, tc_work_t **work);

/*
 Gathers `counts[r]` elements from each rank r into `output`, in rank order
 (`sum(counts)` elements). `counts` has one entry per rank and must be the
 same on every rank; this rank's `input` has `counts[rank]` elements.
 */
tc_result_t tc_all_gather_v(tc_comm_t *comm, void *output, const size_t *counts, const void *input, tc_dtype_t dt, const tc_op_options_t *opts, tc_work_t **work);

/*
 Reduces `inputs[r]` (one buffer of `count` elements per rank) across
 ranks with `op`; rank r receives block r in `output`.
 */
tc_result_t tc_reduce_scatter(tc_comm_t *comm, void *output, const void *const *inputs, size_t count, tc_dtype_t dt, tc_reduce_op_t op, const tc_op_options_t *opts, tc_work_t **work);

/*
 Reduces `input` (`count * size` elements) across ranks with `op`; rank r
 receives the `count` elements of block r in `output`.
 */
tc_result_t tc_reduce_scatter_single(tc_comm_t *comm, void *output, const void *input, size_t count, tc_dtype_t dt, tc_reduce_op_t op, const tc_op_options_t *opts, tc_work_t **work);

/*
 Reduces `input` (`sum(counts)` elements, block r `counts[r]` long) across
 ranks with `op`; rank r receives block r (`counts[r]` elements) in
 `output`. `counts` must be the same on every rank.
 */
tc_result_t tc_reduce_scatter_v(tc_comm_t *comm, void *output, const void *input, const size_t *counts, tc_dtype_t dt, tc_reduce_op_t op, const tc_op_options_t *opts, tc_work_t **work);

/*
 Sends `inputs[r]` to rank r and receives rank r's block into `outputs[r]`
 (`count` elements each; one buffer per rank in each list).
 */
tc_result_t tc_all_to_all(tc_comm_t *comm, void *const *outputs, const void *const *inputs, size_t count, tc_dtype_t dt, const tc_op_options_t *opts, tc_work_t **work);

/*
 All-to-all on contiguous buffers: block r of `input` (`count` elements)
 goes to rank r; block r of `output` comes from rank r.
 */
tc_result_t tc_all_to_all_single(tc_comm_t *comm, void *output, const void *input, size_t count, tc_dtype_t dt, const tc_op_options_t *opts, tc_work_t **work);

/*
 All-to-all with per-rank counts (elements): `input_counts[r]` elements of
 `input` go to rank r, `output_counts[r]` elements from rank r land in
 `output`; blocks are contiguous in rank order. Each pair of counts must
 agree between sender and receiver.
 */
tc_result_t tc_all_to_all_v_single(tc_comm_t *comm, void *output, const size_t *output_counts, const void *input, const size_t *input_counts, tc_dtype_t dt, const tc_op_options_t *opts, tc_work_t **work);

/*
 Returns (or completes its work) when every rank has entered the barrier.
 */
tc_result_t tc_barrier(tc_comm_t *comm, const tc_op_options_t *opts, tc_work_t **work);

/*
 Sends `inputs[r]` (on `root`: one buffer of `count` elements per rank) to
 rank r's `output`. `inputs` is ignored and may be NULL on other ranks.
 */
tc_result_t tc_scatter(tc_comm_t *comm, void *output, const void *const *inputs, size_t count, tc_dtype_t dt, int root, const tc_op_options_t *opts, tc_work_t **work);

/*
 Gathers `count` elements of `input` from every rank into `outputs[r]` on
 `root`. `outputs` is ignored and may be NULL on other ranks.
 */
tc_result_t tc_gather(tc_comm_t *comm, void *const *outputs, const void *input, size_t count, tc_dtype_t dt, int root, const tc_op_options_t *opts, tc_work_t **work);

/*
 Gathers `count` elements of `input` from every rank into `output` on
 `root`: `count * size` elements, rank r's at offset `r * count` (rank
 order, as `tc_all_gather_single` lays them out). `output` is ignored and
 may be NULL on other ranks. In place on the root: `input` may be the
 root's own block of `output` (`output + root * count`). On `nccl` it
 runs as grouped sends and receives (NCCL has no gather).
 */
tc_result_t tc_gather_single(tc_comm_t *comm, void *output, const void *input, size_t count, tc_dtype_t dt, int root, const tc_op_options_t *opts, tc_work_t **work);

/*
 Writes this comm's ranks in the root comm's numbering: entry i is the
 rank, in the comm made by `tc_comm_new` that this comm descends from, of
 this comm's rank i. A comm made by `tc_comm_new` gives 0..size-1; a comm
 made by `tc_comm_split` gives its parent's entries for the ranks it was
 split from, so the numbering is the root's through every level of splits.

 `*count` is in/out, as NCCL-style size queries: on entry the capacity of
 `ranks` (in elements), on return the comm's size. `ranks` NULL: only the
 size is written (`TC_SUCCESS`). A capacity smaller than the size: nothing
 is written to `ranks`, `*count` gets the size needed, and the call fails
 with `TC_ERR_INVALID_ARGUMENT`. The caller owns `ranks`. `count` must
 not be NULL. Works in every state of the comm; thread-safe.
 */
tc_result_t tc_comm_get_ranks(const tc_comm_t *comm, int *ranks, size_t *count);

/*
 Writes the version of the comm's backend, NUL-terminated: "gloo X.Y.Z
 (torchcomm A.B.C)" with Gloo's version from the headers its module was
 built with ("unknown" for a module without that call), "nccl X.Y.Z"
 with the version the loaded NCCL reports (`ncclGetVersion`). The string
 is owned by the comm, valid until `tc_comm_destroy`. `version` must not
 be NULL. Works in every state of the comm; thread-safe.
 */
tc_result_t tc_comm_get_backend_version(const tc_comm_t *comm, const char **version);

/*
 Sets the comm's default timeout to `timeout_ms` milliseconds (> 0) for
 operations issued after the call (those whose options leave `timeout_ms`
 unset) and for window calls made after it; operations already issued,
 queued or running, keep the deadline they were issued with. Splits made
 later inherit the new value. Local: other ranks keep theirs. The comm
 must be active (`TC_ERR_INVALID_USAGE` after finalize, `TC_ERR_ABORTED`
 after an abort). Thread-safe.
 */
tc_result_t tc_comm_set_timeout(tc_comm_t *comm, int64_t timeout_ms);

/*
 Changes hints of a live comm, all or nothing. Hints a live comm can
 change: "timeout_ms" (positive integer; as `tc_comm_set_timeout`) and
 "abort_on_error" ("0" or "1"; whether a failure found from now on aborts
 the process or only the comm). Hints read only at creation ("gloo.iface",
 "gloo.hostname", NCCL's config hints such as "nccl.min_ctas",
 "high_priority_stream") are refused with `TC_ERR_UNSUPPORTED`, unknown
 hints with `TC_ERR_INVALID_ARGUMENT`; either way `tc_last_error` names
 the hint and no hint of the call is applied. `hints` (copied during the
 call) may be NULL when `num_hints` is 0. Local to this rank. The comm
 must be active. Thread-safe.
 */
tc_result_t tc_comm_set_hints(tc_comm_t *comm, const tc_hint_t *hints, size_t num_hints);

/*
 Static English text for a result code; never NULL, never freed. Unknown
 codes give "unknown result code". Thread-safe.
 */
const char *tc_result_string(tc_result_t result);

/*
 Detail of the last call that failed on the calling thread: which argument,
 peer or OS/CUDA/NCCL error. Empty string if none failed yet. The pointer
 stays valid until the next failing call on this thread; do not free it.
 */
const char *tc_last_error(void);

/*
 Writes the library's version (that of the loaded `libtorchcomm.so`, which
 may differ from the header's `TC_VERSION_*`). All three pointers must be
 non-NULL; nothing is written on failure. Thread-safe.
 */
tc_result_t tc_get_version(int *major, int *minor, int *patch);

/*
 Registers `hook`, called with `user_data` before every operation that
 `comm` issues after this returns: collectives, send/recv, batches, and
 the operations of the coalesced, reducer and sparse APIs on this comm,
 and the calls of its windows (`tc_window_put`, `_get`, `_signal`,
 `_wait_signal`: `op_name` "window_put", ..., the target rank in `peer`,
 a put's source or a get's destination as its one buffer with `count` in
 bytes, `window_offset`; `seq` counts the comm's window calls apart from
 its operations, from 1; a zero-byte put or get does nothing and runs no
 hook). It runs on the calling thread after the
 operation's arguments were validated (a call refused by validation runs
 no hook) and before anything is sent. Hooks run in registration order.
 `*id` (if `id` is not NULL) receives the id for `tc_comm_remove_hook`.
 A hook must not issue operations or window calls on `comm` nor register or remove hooks
 of any comm (such calls fail with `TC_ERR_INVALID_USAGE`), must not
 destroy `comm`, and should not issue operations on other comms (not
 checked; it would stall the thread running the hook, which may be the
 comm's progress thread); it may query (`tc_comm_get_rank`,
 `tc_comm_dump_flight_recorder`, ...). `hook` and
 `user_data` must be usable from any thread until the hook is removed or
 the comm destroyed. Thread-safe. NULL `hook`: `TC_ERR_NULL_ARGUMENT`.
 */
tc_result_t tc_comm_add_pre_hook(tc_comm_t *comm, tc_op_hook_t hook, void *user_data, uint64_t *id);

/*
 Registers `hook`, called once with the outcome (`status`, `message`,
 `completed`) of every operation issued after this returns whose pre
 hooks ran (same operations as `tc_comm_add_pre_hook`). Host operations
 (gloo): when the operation finished, on the thread that ran it (for
 `async_op = 1` the comm's progress thread, or the calling thread when
 a point-to-point call completed at once there, or a thread in
 `tc_work_wait` or a blocking call that ran the queued operations ahead
 of its own while nothing else ran; for a blocking call the calling
 thread, or the progress thread when the call queued behind earlier
 asynchronous operations), before its work reports completion:
 once `tc_work_wait`
 returned or a blocking call returned, its post hooks have run (for
 CUDA buffers staged through host memory, before the outputs are copied
 back to the device). Device operations (nccl): on the calling thread
 once enqueued on the stream, with `completed` = 0. An operation failed
 before issue (by the NaN check, on a comm shutting down): on the calling
 thread with the failure. A work that times out gets its post hooks when
 the operation's run ends (after the comm's abort at the latest). Window
 calls: when the call ended, on the thread that ran it (the caller's for
 a blocking call, the window's worker thread for `async_op = 1`), before
 its work completes; a call discarded before it ran (window freed, comm
 aborted) gets them with `TC_ERR_ABORTED` on the thread that discarded
 it. Same
 rules as pre hooks for `id`, reentry, lifetime and threads.
 */
tc_result_t tc_comm_add_post_hook(tc_comm_t *comm, tc_op_hook_t hook, void *user_data, uint64_t *id);

/*
 Removes the pre or post hook `id` of `comm`. When this returns, the hook
 is not running and will not be called again, so its `user_data` may be
 freed (it waits for calls in progress on other threads). An id not
 registered on `comm` (never, or already removed): `TC_ERR_NOT_FOUND`.
 Must not be called from inside a hook (`TC_ERR_INVALID_USAGE`).
 `tc_comm_destroy` removes every hook. Thread-safe.
 */
tc_result_t tc_comm_remove_hook(tc_comm_t *comm, uint64_t id);

/*
 Creates a group over `devices[0..n]` (`TC_DEVICE_CUDA` with an explicit
 index — -1 is refused — or `TC_DEVICE_CPU`; a device may appear more
 than once, which makes the group use the copies path). Retains each CUDA
 device's primary context; NCCL communicators are made on the first call
 that can use them (`ncclCommInitAll`) and kept until `tc_local_free`.
 `opts` may be NULL and is copied. On success `*out` receives the group.
 Errors: `TC_ERR_NULL_ARGUMENT` (`devices`, `out`), `TC_ERR_INVALID_ARGUMENT`
 (`n` = 0, a device type or index out of range, a bad options magic),
 `TC_ERR_UNAVAILABLE` for a CUDA device without a CUDA driver. Thread-safe.
 */
tc_result_t tc_local_new(const tc_device_t *devices, size_t n, const tc_local_options_t *opts, tc_local_t **out);

/*
 Destroys a group: waits for the library's own staging buffers to be
 released by the devices, destroys its NCCL communicators and releases
 the devices' contexts. NULL is a no-op. Work already enqueued completes;
 no call on the group may be running or follow.
 */
void tc_local_free(tc_local_t *g);

/*
 Copies `count` elements of `dt` at `src`, which lives on member
 `src_index`, into `dsts[i]` on member i for every member (torch.cuda.comm
 broadcast). `dsts[src_index]` may be `src` itself (nothing copied there).
 NCCL path (one `ncclBroadcast` per device in one group) when every member
 is a distinct CUDA device; copies otherwise (a CPU member or a repeated
 device). Stream-ordered on `streams` (see `tc_local`; a CPU
 destination or source makes the call host-synchronous for that copy).
 */
tc_result_t tc_local_broadcast(tc_local_t *g, const void *src, size_t src_index, void *const *dsts, size_t count, tc_dtype_t dt, void *const *streams);

/*
 Broadcasts `n` buffers at once (torch.cuda.comm broadcast_coalesced):
 buffer t is `counts[t]` elements of `dtypes[t]` at `srcs[t]` on member 0,
 copied to `dsts[d * n + t]` on member d (row-major, one row per member;
 row 0 may repeat `srcs`). Buffers are bucketed by data type up to
 `buffer_bytes` (0: the group's bucket size, 10 MiB by default); on the
 NCCL path each bucket is one NCCL group. Stream-ordered on `streams`.
 */
tc_result_t tc_local_broadcast_coalesced(tc_local_t *g, const void *const *srcs, const size_t *counts, const tc_dtype_t *dtypes, size_t n, size_t buffer_bytes, void *const *dsts, void *const *streams);

/*
 Splits `count` elements of `dt` at `src` (on `src_device`: the CPU or
 any CUDA device, in the group or not) along dimension 0 into `dsts[i]` on
 member i (torch.cuda.comm scatter). The buffer is flat and contiguous; to
 split a row-major tensor along dimension 0 give counts in elements of
 whole rows (rows x row length). `chunk_counts`: `n_members` element
 counts summing to `count`, or NULL for torch.chunk's rule: chunks of
 ceil(count / n_members) elements, the last one shorter; when fewer chunks
 are needed than there are members, the remaining members get nothing
 (their `dsts` entries are not written and may be NULL), e.g. 5 elements
 over 4 devices are 2, 2, 1, 0. Always the copies path, stream-ordered on
 the destinations' `streams` (and, for a device source, on the stream of
 its first member on that device, else its legacy stream).
 */
tc_result_t tc_local_scatter(tc_local_t *g, const void *src, tc_device_t src_device, size_t count, tc_dtype_t dt, const size_t *chunk_counts, void *const *dsts, void *const *streams);

/*
 Concatenates `srcs[i]` (`counts[i]` elements of `dt` on member i) in
 member order into `dst` on `dst_device`: the CPU (torch's
 `destination=-1`; the call returns once the data is there) or any CUDA
 device, in the group or not (stream-ordered on `stream`, a stream of that
 device, NULL: its legacy stream). Sources are read in order with their
 device's legacy stream (with `stream` for sources on the destination's
 device): order work on other streams before the call. Always the copies
 path.
 */
tc_result_t tc_local_gather(tc_local_t *g, const void *const *srcs, const size_t *counts, tc_dtype_t dt, void *dst, tc_device_t dst_device, void *stream);

/*
 Writes into `dst`, on member `dst_index`, the elementwise sum of
 `srcs[i]` (`count` elements of `dt` on member i) over every member
 (torch.cuda.comm reduce_add). Every member must be a CUDA device; `dst`
 may be `srcs[dst_index]` (in place). NCCL path (`ncclReduce` to that root
 in one group) when the members are distinct devices; otherwise copies
 into pinned host staging on the destination's stream, summed there by a
 host function in member order and copied to `dst` (float8 is then
 `TC_ERR_UNSUPPORTED`). bool sums are logical or. Stream-ordered on
 `streams`; host-asynchronous on both paths.
 */
tc_result_t tc_local_reduce_add(tc_local_t *g, const void *const *srcs, size_t count, tc_dtype_t dt, void *dst, size_t dst_index, void *const *streams);

/*
 Sums `n` buffers at once (torch.cuda.comm reduce_add_coalesced): buffer
 t is `counts[t]` elements of `dtypes[t]` at `srcs[d * n + t]` on member d
 (row-major, one row per member), summed into `dsts[t]` on member
 `dst_index` (which may be the source of that member). Bucketed by data
 type up to `buffer_bytes` (0: the group's bucket size, 10 MiB by
 default); otherwise as `tc_local_reduce_add`.
 */
tc_result_t tc_local_reduce_add_coalesced(tc_local_t *g, const void *const *srcs, const size_t *counts, const tc_dtype_t *dtypes, size_t n, size_t buffer_bytes, void *const *dsts, size_t dst_index, void *const *streams);

/*
 Sends the library's log lines (already filtered by `TORCHCOMM_DEBUG`) to
 `callback` instead of stderr; NULL restores stderr. The callback may be
 called from any thread, including the library's background threads, and
 must not call back into libtorchcomm; `message` (the full line, with its
 host:pid:rank prefix) is valid only during the call. `user_data` is passed
 through untouched and must stay valid until the callback is replaced.
 */
tc_result_t tc_set_log_callback(tc_log_callback_t callback, void *user_data);

/*
 Registers `bytes` bytes of device memory at `buf` with the comm, so that
 the backend can transfer from and to it without staging copies (nccl:
 `ncclCommRegister`, NCCL 2.19 or newer). On success `*handle` receives
 the registration; it may be NULL when the backend registered nothing
 (e.g. `NCCL_LOCAL_REGISTER=0`), which `tc_comm_deregister` accepts.

 `buf` stays owned by the caller and must stay allocated until it is
 deregistered. Errors: `TC_ERR_NULL_ARGUMENT` (`comm`, `buf`, `handle`),
 `TC_ERR_INVALID_ARGUMENT` (`bytes` = 0), `TC_ERR_INVALID_USAGE` after
 `tc_comm_finalize`, `TC_ERR_ABORTED` after an abort,
 `TC_ERR_UNSUPPORTED` for a backend or NCCL without registration.
 `*handle` is written only on success. Thread-safe: serialized with the
 comm's operations. Not stream-ordered: call it outside graph capture,
 before the operations that use the buffer.
 */
tc_result_t tc_comm_register(tc_comm_t *comm, void *buf, size_t bytes, void **handle);

/*
 Releases a registration made by `tc_comm_register` on this comm. NULL
 is a no-op. After `tc_comm_finalize` or an abort it only forgets the
 handle (the backend released its registrations with the comm); call it
 before `tc_comm_destroy` and before freeing the buffer. A handle that is
 not a live registration of this comm is `TC_ERR_INVALID_ARGUMENT`
 (nothing is passed to the backend). Thread-safe: serialized with the
 comm's operations; every operation using the buffer must have completed.
 */
tc_result_t tc_comm_deregister(tc_comm_t *comm, void *handle);

/*
 Allocates `bytes` bytes from the backend's allocator. nccl: device memory
 on the comm's device from `ncclMemAlloc` (suited to NVLink SHARP and
 zero-copy transfers; with an NCCL older than 2.19, plain `cuMemAlloc`),
 not initialized, freed with a warning by `tc_comm_destroy` if
 `tc_mem_free` was not called. gloo: zeroed host memory in a shared
 mapping (memfd) that the comm's ranks on the same host map when it holds
 a window's buffer (`tc_window_map_remote` then works, and puts are
 memory copies); left mapped, with a warning, by `tc_comm_destroy` if not
 freed. On success `*ptr` receives the address. Free it with
 `tc_mem_free` on the same comm.

 Errors: `TC_ERR_NULL_ARGUMENT` (`comm`, `ptr`), `TC_ERR_INVALID_ARGUMENT`
 (`bytes` = 0), `TC_ERR_INVALID_USAGE` after `tc_comm_finalize`,
 `TC_ERR_ABORTED` after an abort, `TC_ERR_UNSUPPORTED` for a backend
 without an allocator, `TC_ERR_NCCL`/`TC_ERR_CUDA` when allocation fails.
 `*ptr` is written only on success. Thread-safe. Synchronous: the memory
 is usable on any stream once this returns.
 */
tc_result_t tc_mem_alloc(tc_comm_t *comm, size_t bytes, void **ptr);

/*
 Frees memory from `tc_mem_alloc` on this comm. NULL is a no-op. Works
 after `tc_comm_finalize` or an abort, until `tc_comm_destroy`. A pointer
 that is not a live allocation of this comm is `TC_ERR_INVALID_ARGUMENT`
 (nothing is freed). Thread-safe. Not stream-ordered: every operation
 using the memory must have completed (synchronize its streams first).
 */
tc_result_t tc_mem_free(tc_comm_t *comm, void *ptr);

/*
 Sets up a persistent all-gather of `count` elements of `dt` per rank into
 `output` (`count * size` elements, rank r's at `r * count`, as
 `tc_all_gather_single`); the output is validated once here. Every rank
 calls it with the same `count` and `dt`: on `gloo` the call is
 collective and blocking and checks that (a rank that differs makes it
 fail on every rank with `TC_ERR_INVALID_USAGE` naming one); on `nccl`
 it is local, and, as for the plain call, counts must agree unchecked. `output` must stay valid until the handle is freed
 and its last execution completed. `opts` may be NULL; its `async_op` is
 ignored (the set-up completes before the call returns). On success
 `*handle` receives a handle to free with `tc_all_gather_p_free`; it
 keeps the comm alive. On `gloo` each execution skips the per-call
 validation and backend checks of `tc_all_gather_single` and, in a
 process without a CUDA driver, its look for device buffers (see
 docs/performance.md); on `nccl` an execution is the plain call on the
 stored arguments. Not thread-safe against `tc_all_gather_p_free` of the
 same handle.
 */
tc_result_t tc_all_gather_p_init(tc_comm_t *comm, void *output, size_t count, tc_dtype_t dt, const tc_op_options_t *opts, tc_all_gather_p_t **handle);

/*
 Runs the persistent all-gather with this rank's `count` elements at
 `input` (which may be this rank's own block of the output: in place).
 Same contract as `tc_all_gather_single` otherwise: every rank executes
 it, in the same order relative to the comm's other operations; `opts`
 may be NULL; `work` may be NULL. The same handle may be executed again
 once the previous execution completed (executions of one comm run in
 issue order). Thread-safe as the comm's operations are.
 */
tc_result_t tc_all_gather_p_exec(tc_all_gather_p_t *handle, const void *input, const tc_op_options_t *opts, tc_work_t **work);

/*
 Frees a persistent all-gather. Executions already issued complete on
 their own (their works stay valid). NULL is ignored; a handle that is not
 live is left alone with a warning and `tc_last_error` set.
 */
void tc_all_gather_p_free(tc_all_gather_p_t *handle);

/*
 Writes to `*handle` the init handle of a comm created with
 `enable_reconfigure`: a NUL-terminated ASCII string naming the job (an
 id kept in the comm's store), the comm's name and a random id of this
 process's comm. It is the same for the comm's lifetime, before and after
 reconfigures, is owned by the comm and valid until `tc_comm_destroy`.
 Publish it to the other processes (through a store, say) for their
 `tc_comm_reconfigure`. A comm created without `enable_reconfigure`:
 `TC_ERR_INVALID_USAGE`. `handle` must not be NULL; untouched on failure.
 Thread-safe; never blocks.
 */
tc_result_t tc_comm_get_init_handle(const tc_comm_t *comm, const char **handle);

/*
 Re-forms `comm` (created with `enable_reconfigure`) in place from the
 processes whose init handles are `init_handles` (`n` NUL-terminated
 strings from `tc_comm_get_init_handle`, copied during the call): their
 comms become one comm of `n` ranks, ranked in list order with
 `form = TC_INIT_HANDLES_LIST`, in the byte order of the handles' text
 with `TC_INIT_HANDLES_SET`. It shrinks (a member left out takes no part:
 it finalizes its comm), grows (a newcomer's comm, created with
 `enable_reconfigure` and never formed, joins), reorders, or forms a comm
 for the first time, as torchcomms' `reconfigure` does.

 Collective over the listed members only: each calls it with the same
 `uuid` (an integer >= 0 naming this reconfigure: the new comm meets in
 the store under `<name>/reconfigure/<uuid>`, so a comm's reconfigures
 need distinct uuids; one this comm already took part in is
 `TC_ERR_INVALID_USAGE`) and the same handles. A member that passed other
 handles, or the same in another order, makes the members that see it
 fail with `TC_ERR_INVALID_USAGE` naming it; a member that does not call
 within the timeout makes the others fail with `TC_ERR_TIMEOUT` naming
 its rank and handle.

 Blocks until the new comm is formed or the timeout passed:
 `opts->timeout_ms` (0 or `TC_UNSET`: the comm's timeout, for a comm
 never formed its creation's). `opts->hints` are the new backend's
 (none: the creation's). `opts` may be NULL; `opts->async_op` must be 0.
 If `work` is not NULL, `*work` receives a completed work handle
 (torchcomms returns one; destroy it with `tc_work_free`).

 On success the handle's rank and size are the new ones; the comm it
 held before is stopped: its outstanding works and window calls fail
 with `TC_ERR_ABORTED` (wait for those that matter first; free its
 windows), while comms split or shrunk from it are separate comms and
 keep working. Its timeout, abort-on-error setting and abort hook carry
 over; operation hooks (`tc_comm_add_hook`) do not. The comm may be
 aborted (after a failure), not finalized. On failure the comm is left as
 it was.

 Refused before any communication, naming the argument: NULL
 `init_handles` (with `n > 0`) or a NULL handle, `TC_ERR_NULL_ARGUMENT`;
 with `TC_ERR_INVALID_ARGUMENT`, `n == 0`, a malformed handle, a handle
 of another job (another store) or of a comm of another name, a handle
 listed twice, this comm's own handle missing, a negative `uuid`, a
 `form` other than the two above. A comm created without
 `enable_reconfigure`: `TC_ERR_INVALID_USAGE`.

 Not to be called concurrently with other calls on `comm` (a call that
 races with it goes to the old comm or the new one).
 */
tc_result_t tc_comm_reconfigure(tc_comm_t *comm, int64_t uuid, const char *const *init_handles, size_t n, int form, const tc_op_options_t *opts, tc_work_t **work);

/*
 Creates a reducer for `n` gradients: `grads[i]` holds `counts[i]`
 elements of `dtypes[i]` (float32, float64, float16 or bfloat16).
 Collective over `comm`: every rank passes the same counts,
 dtypes and options; a difference fails every rank with
 `TC_ERR_INVALID_USAGE` naming the first one. Buckets are assigned as
 DDP does once it knows the backward order: gradients in reverse index
 order, grouped by dtype, each dtype's first bucket closed at
 `first_bucket_bytes`, later ones at `bucket_cap_bytes`. `opts` may be
 NULL (defaults) and is copied; the arrays are read during the call. The
 gradient buffers must stay valid while the reducer lives; the comm handle
 must outlive the reducer. The hook is `TC_HOOK_ALLREDUCE` until changed.
 On success `*out` receives a reducer to free with `tc_reducer_free`.

 Device memory: on an nccl comm the gradients are device memory on the
 comm's device, the buckets are allocated with the comm's allocator
 (`tc_mem_alloc`), and the copies into the buckets, the built-in hooks'
 all-reduces and the copies out are ordered on `opts->stream` (the stream
 the gradients are produced on); `TC_HOOK_ALLREDUCE` divides through
 the all-reduce (PREMUL_SUM by 1/world size); the compressing hooks are
 `TC_ERR_UNSUPPORTED`. On a gloo comm CUDA gradients are copied into host
 buckets on `opts->stream` (synchronized before each hook and before
 finalize returns). A capturing stream is `TC_ERR_UNSUPPORTED` on nccl.
 */
tc_result_t tc_reducer_new(tc_comm_t *comm, void *const *grads, const size_t *counts, const tc_dtype_t *dtypes, size_t n, const tc_reducer_options_t *opts, tc_reducer_t **out);

/*
 Frees the reducer, waiting for the exchanges of an unfinished iteration
 first. NULL is ignored.
 */
void tc_reducer_free(tc_reducer_t *reducer);

/*
 Gradient `grad_index` is final for this iteration. When its bucket is
 complete and every earlier bucket has been launched, the bucket (and any
 later complete ones) is copied in and its hook runs, in bucket order.
 With the built-in `TC_HOOK_ALLREDUCE` on host memory the exchange starts
 earlier, in 2 MiB pieces: each piece goes out once the gradients under
 it are marked and every earlier piece went out (the same operations, in
 the same order, with the same results; a bucket's gradients are copied
 in as its front becomes ready). In both cases the gradient must not
 change until `tc_reducer_finalize` returns.
 `TC_ERR_INVALID_ARGUMENT` for an index out of range,
 `TC_ERR_INVALID_USAGE` for a gradient already marked in this iteration;
 a failing hook's error is returned here and by `tc_reducer_finalize`.
 */
tc_result_t tc_reducer_mark_ready(tc_reducer_t *reducer, size_t grad_index);

/*
 Ends the iteration: launches the buckets not yet launched, checks with
 every rank (one small all-gather) that every gradient was marked and
 every hook ran, waits for every bucket and writes the results into the
 gradients. Gradients never marked fail every rank with
 `TC_ERR_INVALID_USAGE` naming them per rank, a hook's failure fails the
 ranks that saw it with its error and the others with `TC_ERR_REMOTE`
 (a bucket the hook left unusable counts as its failure: a changed
 `count`, or a replaced buffer whose dtype cannot be cast back, is
 `TC_ERR_INVALID_USAGE`, found before anything is written back),
 and a failed exchange (a peer died) fails with its error; on failure
 nothing is written back. Either way the reducer is ready for the next
 iteration. Blocks until done (with device buckets, until the copies out
 on the reducer's stream completed).
 */
tc_result_t tc_reducer_finalize(tc_reducer_t *reducer);

/*
 As `tc_reducer_finalize`, without blocking: the remaining buckets and the
 agreement are issued during the call (taking their place in the comm's
 order), and `*work` receives a work that completes once the results are
 written back (its error is what `tc_reducer_finalize` would return).
 Every later call on the reducer waits for it first; the gradients must
 not be read before it completes. Free the work with `tc_work_free`.
 With device buckets (an nccl comm) the call checks the iteration with
 every rank first (the host waits for the reducer's stream to reach that
 check), then enqueues the copies out on the reducer's stream; the work
 completes when they are done, and `tc_work_wait(work, stream)` makes
 `stream` wait for them without blocking the host.
 */
tc_result_t tc_reducer_finalize_async(tc_reducer_t *reducer, tc_work_t **work);

/*
 Sets a C communication hook (see `tc_comm_hook_fn`) with its `state`,
 passed back on every call. Only between iterations.
 */
tc_result_t tc_reducer_set_hook(tc_reducer_t *reducer, tc_comm_hook_fn hook, void *state);

/*
 Sets a built-in hook (`TC_HOOK_ALLREDUCE`, `TC_HOOK_FP16_COMPRESS`,
 `TC_HOOK_BF16_COMPRESS`, `TC_HOOK_NOOP`, `TC_HOOK_POWERSGD` with default
 options, see `tc_reducer_set_powersgd`). Only between iterations. The
 compressing hooks reject float64 buckets (`TC_ERR_UNSUPPORTED` from the
 hook); on an nccl comm they cast and divide with the library's own PTX
 kernels on the reducer's stream (run on a simulated driver only, never
 on a GPU yet).
 */
tc_result_t tc_reducer_set_builtin_hook(tc_reducer_t *reducer, tc_hook_kind_t kind);

/*
 Writes where gradient `grad_index` lives: the caller's buffer, or with
 `gradient_as_bucket_view` its place in a bucket (NULL for an empty
 gradient), valid while the reducer lives.
 */
tc_result_t tc_reducer_get_grad(tc_reducer_t *reducer, size_t grad_index, void **ptr);

/*
 Writes the number of buckets.
 */
tc_result_t tc_reducer_num_buckets(tc_reducer_t *reducer, size_t *num_buckets);

/*
 Sets the PowerSGD hook (`TC_HOOK_POWERSGD`) with `opts` (NULL:
 `TC_POWERSGD_OPTIONS_INIT`), the algorithm of PyTorch's `powerSGD_hook`.
 For the first `start_iter` iterations every bucket is exchanged as by
 `TC_HOOK_ALLREDUCE`. From then on, per float32 bucket: with error
 feedback the rank's previous compression error is added; each gradient
 worth compressing (see `min_compression_rate`), viewed as a matrix M
 (see `rows`), gets P = M Q with Q orthogonalized (the previous Q with
 warm start, else fresh values from `seed`); one all-reduce (sum) carries
 every P and the uncompressed gradients; then P is orthogonalized
 (Gram-Schmidt), Q = M^T P, a second all-reduce (sum) carries every Q,
 Q /= world size, the bucket gets M = P Q^T and the uncompressed sums /
 world size; the error becomes the bucket before minus after. The second
 all-reduce is issued when `tc_reducer_finalize` waits for the bucket;
 with `tc_reducer_finalize_async` it is issued from the finalize's own
 thread, so issue no other operation on the comm until that work
 completes (the ranks' operation orders could differ).
 Buckets of other dtypes (float16, bfloat16, float64) always take the
 plain all-reduce. Starting values of Q: about standard normal, from
 `seed`, the gradient's index and the iteration, computed without the
 math library so every rank has the same bits (PyTorch draws them from
 its own generator, so the two differ value by value). Orthogonalization
 is always Gram-Schmidt (PyTorch uses QR above rank 2: the same span, and
 the same P Q^T up to rounding). Every rank must pass the same options.
 The hook's state (errors, Q, copies: about twice the buckets' size) is
 freed when the hook is replaced or the reducer freed; a new call starts
 from iteration 0. Only between iterations. `TC_ERR_INVALID_ARGUMENT` for
 a rank of 0, a negative or non-finite rate or epsilon, an epsilon
 outside float32's range, `num_rows` other than the gradient count, or a
 `rows[i]` that does not divide counts[i]; `TC_ERR_UNSUPPORTED` on an nccl comm (device buckets: the
 products would need device kernels). `opts` and its `rows` array are
 copied: the caller keeps ownership and may free them after the call. A
 NULL `reducer`, or NULL `opts.rows` with a non-zero `num_rows`, is
 `TC_ERR_INVALID_ARGUMENT`. Not thread-safe with other calls on the
 reducer.
 */
tc_result_t tc_reducer_set_powersgd(tc_reducer_t *reducer, const tc_powersgd_options_t *opts);

/*
 Creates the comm of the ranks of `comm` not listed in `exclude_ranks`
 (`n` parent ranks, in any order, no duplicates; `exclude_ranks` may be
 NULL when `n == 0`), ranked in their old order. Collective over the
 remaining ranks only: the excluded ones (dead, say) take no part, and
 every remaining rank must pass the same ranks, or every rank that sees a
 different list fails with `TC_ERR_INVALID_USAGE` naming the rank that
 differs (a remaining rank that never calls makes the others fail with
 `TC_ERR_TIMEOUT` after the timeout). A rank that lists itself (an
 excluded rank calling) gets `TC_ERR_INVALID_USAGE`; a rank outside
 `[0, size)` or listed twice is `TC_ERR_INVALID_ARGUMENT`.

 `comm` may be active or aborted (after an operation failed with
 `TC_ERR_REMOTE` or `TC_ERR_TIMEOUT`, or `tc_comm_abort`), not finalized
 (`TC_ERR_INVALID_USAGE`); it is left as it was (finalize or destroy it
 as usual). With abort-on-error on (the default) a failure ends the
 process before it can shrink: ranks meant to survive a peer's death
 create their comms with `abort_on_error = 0` (or run with
 `TORCHCOMM_ABORT_ON_ERROR=0`). Shrinks of one comm into one name are
 counted: the remaining ranks make them alike, in the same order.

 On gloo the remaining ranks meet afresh in the comm's store, which must
 still be reachable: when a rank hosts it (rank 0 under the `MASTER_ADDR`
 bootstrap) that rank cannot be excluded, and the shrink fails with the
 store's error, saying so. On nccl it is `ncclCommShrink` (NCCL 2.27+;
 `TC_ERR_UNSUPPORTED` naming the loaded version otherwise) and needs the
 comm's NCCL comm. Where the loaded NCCL has `ncclCommRevoke` (2.28+), a
 failure the comm detects revokes its NCCL comm instead of aborting it
 (its operations stop; the comm is aborted as usual, or the process with
 abort-on-error), so the survivors can shrink it (`NCCL_SHRINK_ABORT`);
 with an older NCCL a failure aborts the NCCL comm and the shrink is
 `TC_ERR_UNSUPPORTED` naming `ncclCommRevoke` and the version. After
 `tc_comm_abort` of a comm with no failure, nothing is left to shrink
 either (`TC_ERR_UNSUPPORTED`, saying so).

 `name` must be unique among the live comms of this process
 (`TC_ERR_INVALID_ARGUMENT` otherwise, before any communication). `opts`
 may be NULL (inherit timeout and abort-on-error from `comm`); its `name`
 is ignored. On success `*out` is a new comm owned by the caller (destroy
 it with `tc_comm_destroy`); on failure `*out` is untouched. Thread-safe
 with respect to other comms; not to be called concurrently with other
 calls on `comm` that rendezvous (split, shrink, window creation).
 */
tc_result_t tc_comm_shrink(tc_comm_t *comm, const int *exclude_ranks, size_t n, const char *name, const tc_comm_options_t *opts, tc_comm_t **out);

/*
 Sums the sparse tensor `input` across the ranks of `comm` with `op`
 (`TC_SUM`, or `TC_AVG`: the sum divided by the world size, integers
 truncated); every other op gives `TC_ERR_UNSUPPORTED`. Collective, on
 gloo and nccl comms. Algorithm of PyTorch's Gloo sparse all-reduce:
 each rank coalesces its input, the ranks all-gather their metadata, then
 their coalesced indices and values (each entry sent once), and every rank
 merges them into the same coalesced result: indices sorted
 lexicographically and unique, duplicates summed in input order within a
 rank and then in rank order; float16/bfloat16 are summed in float32 and
 rounded once per stage; integers wrap on overflow. Every dtype except
 bool and float8.

 Checks before anything is sent: every index within its dimension's size,
 no count overflows; then, across ranks, sparse_dim, dense_dim, every size,
 dtype and op must agree: a refusal or a mismatch fails the call on every
 rank with a message naming the rank (and the dimension), `*output`
 untouched and nothing allocated.

 `input` and its arrays are read during the call only. On success
 `*output` receives the result, its `shape`, `indices` and `values` arrays
 allocated by the library (never NULL, even when `nnz` is 0), each to
 release with `tc_free` (cast away `const`). Blocking call: written on
 return. `opts->async_op = 1`: the metadata exchange completes during the
 call, the rest runs in the background and `*output` (which must stay
 valid) is written before `*work` completes (a NULL `work` is then
 refused). `opts` may be NULL (defaults). Thread safety and ordering as
 the other operations of `comm`.

 CUDA memory: `indices`, `values` (and `shape`) may be device memory;
 they are copied to the host on `opts->stream`, which the call
 synchronizes. On an nccl comm the result's `indices` and `values` are
 device memory from the comm's allocator, to release with
 `tc_mem_free(comm, ...)`; on a gloo comm whose input `indices` or
 `values` are device memory, they are device memory from `cuMemAlloc` on
 that device (gloo's allocator gives host memory), to release with
 `cuMemFree` (or `cudaFree`). `shape` is host memory for `tc_free` in
 every case. The device arrays are written by copies on `opts->stream`
 that completed when the result is handed over.
 On an nccl comm the metadata, indices and values are all-gathered
 through device memory and coalesced on the host, and the call completes
 before it returns even with `async_op = 1` (the work is then complete).
 */
tc_result_t tc_sparse_all_reduce(tc_comm_t *comm, const tc_sparse_coo_t *input, tc_reduce_op_t op, tc_sparse_coo_t *output, const tc_op_options_t *opts, tc_work_t **work);

/*
 Frees memory the library allocated for the caller (values from
 `tc_store_get_alloc` and `tc_store_compare_set`, the text of
 `tc_comm_dump_flight_recorder`). NULL is ignored.
 Thread-safe.
 */
void tc_free(void *ptr);

/*
 Creates a TCP store speaking PyTorch's TCPStore protocol.

 With `is_server` nonzero, hosts a server in this process on `port` (0:
 any free port; see `tc_store_tcp_port`), listening only on the
 interface(s) of `host` ("127.0.0.1": loopback only; "": every
 interface), and connects to it; the server lives until the handle (and
 every comm using it) is gone. When `TORCHCOMM_STORE_TOKEN` is set, the
 client presents it and a hosted server requires it of every client.
 A lost connection is made again on the next call. Otherwise connects to `host:port`, retrying until
 the timeout. `world_size` -1 does not wait for workers; a positive value
 makes every process ADD 1 to the key `init/` and the server host wait
 until `world_size` joined (torch's behaviour); 0 is rejected.
 `timeout_ms` <= 0 means the library default (`TORCHCOMM_TIMEOUT`); it
 bounds connecting and every get or wait. `host` must be non-NULL.
 On success `*out` receives a handle to free with `tc_store_free`; on
 failure it is untouched (a connect failure names host and port).
 */
tc_result_t tc_store_tcp_new(const char *host, uint16_t port, int is_server, int32_t world_size, int64_t timeout_ms, tc_store_t **out);

/*
 Writes the port of a TCP store (the one its server picked when created
 with port 0). `TC_ERR_INVALID_USAGE` for a file or prefix store.
 Thread-safe.
 */
tc_result_t tc_store_tcp_port(const tc_store_t *store, uint16_t *port);

/*
 Creates a store kept in the file at `path` (created if missing) on a
 filesystem every process shares. `world_size` > 0: the last of that many
 handles to be freed deletes the file; -1: the file is kept. The timeout
 of get and wait is the library default. On success `*out` receives a
 handle to free with `tc_store_free`; on failure it is untouched.
 */
tc_result_t tc_store_file_new(const char *path, int32_t world_size, tc_store_t **out);

/*
 Creates a view of `base` in which every key `k` is `prefix/k` (torch's
 PrefixStore). The new handle keeps the base store alive, so `base` may be
 freed first. `prefix` is copied. On success `*out` receives a handle to
 free with `tc_store_free`; on failure it is untouched.
 */
tc_result_t tc_store_prefix_new(tc_store_t *base, const char *prefix, tc_store_t **out);

/*
 Sets `key` to the `len` bytes at `value` (NULL allowed when `len` is 0),
 waking processes waiting for it. Returns only once the server stored it
 (a TCP store confirms each set). `TC_ERR_INVALID_ARGUMENT` naming the
 limit for a value over 8 MiB or a key over 8 KiB. Thread-safe.
 */
tc_result_t tc_store_set(tc_store_t *store, const char *key, const void *value, size_t len);

/*
 Waits (up to the store's timeout) for `key`, then copies its value into
 `buf`. `*value_len` (when `value_len` is non-NULL) receives the value's
 size whether or not it fits; if `buf_len` is smaller, nothing is copied
 and `TC_ERR_BUFFER_TOO_SMALL` is returned, so a call with `buf` NULL and
 `buf_len` 0 asks for the size. `TC_ERR_TIMEOUT` when the key did not
 appear in time. Thread-safe.
 */
tc_result_t tc_store_get(tc_store_t *store, const char *key, void *buf, size_t buf_len, size_t *value_len);

/*
 Waits (up to the store's timeout) for `key`, then writes a copy of its
 value to `*value` (allocated; release it with `tc_free`; never NULL, even
 for an empty value) and its size to `*len`. Both out-pointers must be
 non-NULL and are untouched on failure. Thread-safe.
 */
tc_result_t tc_store_get_alloc(tc_store_t *store, const char *key, void **value, size_t *len);

/*
 Adds `delta` to the decimal integer stored at `key` (a missing key counts
 as 0) and writes the result to `*new_value` (may be NULL). The stored
 value is ASCII decimal, so a get returns e.g. "6". Thread-safe.
 */
tc_result_t tc_store_add(tc_store_t *store, const char *key, int64_t delta, int64_t *new_value);

/*
 torch's compare_set: if `key` holds `expected`, replace it with `desired`;
 if `key` is missing and `expected_len` is 0, set it to `desired`; if it is
 missing and `expected` is not empty, store nothing. Values over 8 MiB are
 refused with `TC_ERR_INVALID_ARGUMENT`. `*current` receives
 an allocated copy (free with `tc_free`) of the value now current, or of
 `expected` in the last case, and `*current_len` its size. Buffers may be
 NULL when their length is 0. Thread-safe.
 */
tc_result_t tc_store_compare_set(tc_store_t *store, const char *key, const void *expected, size_t expected_len, const void *desired, size_t desired_len, void **current, size_t *current_len);

/*
 Writes 1 to `*ready` when all `n` keys exist, else 0, without waiting.
 `keys` may be NULL when `n` is 0. Thread-safe.
 */
tc_result_t tc_store_check(tc_store_t *store, const char *const *keys, size_t n, int *ready);

/*
 Waits until all `n` keys exist. `timeout_ms` <= 0 means the store's
 timeout. On expiry returns `TC_ERR_TIMEOUT` ("wait timeout after {ms}ms,
 keys: /k") and the store stays usable. Thread-safe; a waiting call holds
 its TCP connection, so other threads' calls on the same handle queue
 behind it.
 */
tc_result_t tc_store_wait(tc_store_t *store, const char *const *keys, size_t n, int64_t timeout_ms);

/*
 Deletes `key`; `*deleted` (may be NULL) receives 1 when it existed, else
 0. Thread-safe.
 */
tc_result_t tc_store_delete(tc_store_t *store, const char *key, int *deleted);

/*
 Writes the number of keys in the whole store to `*n` (a TCP store counts
 the `init/` key of wait-for-workers too, as torch does). Thread-safe.
 */
tc_result_t tc_store_num_keys(tc_store_t *store, int64_t *n);

/*
 Frees a store handle; NULL is ignored. A hosted server stays up while
 prefix stores or comms created from this handle still use it. Must not
 race with other calls on the same handle. A handle that is not a live
 store (freed already) is left alone with a warning and `tc_last_error`
 set.
 */
void tc_store_free(tc_store_t *store);

/*
 Creates a store served by the application's functions in `*callbacks`
 (copied during the call; see `tc_store_callbacks_t`): how a store the
 library does not speak itself (torch's FileStore or HashStore, a store
 written in Python) serves `tc_comm_new` and the other `tc_store_*` calls.
 `callbacks` must be non-NULL with `set`, `get`, `add`, `check` and `wait`
 set (`TC_ERR_NULL_ARGUMENT` naming the missing one otherwise).

 Threads: the library calls the functions from any thread, its own
 included (a comm's bootstrap, failure diagnosis), several at once, so
 they and `user_data` must be thread-safe. A get or wait may block up to
 its timeout. A callback must not free the store it serves.

 Ownership: on success `*out` receives a handle to free with
 `tc_store_free`; `user_data` then belongs to the store, and `destroy`
 (if set) is called once with it when the handle and everything created
 with it (prefix stores, comms) are gone. On failure `*out` is untouched
 and `destroy` is not called.
 */
tc_result_t tc_store_new_callbacks(const tc_store_callbacks_t *callbacks, tc_store_t **out);

/*
 Called by a store callback (get, compare_set) to answer its value: the
 `len` bytes at `value` (NULL allowed when `len` is 0) are copied; a
 second call replaces the first. `reply` is the one the callback was
 given, valid only during that call. Values over 8 MiB are refused.
 */
tc_result_t tc_store_reply_value(tc_store_reply_t *reply, const void *value, size_t len);

/*
 Called by a store callback that fails, before returning its error code:
 `message` (NUL-terminated, copied) becomes the detail of the error the
 library reports (`tc_last_error`), after the operation and key. `reply`
 is the one the callback was given, valid only during that call.
 */
tc_result_t tc_store_reply_error(tc_store_reply_t *reply, const char *message);

/*
 Writes the size in bytes of one element of `dtype` to `*size`. Returns
 `TC_ERR_INVALID_ARGUMENT` for an unknown dtype, `TC_ERR_NULL_ARGUMENT` for
 a NULL `size`; nothing is written on failure. Thread-safe.
 */
tc_result_t tc_dtype_size(tc_dtype_t dtype, size_t *size);

/*
 Creates a one-sided window on `comm`; free it with `tc_window_free`.

 Collective: every rank of the comm creates its windows in the same order.
 The window keeps the comm's resources alive until it is freed. Fails with
 `TC_ERR_UNSUPPORTED` on the `nccl` backend, whose message names the
 loaded NCCL's version, the version its host RMA API needs (2.29) and the
 entry points it lacks (windows over that API are not implemented yet),
 and on a finalized or aborted comm. `*window` is written only on success.
 */
tc_result_t tc_window_new(tc_comm_t *comm, tc_window_t **window);

/*
 Registers `bytes` bytes at `buf` as this rank's window memory, which
 other ranks then write with `tc_window_put`.

 Collective over the window's comm; sizes may differ between ranks. One
 buffer at a time: deregister before registering another. Signals that
 were never waited for are dropped by the next registration. The buffer must
 stay valid until `tc_window_deregister` (or `tc_window_free`) returns.
 `buf` must not be NULL and `bytes` must not be 0.
 */
tc_result_t tc_window_register(tc_window_t *window, void *buf, size_t bytes);

/*
 Ends the registration of this rank's buffer.

 Collective: it first waits for this rank's outstanding asynchronous puts
 and signals (each has landed or failed; their work handles say which),
 then deregisters. Every put issued before any rank's deregister has
 landed when it returns, and no later put lands in the buffer.
 Outstanding `tc_window_wait_signal` calls are not waited for.
 */
tc_result_t tc_window_deregister(tc_window_t *window);

/*
 Writes `bytes` bytes from `src` into `dst_rank`'s registered buffer at
 byte offset `dst_offset`, without `dst_rank`'s application taking part.

 The target sees the data once it has waited for a later
 `tc_window_signal` from this rank (`tc_window_wait_signal`); puts from
 one origin to one target land in order, puts from different origins in
 no defined order. `dst_offset + bytes` beyond the target's registered
 size fails with `TC_ERR_INVALID_ARGUMENT` naming both. `bytes = 0` does
 nothing, whatever `dst_offset` (as MPI's zero counts). A put to this
 rank itself is a copy. `opts` may be NULL (defaults; `timeout_ms`
 applies, `stream` is ignored).

 With `opts.async_op = 0` the call returns when the put is complete and
 `src` may be reused. With `opts.async_op = 1` it checks its arguments
 (ranks, bounds, a registered buffer, an active comm, `src`: these fail
 the call itself), queues the put and returns at once; `src` must then
 stay valid and unchanged until the put's work completes
 (`tc_work_wait`), and the put's own failure (`TC_ERR_TIMEOUT`,
 `TC_ERR_REMOTE`, ...) is reported by its work. Puts and signals of this
 rank run in issue order, asynchronous or not: a blocking call issued
 after asynchronous ones waits for them. `*work`, when `work` is not NULL,
 receives a work handle (completed for a blocking call) to free with
 `tc_work_free`; freeing it early does not cancel the put. With `work`
 NULL an asynchronous put still runs; `tc_window_deregister` and
 `tc_comm_finalize` wait for it, and `tc_comm_abort` ends it with
 `TC_ERR_ABORTED`. Like the comm's operations, a window call (blocking
 or not) is watched by the comm's watchdog: one still running past its
 timeout (plus the backend's grace) fails with `TC_ERR_TIMEOUT` naming
 the call and its window, and the comm is aborted. Thread-safe.
 */
tc_result_t tc_window_put(tc_window_t *window, const void *src, size_t bytes, int32_t dst_rank, size_t dst_offset, const tc_op_options_t *opts, tc_work_t **work);

/*
 Reads `bytes` bytes at byte offset `src_offset` of `src_rank`'s
 registered buffer into `dst`, without `src_rank`'s application taking
 part.

 Ordering: the get reads after every put this rank issued to `src_rank`
 before it (asynchronous ones included: gets queue with this rank's puts
 and signals, in issue order), so a rank reads back what it wrote. Puts
 of other ranks to `src_rank` are seen only once they are known to have
 landed (for example after `src_rank` waited for their signals and told
 this rank so). On the `gloo` backend a get from this rank itself, or
 from a same-host rank whose buffer lies in `tc_mem_alloc` memory, is a
 memory copy; from any other rank it is a request answered by that
 rank's window service (a message each way).

 `dst` must not be NULL when `bytes > 0` (`TC_ERR_INVALID_ARGUMENT`
 naming `dst`); `src_rank` must be a rank of the comm (naming
 `src_rank`); `src_offset + bytes` must not overflow nor pass the end of
 `src_rank`'s registered size (naming `src_offset`, with both numbers).
 A buffer must be registered on this rank (`TC_ERR_INVALID_USAGE`).
 `bytes = 0` does nothing, whatever `src_offset`. `opts` may be NULL
 (defaults; `timeout_ms` applies, `stream` is ignored).

 With `opts.async_op = 0` the call returns when the bytes are in `dst`.
 With `opts.async_op = 1` it checks its arguments, queues the get and
 returns at once; `dst` must then stay valid, and must not be read or
 written, until the get's work completes (`tc_work_wait`), which reports
 the get's own failure (`TC_ERR_TIMEOUT`, `TC_ERR_REMOTE`, ...). A
 timeout or a lost peer leaves the window unusable, as for a put. `work`
 as for `tc_window_put`. Thread-safe. Ownership: `dst` stays the caller's.
 */
tc_result_t tc_window_get(tc_window_t *window, void *dst, size_t bytes, int32_t src_rank, size_t src_offset, const tc_op_options_t *opts, tc_work_t **work);

/*
 Sends one signal to `peer`; it arrives after every put this rank issued
 to `peer` before it, including asynchronous puts not yet complete when
 the signal is issued.

 `opts` and `work` as for `tc_window_put` (`async_op = 1`: queued behind
 this rank's earlier puts and signals, returns at once). Thread-safe.
 */
tc_result_t tc_window_signal(tc_window_t *window, int32_t peer, const tc_op_options_t *opts, tc_work_t **work);

/*
 Waits for one signal from `peer` and consumes it; when it returns, every
 put `peer` issued to this rank before that signal is in this rank's
 buffer.

 Each signal satisfies one wait. Fails with `TC_ERR_TIMEOUT` when no
 signal arrives within the operation's timeout (`opts.timeout_ms`, 0 or
 unset: the comm's), and with `TC_ERR_REMOTE` when `peer` is gone. `opts`
 and `work` as for `tc_window_put`. With `async_op = 1` the wait is queued
 and the call returns at once; its outcome (and the data's arrival) is
 known when its work completes. Waits run in issue order among
 themselves, apart from puts and signals: an outstanding wait never holds
 up this rank's puts or signals. A wait still pending when the window is
 freed or its comm aborted ends with `TC_ERR_ABORTED`; `tc_comm_finalize`
 waits for it (up to its timeout). Thread-safe.
 */
tc_result_t tc_window_wait_signal(tc_window_t *window, int32_t peer, const tc_op_options_t *opts, tc_work_t **work);

/*
 Gives a local pointer to `rank`'s registered buffer, where the memory is
 reachable from this process: always this rank's own buffer;
 `TC_ERR_UNSUPPORTED` for other ranks on the `gloo` backend (no shared
 memory). `*ptr` is written only on success and stays valid until the
 buffer is deregistered.
 */
tc_result_t tc_window_map_remote(tc_window_t *window, int32_t rank, void **ptr);

/*
 Frees a window. Free it after `tc_window_deregister`: freeing a window
 that is still registered ends its service at once, and the peers'
 windows then fail with `TC_ERR_REMOTE`. Asynchronous calls still
 outstanding end with an error: calls still queued and a pending wait
 with `TC_ERR_ABORTED` (the window was freed, or closed), a put or signal
 in flight with `TC_ERR_ABORTED` or the error its closed connection
 gave. Their work handles stay valid until freed. Not to be called while
 another thread is inside a call on the same window. NULL is ignored; a
 handle that is not a live window (freed already) is left alone with a
 warning and `tc_last_error` set.
 */
void tc_window_free(tc_window_t *window);

/*
 Writes 1 to `*done` when the operation has finished (successfully or not),
 else 0. Never blocks. Thread-safe.
 */
tc_result_t tc_work_is_completed(const tc_work_t *work, int *done);

/*
 Writes the operation's status (`TC_WORK_NOT_STARTED` ... `TC_WORK_ERROR`)
 to `*status`. Never blocks. Thread-safe.
 */
tc_result_t tc_work_status(const tc_work_t *work, int32_t *status);

/*
 Writes to `*rank` the rank whose message the receive of `work` took:
 for a receive from `TC_ANY_SOURCE`, the sender it matched; for a
 receive naming its peer, that peer. This is how a caller learns the
 sender of an any-source receive, blocking or not: ask `tc_recv` for
 the work (with `async_op = 0` it is complete when `tc_recv` returns).
 Fails with `TC_ERR_INVALID_USAGE`, `*rank` untouched, when the work is
 not of a `tc_recv` (a send, a batch, a collective: "not a receive") or
 has not completed successfully (the message names its status:
 not started, in progress, timed out, failed). NULL `work` or `rank`:
 `TC_ERR_NULL_ARGUMENT` naming it; a handle that is not a live work:
 `TC_ERR_INVALID_ARGUMENT`. Never blocks. Thread-safe; the handle stays
 owned by the caller. No stream ordering: it reads what the host knows
 of the work (a device receive counts as completed once
 `tc_work_is_completed` says so).
 */
tc_result_t tc_work_source(const tc_work_t *work, int32_t *rank);

/*
 Waits for the operation. Host operations: returns when it finished.
 CUDA operations: makes `stream` (NULL: the legacy default stream) wait
 for it and returns at once. Returns the operation's error if it failed
 (`TC_ERR_TIMEOUT`, `TC_ERR_REMOTE`, `TC_ERR_ABORTED`, ...). Thread-safe.
 */
tc_result_t tc_work_wait(const tc_work_t *work, void *stream);

/*
 Blocks the calling thread until the operation finished; returns its error
 if it failed. Thread-safe.
 */
tc_result_t tc_work_wait_blocking(const tc_work_t *work);

/*
 Releases the handle. NULL is ignored; a handle that is not a live work
 (freed already, another handle type) is left alone with a warning and
 `tc_last_error` set ("not a live tc_work_t"). The operation itself still runs to
 completion; its buffers must stay valid until it does.
 */
void tc_work_free(tc_work_t *work);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* TORCHCOMM_H */
