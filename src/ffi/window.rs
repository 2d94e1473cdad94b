//! `tc_window_*`: one-sided (RMA) windows over a comm. Implemented by the
//! `gloo` backend (host memory, any hosts); the `nccl` backend answers
//! `TC_ERR_UNSUPPORTED` (listed in the README).
//!
//! Every window call completes before it returns, whatever `async_op`
//! says; the work handle, when asked for, is already completed. A put or
//! signal waits until the target's side accepts it (a target that has not
//! registered, or is stopped, makes it wait up to its timeout); a timeout
//! or lost peer in register, deregister, put or signal leaves the window
//! unusable (later calls fail at once), while a `wait_signal` timeout is
//! harmless.

use crate::error::{tc_result_t, Result};
use crate::ffi::comm::{hand_out_work, op_options, tc_comm_t};
use crate::ffi::work::tc_work_t;
use crate::ffi::{arg_out, arg_ref, boundary, boundary_void, into_handle, take_handle};
use crate::options::tc_op_options_t;
use crate::window::Window;
use crate::work::DoneWork;
use std::ffi::c_void;
use std::sync::Arc;

/// A one-sided communication window over a comm.
pub struct tc_window {
    inner: Window,
}

pub type tc_window_t = tc_window;

/// Runs a window call that may hand out a (completed) work handle.
fn window_op(
    func: &'static str,
    window: *mut tc_window_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
    call: impl FnOnce(&Window, &crate::comm::OpOptions) -> Result<()>,
) -> tc_result_t {
    boundary(func, || {
        let w = unsafe { arg_ref(window, "window")? };
        let opts = unsafe { op_options(opts)? };
        call(&w.inner, &opts)?;
        hand_out_work(work, Arc::new(DoneWork(Ok(()))), w.inner.comm());
        Ok(())
    })
}

/// Creates a one-sided window on `comm`; free it with `tc_window_free`.
///
/// Collective: every rank of the comm creates its windows in the same order.
/// The window keeps the comm's resources alive until it is freed. Fails with
/// `TC_ERR_UNSUPPORTED` on backends without windows (`nccl` for now), and
/// on a finalized or aborted comm. `*window` is written only on success.
#[no_mangle]
pub extern "C" fn tc_window_new(comm: *mut tc_comm_t, window: *mut *mut tc_window_t) -> tc_result_t {
    boundary("tc_window_new", || {
        let (comm, out) = unsafe { (arg_ref(comm, "comm")?, arg_out(window, "window")?) };
        let inner = Window::new(&comm.inner)?;
        *out = into_handle(tc_window { inner });
        Ok(())
    })
}

/// Registers `bytes` bytes at `buf` as this rank's window memory, which
/// other ranks then write with `tc_window_put`.
///
/// Collective over the window's comm; sizes may differ between ranks. One
/// buffer at a time: deregister before registering another. Signals that
/// were never waited for are dropped by the next registration. The buffer must
/// stay valid until `tc_window_deregister` (or `tc_window_free`) returns.
/// `buf` must not be NULL and `bytes` must not be 0.
#[no_mangle]
pub extern "C" fn tc_window_register(window: *mut tc_window_t, buf: *mut c_void, bytes: usize) -> tc_result_t {
    boundary("tc_window_register", || {
        let w = unsafe { arg_ref(window, "window")? };
        if buf.is_null() {
            return Err(crate::error::Error::null_argument("buf"));
        }
        w.inner.register(buf, bytes)
    })
}

/// Ends the registration of this rank's buffer.
///
/// Collective: every put issued before any rank's deregister has landed when
/// it returns, and no later put lands in the buffer.
#[no_mangle]
pub extern "C" fn tc_window_deregister(window: *mut tc_window_t) -> tc_result_t {
    boundary("tc_window_deregister", || {
        let w = unsafe { arg_ref(window, "window")? };
        w.inner.deregister()
    })
}

/// Writes `bytes` bytes from `src` into `dst_rank`'s registered buffer at
/// byte offset `dst_offset`, without `dst_rank`'s application taking part.
///
/// Returns when `src` may be reused. The target sees the data once it has
/// waited for a later `tc_window_signal` from this rank
/// (`tc_window_wait_signal`); puts from one origin to one target land in
/// order, puts from different origins in no defined order. `dst_offset + bytes` beyond the target's
/// registered size fails with `TC_ERR_INVALID_ARGUMENT` naming both. A put to
/// this rank itself is a copy. `opts` may be NULL (`timeout_ms` applies;
/// `async_op` and `stream` are ignored: the call completes before it
/// returns). `*work`, when `work` is not NULL, receives a completed work
/// handle to free with `tc_work_free`. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_window_put(
    window: *mut tc_window_t,
    src: *const c_void,
    bytes: usize,
    dst_rank: i32,
    dst_offset: usize,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    window_op("tc_window_put", window, opts, work, |w, o| {
        if src.is_null() && bytes > 0 {
            return Err(crate::error::Error::null_argument("src"));
        }
        w.put(src, bytes, dst_rank, dst_offset, o)
    })
}

/// Sends one signal to `peer`; it arrives after every earlier put from this
/// rank to `peer`.
///
/// `opts` and `work` as for `tc_window_put`. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_window_signal(
    window: *mut tc_window_t,
    peer: i32,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    window_op("tc_window_signal", window, opts, work, |w, o| w.signal(peer, o))
}

/// Waits for one signal from `peer` and consumes it; when it returns, every
/// put `peer` issued to this rank before that signal is in this rank's
/// buffer.
///
/// Each signal satisfies one wait. Fails with `TC_ERR_TIMEOUT` when no
/// signal arrives within the operation's timeout (`opts.timeout_ms`, 0 or
/// unset: the comm's), and with `TC_ERR_REMOTE` when `peer` is gone. `opts`
/// and `work` as for `tc_window_put`. Thread-safe.
#[no_mangle]
pub extern "C" fn tc_window_wait_signal(
    window: *mut tc_window_t,
    peer: i32,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    window_op("tc_window_wait_signal", window, opts, work, |w, o| w.wait_signal(peer, o))
}

/// Gives a local pointer to `rank`'s registered buffer, where the memory is
/// reachable from this process: always this rank's own buffer;
/// `TC_ERR_UNSUPPORTED` for other ranks on the `gloo` backend (no shared
/// memory). `*ptr` is written only on success and stays valid until the
/// buffer is deregistered.
#[no_mangle]
pub extern "C" fn tc_window_map_remote(window: *mut tc_window_t, rank: i32, ptr: *mut *mut c_void) -> tc_result_t {
    boundary("tc_window_map_remote", || {
        let (w, out) = unsafe { (arg_ref(window, "window")?, arg_out(ptr, "ptr")?) };
        *out = w.inner.map_remote(rank)?;
        Ok(())
    })
}

/// Frees a window. Free it after `tc_window_deregister`: freeing a window
/// that is still registered ends its service at once, and the peers'
/// windows then fail with `TC_ERR_REMOTE`. NULL is ignored.
#[no_mangle]
pub extern "C" fn tc_window_free(window: *mut tc_window_t) {
    boundary_void("tc_window_free", || {
        drop(unsafe { take_handle(window) });
        Ok(())
    })
}
