//! The operations (`tc_send`, `tc_all_reduce`, ..., batches of p2p).
//!
//! Every operation returns when it is enqueued (`async_op = 1`) or, with
//! `async_op = 0`, when host buffers are complete / device work is on the
//! caller's stream. Buffers must stay valid until the work completes.

use crate::comm::{Comm, Op, OpOptions, P2p, Ptr};
use crate::error::{tc_result_t, Error, Result};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::work::tc_work_t;
use crate::ffi::{
    arg_out, arg_slice, boundary, boundary_void, handle_mut, handle_ref, into_handle, take_handle,
};
use crate::options::{read_versioned, tc_op_options_t, timeout_from_ms};
use crate::types::{hints_from_c, tc_dtype_t, tc_reduce_op_t, DType, ReduceOp};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// A batch of sends and receives issued together by `tc_batch_issue`.
/// Not thread-safe: build a batch from one thread.
pub struct tc_batch {
    comm: Arc<Comm>,
    ops: Vec<P2p>,
}

pub type tc_batch_t = tc_batch;

impl Handle for tc_batch {
    const TYPE: HandleType = HandleType::Batch;
}

/// The options of a call that takes no tag: a non-zero `opts.tag` is
/// refused.
pub(crate) unsafe fn op_options(p: *const tc_op_options_t) -> Result<OpOptions> {
    let (opts, tag) = op_options_and_tag(p)?;
    refuse_tag(tag)?;
    Ok(opts)
}

fn refuse_tag(tag: u32) -> Result<()> {
    if tag == 0 {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "argument 'opts.tag': {tag}: only tc_send and tc_recv take a tag (batch entries \
         carry their own: tc_batch_send_tagged, tc_batch_recv_tagged)"
    )))
}

/// `op` with the caller's tag: on a send or receive, refused elsewhere.
fn with_tag(mut op: Op, tag: u32) -> Result<Op> {
    match &mut op {
        Op::Send { tag: t, .. } | Op::Recv { tag: t, .. } => *t = tag,
        _ => refuse_tag(tag)?,
    }
    Ok(op)
}

unsafe fn op_options_and_tag(p: *const tc_op_options_t) -> Result<(OpOptions, u32)> {
    let o = read_versioned(p, "opts")?;
    let async_op = match o.async_op {
        0 => false,
        1 => true,
        v => {
            return Err(Error::invalid_argument(format!(
                "argument 'opts.async_op': {v} is not 0 or 1"
            )))
        }
    };
    let opts = OpOptions {
        async_op,
        timeout: timeout_from_ms(o.timeout_ms),
        stream: o.stream,
        hints: hints_from_c(o.hints, o.num_hints, "opts.hints")?,
    };
    Ok((opts, o.tag))
}

/// Shared body of every operation: reads the options, builds and submits
/// the operation, hands out the work handle if asked.
fn issue(
    func: &'static str,
    comm: *mut tc_comm_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
    build: impl FnOnce(&Comm) -> Result<Op>,
) -> tc_result_t {
    boundary(func, || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        let (opts, tag) = unsafe { op_options_and_tag(opts)? };
        let op = with_tag(build(&comm.inner)?, tag)?;
        let w = comm.inner.submit(op, &opts)?;
        hand_out_work(work, w, &comm.inner);
        Ok(())
    })
}

/// Gives the caller a handle to `w` when it asked for one (`out` non-NULL);
/// the handle keeps `comm` alive.
pub(crate) fn hand_out_work(
    out: *mut *mut tc_work_t,
    w: Arc<dyn crate::work::Work>,
    comm: &Arc<Comm>,
) {
    if !out.is_null() {
        unsafe {
            *out = into_handle(crate::ffi::work::tc_work {
                inner: w,
                _comm: comm.clone(),
            })
        };
    }
}

fn dtype(dt: tc_dtype_t) -> Result<DType> {
    DType::from_c(dt, "dtype")
}

fn reduce_op(op: &tc_reduce_op_t) -> Result<ReduceOp> {
    ReduceOp::from_c(op, "op")
}

/// Reads one pointer per rank.
unsafe fn ptr_list<T>(p: *const *mut T, n: usize, arg: &str) -> Result<Vec<Ptr>> {
    Ok(arg_slice(p, n, arg)?
        .iter()
        .map(|b| Ptr(*b as *mut c_void))
        .collect())
}

unsafe fn count_list(p: *const usize, n: usize, arg: &str) -> Result<Vec<usize>> {
    Ok(arg_slice(p, n, arg)?.to_vec())
}

