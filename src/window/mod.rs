//! One-sided windows (RMA) over a comm: the checks every backend shares,
//! and the queues that make `async_op` real.
//!
//! A [`Window`] holds its comm alive and the backend's [`WindowBackend`].
//! It checks arguments before the backend sees them (ranks in range,
//! offsets and sizes without overflow and within the target's registered
//! buffer, a buffer registered where one is needed, the comm still active)
//! and keeps registration apart from traffic: `register`/`deregister` take
//! the state exclusively, `put`/`signal`/`wait_signal` share it while they
//! are checked and issued, so a thread waiting for a signal never blocks
//! another thread's puts.
//!
//! Calls go through two FIFO lanes per window, each with a worker thread
//! started on its first queued call:
//!
//! - the origin lane carries puts and signals, so that a signal follows
//!   every put issued before it on this rank, whether those were
//!   asynchronous or not;
//! - the wait lane carries `wait_signal`, so that an outstanding
//!   asynchronous wait never holds up this rank's puts and signals.
//!
//! With `async_op` set, a call is checked, queued and returns at once with
//! an in-progress [`HostWork`]; the backend call runs on the lane's thread
//! and completes the work with its result. A blocking call runs on the
//! caller's thread when its lane has no queued or running asynchronous
//! work, and otherwise queues behind that work and waits for its turn, so
//! issue order is kept (blocking calls of different threads may run side
//! by side, as before; the backend serializes its sends). `deregister`
//! waits for the origin lane to drain before it deregisters; dropping the
//! window (`tc_window_free`) stops the lanes taking work, closes the
//! backend (which ends the running calls: an in-flight put or signal fails,
//! with `ErrorKind::Aborted` or its closed connection's error, and a
//! waiting `wait_signal` ends with `ErrorKind::Aborted`), completes every
//! call still queued with `ErrorKind::Aborted` ("the window was freed"),
//! and joins the lanes' threads: nothing is left running.
//!
//! The comm tracks its windows through their `Lanes` (the backend and
//! both lanes), of which it keeps a `Weak` each, added by [`Window::new`]
//! and pruned once dead; it copies the live ones out of its lock before
//! calling into them, and nothing in a window calls into the comm while
//! holding a lane's lock (a lane's calls reach only the backend), so the
//! two never wait on each other's locks.
//!
//! - `Comm::finalize` first drains (`Lanes::drain`) every live window: it
//!   waits until no call is queued or running on either lane (a pending
//!   asynchronous wait included, up to its timeout). The first failure of
//!   an asynchronous call of a live window (kept by its lane until a drain
//!   takes it) makes finalize fail with that error's kind, when neither an
//!   abort nor a failed operation of the comm comes first. A window freed
//!   before finalize is neither waited for nor reported: its free already
//!   ended its calls, each with its own outcome on its work.
//! - `Comm::abort`, and the comm becoming aborted by a failure (without
//!   abort-on-error: with it the process aborts),
//!   abort the outstanding calls (`Lanes::abort_outstanding`) of every
//!   live window: queued calls complete at once with `ErrorKind::Aborted`
//!   naming the comm's abort, later calls are refused with it, and the
//!   backend is closed as by free, which ends the running put, signal or
//!   wait; that call then completes with the same `ErrorKind::Aborted`
//!   (its own error appended), unless it had already succeeded. The lanes'
//!   threads stay, idle, until the window is freed. The backend is closed
//!   once, whichever of abort and free comes first; its closing also ends
//!   a blocking call running on its caller's thread, which fails as it
//!   would at free.
//!
//! Window works, blocking and asynchronous, are watched by the comm's
//! watchdog like its operations' works: a call still running past its
//! timeout and the backend's grace (a backend call that does not end by
//! itself, such as a wait for a signal a dead peer never sends) fails with
//! `ErrorKind::Timeout` naming the call and its window, and the comm is
//! aborted, which ends the call (see above). A call that fails by itself
//! within its timeout does not abort the comm.

mod lane;

use crate::backends::WindowBackend;
use crate::comm::hooks::window::{self as hooks, WindowCall};
use crate::comm::{Comm, WindowLanes};
use crate::error::{Error, Result};
use crate::op::OpOptions;
use crate::work::{DoneWork, HostWork, Work};
use lane::Lane;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once, RwLock, RwLockReadGuard, Weak};
use std::time::Duration;

