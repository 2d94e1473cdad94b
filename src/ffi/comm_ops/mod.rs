//! The operations (`tc_send`, `tc_all_reduce`, ..., batches of p2p).
//!
//! Every operation returns when it is enqueued (`async_op = 1`) or, with
//! `async_op = 0`, when host buffers are complete / device work is on the
//! caller's stream. Buffers must stay valid until the work completes.

use crate::comm::{Comm, Op, OpOptions, P2p, Ptr};
use crate::error::{tc_result_t, Error, Result};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::work::{tc_work_t, WorkSource};
use crate::ffi::{
    arg_out, arg_slice, boundary, boundary_void, handle_mut, handle_ref, into_handle, take_handle,
};
use crate::op::PointToPoint;
use crate::options::{read_versioned, tc_op_options_t, timeout_from_ms};
use crate::types::{hints_from_c, tc_dtype_t, tc_reduce_op_t, DType, ReduceOp};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

// cbindgen follows the declaration order: p2p first, as in the header.
mod p2p;

mod collectives;

pub use collectives::*;
pub use p2p::*;

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
        Op::PointToPoint(PointToPoint::One(p)) => p.tag = tag,
        _ => refuse_tag(tag)?,
    }
    Ok(op)
}

#[inline]
unsafe fn op_options_and_tag(p: *const tc_op_options_t) -> Result<(OpOptions, u32)> {
    // NULL, what most calls pass: the defaults, without building the C
    // struct's defaults and converting them (a unit test checks that both
    // ways give the same options), and without a call.
    if p.is_null() {
        return Ok((OpOptions::default(), 0));
    }
    read_op_options(p)
}