/// Sends `count` elements at `buf` to rank `peer`; pairs with the receive
/// of `peer` with the same tag (`opts->tag`, version 2 of the options; 0
/// when unset). Matching is by (peer, tag); sends and receives of one
/// (peer, tag) pair up in issue order. Operations of a comm run in issue
/// order (as on NCCL), so a receive waits for the send of its tag even if
/// the peer issues that send after others: a tag selects among transfers in
/// flight together (a batch), and never lets a receive take the data of a
/// send with another tag. On `nccl`, a non-zero tag is refused
/// (`TC_ERR_UNSUPPORTED`: NCCL matches by peer and order only).
/// `work` may be NULL. `opts` may be NULL (defaults).
#[no_mangle]
pub extern "C" fn tc_send(
    comm: *mut tc_comm_t,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_send", comm, opts, work, |_| {
        Ok(Op::Send {
            buf: Ptr(buf as *mut c_void),
            count,
            dtype: dtype(dt)?,
            peer,
            tag: 0,
        })
    })
}

/// Receives `count` elements from rank `peer` into `buf`, from the send of
/// `peer` with the same tag (`opts->tag`; see `tc_send`). The sizes of a
/// send/recv pair must agree (`TC_ERR_INVALID_USAGE` otherwise).
#[no_mangle]
pub extern "C" fn tc_recv(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_recv", comm, opts, work, |_| {
        Ok(Op::Recv {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            peer,
            tag: 0,
        })
    })
}

/// Starts an empty batch of point-to-point operations on `comm`. Free it with
/// `tc_batch_free` (after `tc_batch_issue` or instead of it).
#[no_mangle]
pub extern "C" fn tc_batch_begin(comm: *mut tc_comm_t, batch: *mut *mut tc_batch_t) -> tc_result_t {
    boundary("tc_batch_begin", || {
        let (comm, out) = unsafe { (handle_ref(comm, "comm")?, arg_out(batch, "batch")?) };
        *out = into_handle(tc_batch {
            comm: comm.inner.clone(),
            ops: Vec::new(),
        });
        Ok(())
    })
}

/// Adds the entry `build` makes to the batch (its errors leave it as it was).
fn batch_add(
    func: &'static str,
    batch: *mut tc_batch_t,
    build: impl FnOnce() -> Result<P2p>,
) -> tc_result_t {
    boundary(func, || {
        let batch = unsafe { handle_mut(batch, "batch")? };
        batch.ops.push(build()?);
        Ok(())
    })
}

/// One batch entry.
fn entry(
    is_send: bool,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    tag: u32,
) -> Result<P2p> {
    Ok(P2p {
        is_send,
        buf: Ptr(buf as *mut c_void),
        count,
        dtype: dtype(dt)?,
        peer,
        tag,
    })
}

/// Adds a send of `count` elements at `buf` to `peer` to the batch (tag 0).
#[no_mangle]
pub extern "C" fn tc_batch_send(
    batch: *mut tc_batch_t,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
) -> tc_result_t {
    batch_add("tc_batch_send", batch, || {
        entry(true, buf, count, dt, peer, 0)
    })
}

/// Adds a receive of `count` elements from `peer` into `buf` to the batch
/// (tag 0).
#[no_mangle]
pub extern "C" fn tc_batch_recv(
    batch: *mut tc_batch_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
) -> tc_result_t {
    batch_add("tc_batch_recv", batch, || {
        entry(false, buf, count, dt, peer, 0)
    })
}

/// Adds a send of `count` elements at `buf` to `peer` with tag `tag` to the
/// batch: it matches the receive of `peer` with the same tag, whatever the
/// order of the entries in either rank's batch (the entries of a batch are
/// in flight together). Entries of one (peer, tag) pair up in order. On
/// `nccl`, a non-zero tag makes `tc_batch_issue` fail with
/// `TC_ERR_UNSUPPORTED`. `tc_batch_send` is this with tag 0.
#[no_mangle]
pub extern "C" fn tc_batch_send_tagged(
    batch: *mut tc_batch_t,
    buf: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    tag: u32,
) -> tc_result_t {
    batch_add("tc_batch_send_tagged", batch, || {
        entry(true, buf, count, dt, peer, tag)
    })
}

/// Adds a receive of `count` elements from `peer` into `buf`, matching the
/// send of `peer` with tag `tag` (see `tc_batch_send_tagged`).
/// `tc_batch_recv` is this with tag 0.
#[no_mangle]
pub extern "C" fn tc_batch_recv_tagged(
    batch: *mut tc_batch_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    peer: c_int,
    tag: u32,
) -> tc_result_t {
    batch_add("tc_batch_recv_tagged", batch, || {
        entry(false, buf, count, dt, peer, tag)
    })
}