pub struct Window {
    comm: Arc<Comm>,
    /// The backend and the lanes; the comm holds a weak reference to them.
    lanes: Arc<Lanes>,
    /// This rank's registered buffer and its size, or None.
    registered: RwLock<Option<(usize, usize)>>,
    /// Registrations made so far (an error tells "not yet" from "no more").
    registrations: AtomicUsize,
}

/// The part of a window its comm reaches: the backend and the two lanes.
/// The comm keeps a `Weak` of it for each window (registered by
/// [`Window::new`]) so that its finalize can [`drain`](Lanes::drain) them
/// and its abort [`abort_outstanding`](Lanes::abort_outstanding). Nothing
/// in here calls into the comm.
pub(crate) struct Lanes {
    backend: Arc<dyn WindowBackend>,
    /// Puts and signals, in issue order.
    origin: Arc<Lane>,
    /// Waits for signals, in issue order.
    wait: Arc<Lane>,
    /// "window of comm 'x' (rank 0/4)", for the works' messages.
    label: Arc<str>,
    /// The backend is closed once, by a comm abort or by free, whichever
    /// comes first; a second caller waits until the first has closed it.
    closed: Once,
}

impl WindowLanes for Lanes {
    /// Blocks until no call is queued or running on either lane (the comm's
    /// finalize; the caller holds none of the comm's locks). Returns the
    /// first failure of an asynchronous call of this window that no drain
    /// has returned yet (puts and signals before waits).
    fn drain(&self) -> Option<Error> {
        self.origin.wait_idle();
        self.wait.wait_idle();
        self.origin
            .take_failure()
            .or_else(|| self.wait.take_failure())
    }

    /// The comm was aborted (`err` says how): calls still queued complete
    /// now with `err` (`ErrorKind::Aborted`), later ones are refused, and
    /// the backend is closed as by free, which ends the running put, signal
    /// or wait; that call then completes with `err` too, unless it
    /// succeeded first.
    fn abort_outstanding(&self, err: &Error) {
        self.origin.abort(err);
        self.wait.abort(err);
        self.close_backend();
    }
}

impl Lanes {
    fn close_backend(&self) {
        self.closed.call_once(|| self.backend.close());
    }
}

impl Window {
    /// Collective over the comm: every rank creates its window in the same
    /// order.
    pub fn new(comm: &Arc<Comm>) -> Result<Window> {
        comm.check_active()
            .map_err(|e| e.context("creating a window (tc_window_new)"))?;
        let windows = comm.backend().abilities().windows().ok_or_else(|| {
            Error::unsupported("windows (RMA) are not implemented for this backend yet")
        })?;
        let inner: Arc<dyn WindowBackend> = Arc::from(windows.new_window(comm.timeout())?);
        Ok(Window::with_backend(comm, inner))
    }

    /// A window of `comm` over `inner` (the comm's backend's, or a test's).
    fn with_backend(comm: &Arc<Comm>, inner: Arc<dyn WindowBackend>) -> Window {
        let label: Arc<str> = format!(
            "window of comm '{}' (rank {}/{})",
            comm.name(),
            comm.rank(),
            comm.size()
        )
        .into();
        let lanes = Arc::new(Lanes {
            backend: inner,
            origin: Lane::new("origin"),
            wait: Lane::new("wait"),
            label,
            closed: Once::new(),
        });
        comm.add_window(Arc::downgrade(&lanes) as Weak<dyn WindowLanes>);
        Window {
            comm: comm.clone(),
            lanes,
            registered: RwLock::new(None),
            registrations: AtomicUsize::new(0),
        }
    }

    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    fn timeout(&self, opts: &OpOptions) -> Duration {
        opts.timeout.unwrap_or(self.comm.timeout())
    }

