//! `tc_window_*`: one-sided (RMA) windows over a comm. Implemented by the
//! `gloo` backend (host memory, any hosts); the `nccl` backend answers
//! `TC_ERR_UNSUPPORTED` naming the loaded NCCL's version (see
//! `src/backends/nccl/window.rs`).
//!
//! `tc_window_put`, `tc_window_signal` and `tc_window_wait_signal` honour
//! `async_op`: with it set, the call checks its arguments (failing itself on
//! a bad one), queues the operation and returns at once with an in-progress
//! work handle; without it, the call completes before it returns and the
//! work handle, when asked for, is already completed. Puts and signals of
//! one rank run in issue order (one queue per window), waits in a queue of
//! their own (an outstanding wait never holds up puts). A put or signal
//! waits until the target's side accepts it (a target that has not
//! registered, or is stopped, makes it wait up to its timeout); a timeout
//! or lost peer in register, deregister, put or signal leaves the window
//! unusable (later calls fail at once), while a `wait_signal` timeout is
//! harmless.
//!
//! A window's asynchronous calls belong to its comm's lifecycle (see
//! `src/window/`): `tc_comm_finalize` waits for those of every window not
//! yet freed (a pending wait up to its timeout) and fails with the first
//! failure among them when nothing else failed; `tc_comm_abort`, or the
//! comm aborted by a failure, ends them with `TC_ERR_ABORTED` (queued calls
//! at once, the running one by closing the window as `tc_window_free`
//! does), and the window then only accepts `tc_window_free`.

use crate::error::{tc_result_t, Result};
use crate::ffi::comm::tc_comm_t;
use crate::ffi::comm_ops::{hand_out_work, op_options};
use crate::ffi::handle::{Handle, HandleType};
use crate::ffi::work::tc_work_t;
use crate::ffi::{arg_out, boundary, boundary_void, handle_ref, into_handle, take_handle};
use crate::options::tc_op_options_t;
use crate::window::Window;
use crate::work::Work;
use std::ffi::c_void;
use std::sync::Arc;

/// A one-sided communication window over a comm.
pub struct tc_window {
    inner: Window,
}

pub type tc_window_t = tc_window;

impl Handle for tc_window {
    const TYPE: HandleType = HandleType::Window;
}

/// Runs a window call and hands out its work handle (in progress for an
/// asynchronous call, completed otherwise) when one is asked for.
fn window_op(
    func: &'static str,
    window: *mut tc_window_t,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
    call: impl FnOnce(&Window, &crate::comm::OpOptions) -> Result<Arc<dyn Work>>,
) -> tc_result_t {
    boundary(func, || {
        let w = unsafe { handle_ref(window, "window")? };
        let opts = unsafe { op_options(opts)? };
        let issued = call(&w.inner, &opts)?;
        hand_out_work(work, issued, w.inner.comm());
        Ok(())
    })
}