unsafe fn read_op_options(p: *const tc_op_options_t) -> Result<(OpOptions, u32)> {
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
/// the operation, hands out the work handle if asked. A collective refused
/// here (its options or arguments) is issued as a refusal, so that it
/// fails on every rank (see [`Comm::refuse`]); a refused send or receive
/// fails on this rank only.
fn issue(
    func: &'static str,
    comm: *mut tc_comm_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
    build: impl FnOnce(&Comm) -> Result<Op>,
) -> tc_result_t {
    boundary(func, || {
        let comm = unsafe { handle_ref(comm, "comm")? }.inner()?;
        let built = unsafe { op_options_and_tag(opts) }
            .and_then(|(opts, tag)| Ok((with_tag(build(comm)?, tag)?, opts)));
        let (op, opts) = match built {
            Ok(built) => built,
            Err(e) if matches!(func, "tc_send" | "tc_recv") => return Err(e),
            Err(e) => return Err(comm.refuse(func, e)),
        };
        let source = WorkSource::of(&op);
        let w = comm.submit(op, &opts)?;
        hand_out_work_with(work, w, comm, source);
        Ok(())
    })
}

/// [`boundary`] for a call built on collectives that issues at least one
/// on every rank when it succeeds (`tc_broadcast_coalesced`,
/// `tc_reducer_new`, ...): if `body` fails before issuing any operation,
/// the refusal is issued in the call's place (see [`Comm::refusing`]).
pub(crate) fn collective_boundary(
    func: &'static str,
    comm: *mut tc_comm_t,
    body: impl FnOnce(&crate::ffi::comm::tc_comm) -> Result<()>,
) -> tc_result_t {
    boundary(func, || {
        let comm = unsafe { handle_ref(comm, "comm")? };
        comm.inner()?.refusing(func, || body(comm))
    })
}

/// Gives the caller a handle to `w` when it asked for one (`out` non-NULL);
/// the handle keeps `comm` alive.
pub(crate) fn hand_out_work(
    out: *mut *mut tc_work_t,
    w: Arc<dyn crate::work::Work>,
    comm: &Arc<Comm>,
) {
    hand_out_work_with(out, w, comm, WorkSource::None)
}

/// [`hand_out_work`] for a receive, whose handle reports its `source`.
#[inline]
fn hand_out_work_with(
    out: *mut *mut tc_work_t,
    w: Arc<dyn crate::work::Work>,
    comm: &Arc<Comm>,
    source: WorkSource,
) {
    if !out.is_null() {
        unsafe {
            *out = into_handle(crate::ffi::work::tc_work {
                inner: w,
                _comm: comm.clone(),
                source,
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

/// The calls [`tc_comm_refuse`] issues a refusal for: the collectives and
/// the calls built on them that issue one on every rank when they succeed.
const REFUSABLE_CALLS: [&str; 21] = [
    "tc_all_reduce",
    "tc_reduce",
    "tc_all_gather",
    "tc_all_gather_single",
    "tc_all_gather_v",
    "tc_reduce_scatter",
    "tc_reduce_scatter_single",
    "tc_reduce_scatter_v",
    "tc_all_to_all",
    "tc_all_to_all_single",
    "tc_all_to_all_v_single",
    "tc_broadcast",
    "tc_barrier",
    "tc_scatter",
    "tc_gather",
    "tc_gather_single",
    "tc_broadcast_coalesced",
    "tc_reducer_new",
    "tc_sparse_all_reduce",
    "tc_all_gather_p_init",
    "tc_all_gather_p_exec",
];

/// For a binding whose own checks refuse a collective before calling it
/// (a Python dtype the library has no code for, a list of the wrong
/// length): issues the refusal of `call` in the call's place, as the
/// library does for the arguments it refuses itself, so that the call
/// fails on every rank instead of the peers pairing it with this rank's
/// next collective (see the header's preamble on refusals). `call` is the
/// C name of the refused call (`"tc_all_reduce"`, ..., `"tc_barrier"`,
/// `"tc_broadcast_coalesced"`, `"tc_reducer_new"`, `"tc_sparse_all_reduce"`,
/// `"tc_all_gather_p_init"`, `"tc_all_gather_p_exec"`; not a point-to-point
/// call); `reason` (UTF-8, copied) is what the peers are told, naming the
/// argument. Returns `TC_ERR_INVALID_ARGUMENT` with `reason` as this
/// thread's error once the refusal is issued (`tc_last_error`); a NULL
/// `comm`, `call` or `reason` is `TC_ERR_NULL_ARGUMENT` and an unknown
/// `call` `TC_ERR_INVALID_ARGUMENT` naming it, neither issuing anything.
/// Thread safety and ordering as for the refused call: it takes that
/// call's place in the comm's sequence of collectives.
#[no_mangle]
pub extern "C" fn tc_comm_refuse(
    comm: *mut tc_comm_t,
    call: *const std::ffi::c_char,
    reason: *const std::ffi::c_char,
) -> tc_result_t {
    boundary("tc_comm_refuse", || {
        let comm = unsafe { handle_ref(comm, "comm")? }.inner()?;
        let named = unsafe { crate::types::c_string(call, "call")? };
        let reason = unsafe { crate::types::c_string(reason, "reason")? };
        let Some(call) = REFUSABLE_CALLS.iter().find(|c| **c == named) else {
            return Err(Error::invalid_argument(format!(
                "argument 'call': {named:?} is not a collective call of the C API"
            )));
        };
        Err(comm.refuse(call, Error::invalid_argument(reason)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Versioned;

    /// NULL options take a shortcut: it must give what the C defaults
    /// (`TC_OP_OPTIONS_INIT`) give through the full reading.
    #[test]
    fn null_options_are_the_c_defaults() {
        let defaults = tc_op_options_t::defaults();
        let (read, read_tag) = unsafe { op_options_and_tag(&defaults) }.unwrap();
        let (null, null_tag) = unsafe { op_options_and_tag(std::ptr::null()) }.unwrap();
        assert_eq!(null_tag, read_tag);
        assert_eq!(null.async_op, read.async_op);
        assert_eq!(null.timeout, read.timeout);
        assert_eq!(null.stream, read.stream);
        assert_eq!(null.hints, read.hints);
    }
}