    fn check_rank(&self, rank: i32, arg: &str) -> Result<()> {
        if rank < 0 || rank >= self.comm.size() {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': rank {rank} is outside [0, {}), the ranks of the {}",
                self.comm.size(),
                self.lanes.label
            )));
        }
        Ok(())
    }

    /// The comm's refusal, when it is finalized or aborted, saying which
    /// window call it refused.
    fn check_active(&self, what: &str) -> Result<()> {
        self.comm
            .check_active()
            .map_err(|e| e.context(format_args!("{what} on {}", self.lanes.label)))
    }

    /// Why `what` finds no buffer registered: none yet, or no more.
    fn unregistered(&self, what: &str) -> Error {
        let why = match self.registrations.load(Ordering::Relaxed) {
            0 => "none was registered yet: register one with tc_window_register (collective) first",
            _ => "it was deregistered (tc_window_deregister): register one again first",
        };
        Error::invalid_usage(format!(
            "{what} on {}: this rank has no buffer registered with the window; {why}",
            self.lanes.label
        ))
    }

    /// The state, shared, once a buffer is registered and the comm active.
    fn registered_state(&self, what: &str) -> Result<RwLockReadGuard<'_, Option<(usize, usize)>>> {
        self.check_active(what)?;
        let state = self.registered.read().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            return Err(self.unregistered(what));
        }
        Ok(state)
    }

    /// Collective: registers `bytes` at `buf` as this rank's window memory.
    pub fn register(&self, buf: *mut c_void, bytes: usize) -> Result<()> {
        self.check_active("register")?;
        let mut state = self.registered.write().unwrap_or_else(|e| e.into_inner());
        if let Some((at, size)) = *state {
            return Err(Error::invalid_usage(format!(
                "register on {}: a buffer of {size} bytes at {at:#x} is already registered with this window \
                 (one at a time): deregister it first (tc_window_deregister)",
                self.lanes.label
            )));
        }
        if bytes == 0 {
            return Err(Error::invalid_argument(format!(
                "argument 'bytes': register on {}: a window buffer needs at least one byte (got 0)",
                self.lanes.label
            )));
        }
        self.lanes
            .backend
            .register(buf, bytes, self.comm.timeout())?;
        *state = Some((buf as usize, bytes));
        self.registrations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Collective: waits for this rank's queued puts and signals (each has
    /// landed or failed), then deregisters; after it no put lands in the
    /// buffer any more.
    pub fn deregister(&self) -> Result<()> {
        self.check_active("deregister")?;
        let mut state = self.registered.write().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            return Err(self.unregistered("deregister"));
        }
        // No call can be issued while the state is held exclusively, so the
        // origin lane only drains from here.
        self.lanes.origin.wait_idle();
        // The registration ends whatever the backend answers: a failed
        // collective leaves the buffer no longer safe to count on.
        *state = None;
        self.lanes.backend.deregister(self.comm.timeout())
    }

    /// Writes `bytes` from `src` into `dst_rank`'s buffer at `dst_offset`.
    /// With `opts.async_op`, returns once queued: `src` must stay valid and
    /// unchanged until the returned work completes.
    pub fn put(
        &self,
        src: *const c_void,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
        opts: &OpOptions,
    ) -> Result<Arc<dyn Work>> {
        self.check_rank(dst_rank, "dst_rank")?;
        let _state = self.registered_state("put")?;
        // Zero bytes move nothing, whatever the offset (as MPI's zero counts).
        if bytes == 0 {
            return Ok(done());
        }
        let size = self.lanes.backend.remote_size(dst_rank);
        check_span("dst_offset", dst_offset, bytes, dst_rank, size)?;
        let (inner, timeout, src) = (self.lanes.backend.clone(), self.timeout(opts), src as usize);
        let call = WindowCall::transfer("window_put", dst_rank, (src, bytes), dst_offset, opts);
        self.issue(&self.lanes.origin, call, opts, move || {
            inner.put(src as *const c_void, bytes, dst_rank, dst_offset, timeout)
        })
    }

    /// Reads `bytes` at `src_offset` of `src_rank`'s buffer into `dst`,
    /// after every put this rank issued before (the origin lane). With
    /// `opts.async_op`, returns once queued: `dst` must stay valid and
    /// untouched until the returned work completes.
    pub fn get(
        &self,
        dst: *mut c_void,
        bytes: usize,
        src_rank: i32,
        src_offset: usize,
        opts: &OpOptions,
    ) -> Result<Arc<dyn Work>> {
        self.check_rank(src_rank, "src_rank")?;
        let _state = self.registered_state("get")?;
        if bytes == 0 {
            return Ok(done());
        }
        let size = self.lanes.backend.remote_size(src_rank);
        check_span("src_offset", src_offset, bytes, src_rank, size)?;
        let (inner, timeout, dst) = (self.lanes.backend.clone(), self.timeout(opts), dst as usize);
        let call = WindowCall::transfer("window_get", src_rank, (dst, bytes), src_offset, opts);
        self.issue(&self.lanes.origin, call, opts, move || {
            inner.get(dst as *mut c_void, bytes, src_rank, src_offset, timeout)
        })
    }

    /// Notifies `peer`, after every put this rank issued before.
    pub fn signal(&self, peer: i32, opts: &OpOptions) -> Result<Arc<dyn Work>> {
        self.check_rank(peer, "peer")?;
        let _state = self.registered_state("signal")?;
        let (inner, timeout) = (self.lanes.backend.clone(), self.timeout(opts));
        let call = WindowCall::signal("window_signal", peer, opts);
        self.issue(&self.lanes.origin, call, opts, move || {
            inner.signal(peer, timeout)
        })
    }

    /// Waits for (and consumes) one signal from `peer`.
    pub fn wait_signal(&self, peer: i32, opts: &OpOptions) -> Result<Arc<dyn Work>> {
        self.check_rank(peer, "peer")?;
        let _state = self.registered_state("wait_signal")?;
        let (inner, timeout) = (self.lanes.backend.clone(), self.timeout(opts));
        let call = WindowCall::signal("window_wait_signal", peer, opts);
        self.issue(&self.lanes.wait, call, opts, move || {
            inner.wait_signal(peer, timeout)
        })
    }

    pub fn map_remote(&self, rank: i32) -> Result<*mut c_void> {
        self.check_rank(rank, "rank")?;
        let _state = self.registered_state("map_remote")?;
        self.lanes.backend.map_remote(rank)
    }

    /// Runs `task` on `lane`: queued with an in-progress work (async), or to
    /// completion before returning a finished one, between the comm's
    /// operation hooks for `call`. Called with the state shared, so that no
    /// deregistration slips between checks and issue.
    fn issue(
        &self,
        lane: &Arc<Lane>,
        call: WindowCall,
        opts: &OpOptions,
        task: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<Arc<dyn Work>> {
        let op = call.name;
        let settler = hooks::Settler {
            owed: self.comm.window_hooks(call)?,
            name: op,
        };
        let task = move || {
            let result = task();
            hooks::settle(&settler.owed, &result);
            result
        };
        // The watchdog gives the backend's own timeout (and its better
        // message) the same head start as for the comm's operations.
        let watched = self.timeout(opts) + self.comm.backend().abilities().watchdog_grace();
        let watch = |work: Arc<HostWork>| self.comm.watch(work);
        // A refused call drops its task, whose settler runs the post hooks.
        if opts.async_op {
            let work = lane.submit(op, &self.lanes.label, watched, true, Box::new(task))?;
            watch(work.clone());
            return Ok(work);
        }
        lane.run_blocking(op, &self.lanes.label, watched, watch, task)?;
        Ok(done())
    }
}