/// Issues every operation of the batch as one operation with one work. The
/// batch stays owned by the caller (free it with `tc_batch_free`) and is
/// emptied.
#[no_mangle]
pub extern "C" fn tc_batch_issue(
    batch: *mut tc_batch_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    boundary("tc_batch_issue", || {
        let batch = unsafe { handle_mut(batch, "batch")? };
        let op_opts = unsafe { op_options(opts)? };
        let w = batch.comm.submit(
            Op::Batch {
                ops: std::mem::take(&mut batch.ops),
            },
            &op_opts,
        )?;
        hand_out_work(work, w, &batch.comm);
        Ok(())
    })
}

/// Frees a batch. NULL is ignored; a handle that is not a live batch (freed
/// already) is left alone with a warning and `tc_last_error` set.
#[no_mangle]
pub extern "C" fn tc_batch_free(batch: *mut tc_batch_t) {
    boundary_void("tc_batch_free", || {
        drop(unsafe { take_handle(batch, "batch")? });
        Ok(())
    })
}

/// Broadcasts `count` elements of `buf` from `root` to every rank, in place.
#[no_mangle]
pub extern "C" fn tc_broadcast(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_broadcast", comm, opts, work, |_| {
        Ok(Op::Broadcast {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            root,
        })
    })
}

/// Reduces `buf` across ranks with `op`, in place; the result is defined on
/// `root` only.
#[no_mangle]
pub extern "C" fn tc_reduce(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce", comm, opts, work, |_| {
        Ok(Op::Reduce {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            root,
            op: reduce_op(&op)?,
        })
    })
}

