//! `tc_work_*`: completion handles of operations.

use crate::comm::Comm;
use crate::error::{tc_result_t, Error};
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::{arg_out, boundary, boundary_void, handle_ref, take_handle};
use crate::op::{Op, PointToPoint, SourceSlot};
use crate::work::Work;
use crate::work::WorkStatus;
use std::ffi::c_int;
use std::sync::Arc;

/// Status values written by `tc_work_status`.
pub const TC_WORK_NOT_STARTED: i32 = 0;
pub const TC_WORK_IN_PROGRESS: i32 = 1;
pub const TC_WORK_COMPLETED: i32 = 2;
pub const TC_WORK_TIMED_OUT: i32 = 3;
pub const TC_WORK_ERROR: i32 = 4;

/// The completion handle of one operation. It keeps its communicator alive
/// (the comm's memory, not its ability to run operations). A work handle may
/// be queried and waited on from several threads at once.
pub struct tc_work {
    pub(crate) inner: Arc<dyn Work>,
    pub(crate) _comm: Arc<Comm>,
    /// Whose message a receive took (see `tc_work_source`).
    pub(crate) source: WorkSource,
}

/// What `tc_work_source` reports of a work.
#[derive(Clone, Default)]
pub(crate) enum WorkSource {
    /// Not a receive.
    #[default]
    None,
    /// A receive naming its peer.
    Peer(i32),
    /// A receive from any source: its transport writes the sender here.
    Any(SourceSlot),
}

impl WorkSource {
    /// What a work of `op` reports.
    pub(crate) fn of(op: &Op) -> WorkSource {
        match op {
            Op::PointToPoint(PointToPoint::One(p)) if !p.is_send => match &p.source {
                Some(slot) => WorkSource::Any(slot.clone()),
                None => WorkSource::Peer(p.peer),
            },
            _ => WorkSource::None,
        }
    }
}

pub type tc_work_t = tc_work;

impl Handle for tc_work {
    const TYPE: HandleType = HandleType::Work;
}

/// Writes 1 to `*done` when the operation has finished (successfully or not),
/// else 0. Never blocks. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_work_is_completed(work: *const tc_work_t, done: *mut c_int) -> tc_result_t {
    boundary("tc_work_is_completed", || {
        let (work, done) = unsafe { (handle_ref(work, "work")?, arg_out(done, "done")?) };
        *done = work.inner.status().is_finished() as c_int;
        Ok(())
    })
}

/// Writes the operation's status (`TC_WORK_NOT_STARTED` ... `TC_WORK_ERROR`)
/// to `*status`. Never blocks. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_work_status(work: *const tc_work_t, status: *mut i32) -> tc_result_t {
    boundary("tc_work_status", || {
        let (work, status) = unsafe { (handle_ref(work, "work")?, arg_out(status, "status")?) };
        *status = work.inner.status() as i32;
        Ok(())
    })
}

/// Writes to `*rank` the rank whose message the receive of `work` took:
/// for a receive from `TC_ANY_SOURCE`, the sender it matched; for a
/// receive naming its peer, that peer. This is how a caller learns the
/// sender of an any-source receive, blocking or not: ask `tc_recv` for
/// the work (with `async_op = 0` it is complete when `tc_recv` returns).
/// Fails with `TC_ERR_INVALID_USAGE`, `*rank` untouched, when the work is
/// not of a `tc_recv` (a send, a batch, a collective: "not a receive") or
/// has not completed successfully (the message names its status:
/// not started, in progress, timed out, failed). NULL `work` or `rank`:
/// `TC_ERR_NULL_ARGUMENT` naming it; a handle that is not a live work:
/// `TC_ERR_INVALID_ARGUMENT`. Never blocks. Thread-safe; the handle stays
/// owned by the caller. No stream ordering: it reads what the host knows
/// of the work (a device receive counts as completed once
/// `tc_work_is_completed` says so).
#[no_mangle]
pub extern "C" fn tc_work_source(work: *const tc_work_t, rank: *mut i32) -> tc_result_t {
    boundary("tc_work_source", || {
        let (work, rank) = unsafe { (handle_ref(work, "work")?, arg_out(rank, "rank")?) };
        let status = work.inner.status();
        let source = match &work.source {
            WorkSource::None => {
                return Err(Error::invalid_usage(
                    "argument 'work': not a receive (only the work of tc_recv has a source)",
                ))
            }
            _ if status != WorkStatus::Completed => {
                let state = match status {
                    WorkStatus::NotStarted => "has not started",
                    WorkStatus::InProgress => "is in progress",
                    WorkStatus::TimedOut => "timed out",
                    _ => "failed",
                };
                return Err(Error::invalid_usage(format!(
                    "argument 'work': the receive {state}: its source is known once it \
                     completed successfully (wait for it first)"
                )));
            }
            WorkSource::Peer(p) => *p,
            WorkSource::Any(slot) => slot.get().ok_or_else(|| {
                Error::internal("a receive from any source completed without its sender")
            })?,
        };
        *rank = source;
        Ok(())
    })
}

/// Waits for the operation. Host operations: returns when it finished.
/// CUDA operations: makes `stream` (NULL: the legacy default stream) wait
/// for it and returns at once. Returns the operation's error if it failed
/// (`TC_ERR_TIMEOUT`, `TC_ERR_REMOTE`, `TC_ERR_ABORTED`, ...). Thread-safe.
#[no_mangle]
pub extern "C" fn tc_work_wait(
    work: *const tc_work_t,
    stream: *mut std::ffi::c_void,
) -> tc_result_t {
    boundary("tc_work_wait", || {
        let work = unsafe { handle_ref(work, "work")? };
        work.inner.wait(stream)
    })
}

/// Blocks the calling thread until the operation finished; returns its error
/// if it failed. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_work_wait_blocking(work: *const tc_work_t) -> tc_result_t {
    boundary("tc_work_wait_blocking", || {
        let work = unsafe { handle_ref(work, "work")? };
        work.inner.wait_blocking()
    })
}

/// Releases the handle. NULL is ignored; a handle that is not a live work
/// (freed already, another handle type) is left alone with a warning and
/// `tc_last_error` set ("not a live tc_work_t"). The operation itself still runs to
/// completion; its buffers must stay valid until it does.
#[no_mangle]
pub extern "C" fn tc_work_free(work: *mut tc_work_t) {
    boundary_void("tc_work_free", || {
        drop(unsafe { take_handle(work, "work")? });
        Ok(())
    })
}