/// Checks that `bytes` at `offset` lie within `rank`'s window of `size`
/// bytes, naming the offset argument `arg`.
fn check_span(arg: &str, offset: usize, bytes: usize, rank: i32, size: usize) -> Result<()> {
    match offset.checked_add(bytes) {
        Some(end) if end <= size => Ok(()),
        Some(end) => Err(Error::invalid_argument(format!(
            "argument '{arg}': {bytes} bytes at offset {offset} end at byte {end}, past the end of rank {rank}'s window of {size} bytes"
        ))),
        None => Err(Error::invalid_argument(format!(
            "argument '{arg}': offset {offset} + {bytes} bytes overflows the address range (rank {rank}'s window has {size} bytes)"
        ))),
    }
}

fn done() -> Arc<dyn Work> {
    Arc::new(DoneWork(Ok(())))
}

impl Drop for Window {
    fn drop(&mut self) {
        // Nothing more starts; then closing the backend ends the running
        // calls (in-flight sends and waits fail with Aborted).
        let lanes = &self.lanes;
        let left = [lanes.origin.stop(), lanes.wait.stop()];
        lanes.close_backend();
        for jobs in left {
            jobs.abandon(&lanes.label);
        }
        lanes.origin.join();
        lanes.wait.join();
    }
}

#[cfg(test)]
mod watchdog_tests;
