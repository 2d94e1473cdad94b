//! `tc_broadcast_coalesced`: many buffers broadcast in a few messages.

use crate::coalesced::{broadcast_coalesced, Buffer};
use crate::comm::Ptr;
use crate::error::tc_result_t;
use crate::ffi::arg_slice;
use crate::ffi::comm::tc_comm_t;
use crate::ffi::comm_ops::{collective_boundary, hand_out_work, op_options};
use crate::ffi::work::tc_work_t;
use crate::options::tc_op_options_t;
use crate::types::{tc_dtype_t, DType};
use std::ffi::{c_int, c_void};

/// Broadcasts root's `bufs[i]` (`counts[i]` elements of `dtypes[i]`) into
/// every rank's, as c10d's `broadcast_coalesced` does: buffers
/// are grouped by dtype, in list order, into buckets of at most
/// `buffer_bytes` bytes (a larger buffer is a bucket of its own), each bucket
/// is packed into one staging buffer, broadcast as one message and unpacked;
/// empty buffers are skipped. Collective: every rank passes the same `n`,
/// `counts`, `dtypes`, `buffer_bytes` and `root`; a difference fails every
/// rank with `TC_ERR_INVALID_USAGE` naming the first difference, and no
/// buffer is written. The check is one 16-byte all-reduce, done during the
/// call even with `async_op = 1`.
///
/// With `async_op = 0` the call returns when every buffer holds root's data
/// and at most two buckets are staged at a time. With `async_op = 1` every
/// bucket is staged and enqueued before the call returns (so later
/// operations on the comm follow it in the same order on every rank) and the
/// buffers are written when the work completes. `*work` (may be NULL when
/// not wanted) receives one work for the whole call, to free with
/// `tc_work_free`. The arrays are read during the call only; the buffers
/// must stay valid until the work completes. Thread-safe as the other
/// operations.
///
/// Device memory. On an nccl comm the buffers are device memory and the
/// call is stream-ordered: the list check runs on `opts->stream` (the host
/// waits for it), then the packing into a staging buffer from the comm's
/// allocator (`tc_mem_alloc`), one broadcast per bucket and the unpacking
/// are enqueued on `opts->stream` (`async_op = 0`, the call returns once
/// enqueued) or on a stream of the call's own that waits for
/// `opts->stream` (`async_op = 1`; `tc_work_wait` makes a stream wait for
/// the work). On a gloo comm CUDA buffers are copied to and from host
/// staging on `opts->stream`, which the call synchronizes. A capturing
/// stream is `TC_ERR_UNSUPPORTED` on nccl.
#[no_mangle]
pub extern "C" fn tc_broadcast_coalesced(
    comm: *mut tc_comm_t,
    bufs: *const *mut c_void,
    counts: *const usize,
    dtypes: *const tc_dtype_t,
    n: usize,
    buffer_bytes: usize,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    collective_boundary("tc_broadcast_coalesced", comm, |comm| {
        let ptrs = unsafe { arg_slice(bufs, n, "bufs")? };
        let counts = unsafe { arg_slice(counts, n, "counts")? };
        let dtypes = unsafe { arg_slice(dtypes, n, "dtypes")? };
        let opts = unsafe { op_options(opts)? };
        let list = (0..n)
            .map(|i| {
                Ok(Buffer {
                    ptr: Ptr(ptrs[i]),
                    count: counts[i],
                    dtype: DType::from_c(dtypes[i], &format!("dtypes[{i}]"))?,
                })
            })
            .collect::<crate::error::Result<Vec<_>>>()?;
        let comm = comm.inner()?;
        let done = broadcast_coalesced(comm, list, buffer_bytes, root, &opts)?;
        hand_out_work(work, done, comm);
        Ok(())
    })
}
