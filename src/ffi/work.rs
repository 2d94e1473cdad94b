//! `tc_work_*`: completion handles of operations.

use crate::comm::Comm;
use crate::error::tc_result_t;
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::{arg_out, boundary, boundary_void, handle_ref, take_handle};
use crate::work::Work;
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