/// Creates a one-sided window on `comm`; free it with `tc_window_free`.
///
/// Collective: every rank of the comm creates its windows in the same order.
/// The window keeps the comm's resources alive until it is freed. Fails with
/// `TC_ERR_UNSUPPORTED` on the `nccl` backend, whose message names the
/// loaded NCCL's version, the version its host RMA API needs (2.29) and the
/// entry points it lacks (windows over that API are not implemented yet),
/// and on a finalized or aborted comm. `*window` is written only on success.
#[no_mangle]
pub extern "C" fn tc_window_new(
    comm: *mut tc_comm_t,
    window: *mut *mut tc_window_t,
) -> tc_result_t {
    boundary("tc_window_new", || {
        let (comm, out) = unsafe { (handle_ref(comm, "comm")?, arg_out(window, "window")?) };
        let inner = Window::new(comm.inner()?)?;
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
pub extern "C" fn tc_window_register(
    window: *mut tc_window_t,
    buf: *mut c_void,
    bytes: usize,
) -> tc_result_t {
    boundary("tc_window_register", || {
        let w = unsafe { handle_ref(window, "window")? };
        if buf.is_null() {
            return Err(crate::error::Error::null_argument("buf"));
        }
        w.inner.register(buf, bytes)
    })
}

/// Ends the registration of this rank's buffer.
///
/// Collective: it first waits for this rank's outstanding asynchronous puts
/// and signals (each has landed or failed; their work handles say which),
/// then deregisters. Every put issued before any rank's deregister has
/// landed when it returns, and no later put lands in the buffer.
/// Outstanding `tc_window_wait_signal` calls are not waited for.
#[no_mangle]
pub extern "C" fn tc_window_deregister(window: *mut tc_window_t) -> tc_result_t {
    boundary("tc_window_deregister", || {
        let w = unsafe { handle_ref(window, "window")? };
        w.inner.deregister()
    })
}

/// Writes `bytes` bytes from `src` into `dst_rank`'s registered buffer at
/// byte offset `dst_offset`, without `dst_rank`'s application taking part.
///
/// The target sees the data once it has waited for a later
/// `tc_window_signal` from this rank (`tc_window_wait_signal`); puts from
/// one origin to one target land in order, puts from different origins in
/// no defined order. `dst_offset + bytes` beyond the target's registered
/// size fails with `TC_ERR_INVALID_ARGUMENT` naming both. `bytes = 0` does
/// nothing, whatever `dst_offset` (as MPI's zero counts). A put to this
/// rank itself is a copy. `opts` may be NULL (defaults; `timeout_ms`
/// applies, `stream` is ignored).
///
/// With `opts.async_op = 0` the call returns when the put is complete and
/// `src` may be reused. With `opts.async_op = 1` it checks its arguments
/// (ranks, bounds, a registered buffer, an active comm, `src`: these fail
/// the call itself), queues the put and returns at once; `src` must then
/// stay valid and unchanged until the put's work completes
/// (`tc_work_wait`), and the put's own failure (`TC_ERR_TIMEOUT`,
/// `TC_ERR_REMOTE`, ...) is reported by its work. Puts and signals of this
/// rank run in issue order, asynchronous or not: a blocking call issued
/// after asynchronous ones waits for them. `*work`, when `work` is not NULL,
/// receives a work handle (completed for a blocking call) to free with
/// `tc_work_free`; freeing it early does not cancel the put. With `work`
/// NULL an asynchronous put still runs; `tc_window_deregister` and
/// `tc_comm_finalize` wait for it, and `tc_comm_abort` ends it with
/// `TC_ERR_ABORTED`. Like the comm's operations, a window call (blocking
/// or not) is watched by the comm's watchdog: one still running past its
/// timeout (plus the backend's grace) fails with `TC_ERR_TIMEOUT` naming
/// the call and its window, and the comm is aborted. Thread-safe.
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

/// Reads `bytes` bytes at byte offset `src_offset` of `src_rank`'s
/// registered buffer into `dst`, without `src_rank`'s application taking
/// part.
///
/// Ordering: the get reads after every put this rank issued to `src_rank`
/// before it (asynchronous ones included: gets queue with this rank's puts
/// and signals, in issue order), so a rank reads back what it wrote. Puts
/// of other ranks to `src_rank` are seen only once they are known to have
/// landed (for example after `src_rank` waited for their signals and told
/// this rank so). On the `gloo` backend a get from this rank itself, or
/// from a same-host rank whose buffer lies in `tc_mem_alloc` memory, is a
/// memory copy; from any other rank it is a request answered by that
/// rank's window service (a message each way).
///
/// `dst` must not be NULL when `bytes > 0` (`TC_ERR_INVALID_ARGUMENT`
/// naming `dst`); `src_rank` must be a rank of the comm (naming
/// `src_rank`); `src_offset + bytes` must not overflow nor pass the end of
/// `src_rank`'s registered size (naming `src_offset`, with both numbers).
/// A buffer must be registered on this rank (`TC_ERR_INVALID_USAGE`).
/// `bytes = 0` does nothing, whatever `src_offset`. `opts` may be NULL
/// (defaults; `timeout_ms` applies, `stream` is ignored).
///
/// With `opts.async_op = 0` the call returns when the bytes are in `dst`.
/// With `opts.async_op = 1` it checks its arguments, queues the get and
/// returns at once; `dst` must then stay valid, and must not be read or
/// written, until the get's work completes (`tc_work_wait`), which reports
/// the get's own failure (`TC_ERR_TIMEOUT`, `TC_ERR_REMOTE`, ...). A
/// timeout or a lost peer leaves the window unusable, as for a put. `work`
/// as for `tc_window_put`. Thread-safe. Ownership: `dst` stays the caller's.
#[no_mangle]
pub extern "C" fn tc_window_get(
    window: *mut tc_window_t,
    dst: *mut c_void,
    bytes: usize,
    src_rank: i32,
    src_offset: usize,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    window_op("tc_window_get", window, opts, work, |w, o| {
        if dst.is_null() && bytes > 0 {
            return Err(crate::error::Error::null_argument("dst"));
        }
        w.get(dst, bytes, src_rank, src_offset, o)
    })
}

/// Sends one signal to `peer`; it arrives after every put this rank issued
/// to `peer` before it, including asynchronous puts not yet complete when
/// the signal is issued.
///
/// `opts` and `work` as for `tc_window_put` (`async_op = 1`: queued behind
/// this rank's earlier puts and signals, returns at once). Thread-safe.
#[no_mangle]
pub extern "C" fn tc_window_signal(
    window: *mut tc_window_t,
    peer: i32,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    window_op("tc_window_signal", window, opts, work, |w, o| {
        w.signal(peer, o)
    })
}

/// Waits for one signal from `peer` and consumes it; when it returns, every
/// put `peer` issued to this rank before that signal is in this rank's
/// buffer.
///
/// Each signal satisfies one wait. Fails with `TC_ERR_TIMEOUT` when no
/// signal arrives within the operation's timeout (`opts.timeout_ms`, 0 or
/// unset: the comm's), and with `TC_ERR_REMOTE` when `peer` is gone. `opts`
/// and `work` as for `tc_window_put`. With `async_op = 1` the wait is queued
/// and the call returns at once; its outcome (and the data's arrival) is
/// known when its work completes. Waits run in issue order among
/// themselves, apart from puts and signals: an outstanding wait never holds
/// up this rank's puts or signals. A wait still pending when the window is
/// freed or its comm aborted ends with `TC_ERR_ABORTED`; `tc_comm_finalize`
/// waits for it (up to its timeout). Thread-safe.
#[no_mangle]
pub extern "C" fn tc_window_wait_signal(
    window: *mut tc_window_t,
    peer: i32,
    opts: *const tc_op_options_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    window_op("tc_window_wait_signal", window, opts, work, |w, o| {
        w.wait_signal(peer, o)
    })
}

/// Gives a local pointer to `rank`'s registered buffer, where the memory is
/// reachable from this process: always this rank's own buffer;
/// `TC_ERR_UNSUPPORTED` for other ranks on the `gloo` backend (no shared
/// memory). `*ptr` is written only on success and stays valid until the
/// buffer is deregistered.
#[no_mangle]
pub extern "C" fn tc_window_map_remote(
    window: *mut tc_window_t,
    rank: i32,
    ptr: *mut *mut c_void,
) -> tc_result_t {
    boundary("tc_window_map_remote", || {
        let (w, out) = unsafe { (handle_ref(window, "window")?, arg_out(ptr, "ptr")?) };
        *out = w.inner.map_remote(rank)?;
        Ok(())
    })
}

/// Frees a window. Free it after `tc_window_deregister`: freeing a window
/// that is still registered ends its service at once, and the peers'
/// windows then fail with `TC_ERR_REMOTE`. Asynchronous calls still
/// outstanding end with an error: calls still queued and a pending wait
/// with `TC_ERR_ABORTED` (the window was freed, or closed), a put or signal
/// in flight with `TC_ERR_ABORTED` or the error its closed connection
/// gave. Their work handles stay valid until freed. Not to be called while
/// another thread is inside a call on the same window. NULL is ignored; a
/// handle that is not a live window (freed already) is left alone with a
/// warning and `tc_last_error` set.
#[no_mangle]
pub extern "C" fn tc_window_free(window: *mut tc_window_t) {
    boundary_void("tc_window_free", || {
        drop(unsafe { take_handle(window, "window")? });
        Ok(())
    })
}