/// Reduces `buf` across ranks with `op`, in place, on every rank.
#[no_mangle]
pub extern "C" fn tc_all_reduce(
    comm: *mut tc_comm_t,
    buf: *mut c_void,
    count: usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_reduce", comm, opts, work, |_| {
        Ok(Op::AllReduce {
            buf: Ptr(buf),
            count,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Gathers `count` elements of `input` from every rank into `outputs[r]`
/// (an array of size-of-comm buffers of `count` elements each).
#[no_mangle]
pub extern "C" fn tc_all_gather(
    comm: *mut tc_comm_t,
    outputs: *const *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_gather", comm, opts, work, |c| {
        let outputs = unsafe { ptr_list(outputs, c.size() as usize, "outputs")? };
        Ok(Op::AllGather {
            outputs,
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// Gathers `count` elements of `input` from every rank into `output`
/// (`count * size` elements, rank r's at offset `r * count`).
#[no_mangle]
pub extern "C" fn tc_all_gather_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_gather_single", comm, opts, work, |_| {
        Ok(Op::AllGatherSingle {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// Gathers `counts[r]` elements from each rank r into `output`, in rank order
/// (`sum(counts)` elements). `counts` has one entry per rank and must be the
/// same on every rank; this rank's `input` has `counts[rank]` elements.
#[no_mangle]
pub extern "C" fn tc_all_gather_v(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    counts: *const usize,
    input: *const c_void,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_gather_v", comm, opts, work, |c| {
        let counts = unsafe { count_list(counts, c.size() as usize, "counts")? };
        Ok(Op::AllGatherV {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            counts,
            dtype: dtype(dt)?,
        })
    })
}

/// Reduces `inputs[r]` (one buffer of `count` elements per rank) across
/// ranks with `op`; rank r receives block r in `output`.
#[no_mangle]
pub extern "C" fn tc_reduce_scatter(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    inputs: *const *const c_void,
    count: usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce_scatter", comm, opts, work, |c| {
        let inputs =
            unsafe { ptr_list(inputs as *const *mut c_void, c.size() as usize, "inputs")? };
        Ok(Op::ReduceScatter {
            output: Ptr(output),
            inputs,
            count,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Reduces `input` (`count * size` elements) across ranks with `op`; rank r
/// receives the `count` elements of block r in `output`.
#[no_mangle]
pub extern "C" fn tc_reduce_scatter_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce_scatter_single", comm, opts, work, |_| {
        Ok(Op::ReduceScatterSingle {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Reduces `input` (`sum(counts)` elements, block r `counts[r]` long) across
/// ranks with `op`; rank r receives block r (`counts[r]` elements) in
/// `output`. `counts` must be the same on every rank.
#[no_mangle]
pub extern "C" fn tc_reduce_scatter_v(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    counts: *const usize,
    dt: tc_dtype_t,
    op: tc_reduce_op_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_reduce_scatter_v", comm, opts, work, |c| {
        let counts = unsafe { count_list(counts, c.size() as usize, "counts")? };
        Ok(Op::ReduceScatterV {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            counts,
            dtype: dtype(dt)?,
            op: reduce_op(&op)?,
        })
    })
}

/// Sends `inputs[r]` to rank r and receives rank r's block into `outputs[r]`
/// (`count` elements each; one buffer per rank in each list).
#[no_mangle]
pub extern "C" fn tc_all_to_all(
    comm: *mut tc_comm_t,
    outputs: *const *mut c_void,
    inputs: *const *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_to_all", comm, opts, work, |c| {
        let n = c.size() as usize;
        let outputs = unsafe { ptr_list(outputs, n, "outputs")? };
        let inputs = unsafe { ptr_list(inputs as *const *mut c_void, n, "inputs")? };
        Ok(Op::AllToAll {
            outputs,
            inputs,
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// All-to-all on contiguous buffers: block r of `input` (`count` elements)
/// goes to rank r; block r of `output` comes from rank r.
#[no_mangle]
pub extern "C" fn tc_all_to_all_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_to_all_single", comm, opts, work, |_| {
        Ok(Op::AllToAllSingle {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
        })
    })
}

/// All-to-all with per-rank counts (elements): `input_counts[r]` elements of
/// `input` go to rank r, `output_counts[r]` elements from rank r land in
/// `output`; blocks are contiguous in rank order. Each pair of counts must
/// agree between sender and receiver.
#[no_mangle]
pub extern "C" fn tc_all_to_all_v_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    output_counts: *const usize,
    input: *const c_void,
    input_counts: *const usize,
    dt: tc_dtype_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_all_to_all_v_single", comm, opts, work, |c| {
        let n = c.size() as usize;
        Ok(Op::AllToAllVSingle {
            output: Ptr(output),
            output_counts: unsafe { count_list(output_counts, n, "output_counts")? },
            input: Ptr(input as *mut c_void),
            input_counts: unsafe { count_list(input_counts, n, "input_counts")? },
            dtype: dtype(dt)?,
        })
    })
}

/// Returns (or completes its work) when every rank has entered the barrier.
#[no_mangle]
pub extern "C" fn tc_barrier(
    comm: *mut tc_comm_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_barrier", comm, opts, work, |_| Ok(Op::Barrier))
}

/// Sends `inputs[r]` (on `root`: one buffer of `count` elements per rank) to
/// rank r's `output`. `inputs` is ignored and may be NULL on other ranks.
#[no_mangle]
pub extern "C" fn tc_scatter(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    inputs: *const *const c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_scatter", comm, opts, work, |c| {
        let inputs = if c.rank() == root {
            unsafe { ptr_list(inputs as *const *mut c_void, c.size() as usize, "inputs")? }
        } else {
            Vec::new()
        };
        Ok(Op::Scatter {
            output: Ptr(output),
            inputs,
            count,
            dtype: dtype(dt)?,
            root,
        })
    })
}

/// Gathers `count` elements of `input` from every rank into `outputs[r]` on
/// `root`. `outputs` is ignored and may be NULL on other ranks.
#[no_mangle]
pub extern "C" fn tc_gather(
    comm: *mut tc_comm_t,
    outputs: *const *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_gather", comm, opts, work, |c| {
        let outputs = if c.rank() == root {
            unsafe { ptr_list(outputs, c.size() as usize, "outputs")? }
        } else {
            Vec::new()
        };
        Ok(Op::Gather {
            outputs,
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
            root,
        })
    })
}

/// Gathers `count` elements of `input` from every rank into `output` on
/// `root`: `count * size` elements, rank r's at offset `r * count` (rank
/// order, as `tc_all_gather_single` lays them out). `output` is ignored and
/// may be NULL on other ranks. In place on the root: `input` may be the
/// root's own block of `output` (`output + root * count`). On `nccl` it
/// runs as grouped sends and receives (NCCL has no gather).
#[no_mangle]
pub extern "C" fn tc_gather_single(
    comm: *mut tc_comm_t,
    output: *mut c_void,
    input: *const c_void,
    count: usize,
    dt: tc_dtype_t,
    root: c_int,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    issue("tc_gather_single", comm, opts, work, |_| {
        Ok(Op::GatherSingle {
            output: Ptr(output),
            input: Ptr(input as *mut c_void),
            count,
            dtype: dtype(dt)?,
            root,
        })
    })
}
