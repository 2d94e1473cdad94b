//! The NCCL comm's lifecycle: counted uses of the comm ([`CommUse`]), NCCL
//! calls settled on blocking and non-blocking comms, and the abort and
//! finalize paths that free the comm exactly once (see "Abort and
//! concurrent users" on [`NcclBackend`]).

use super::loader::*;
use super::NcclBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::util::lock;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

pub(super) const LIVE: u8 = 0;
/// Abort or finalize has begun: no new user may take the comm.
const CLOSING: u8 = 1;
const RELEASED: u8 = 2;

/// How long `abort` waits for the users of the comm to leave before it
/// concludes that one is blocked inside NCCL and calls ncclCommAbort under
/// it (which NCCL allows, to unblock it). Issuing takes microseconds, and a
/// non-blocking comm's polling loop notices the abort within 50 us.
pub(super) const ABORT_GRACE: Duration = Duration::from_millis(200);

/// Who holds the NCCL comm. See "Abort and concurrent users" on
/// [`NcclBackend`].
pub(super) struct Slot {
    /// Threads between [`NcclBackend::acquire`] and the drop of its guard.
    pub(super) users: u32,
}

/// A counted use of the comm (see [`NcclBackend::acquire`]).
pub(super) struct CommUse<'a>(&'a NcclBackend);

impl Drop for CommUse<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.slot);
        s.users -= 1;
        if s.users == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl NcclBackend {
    pub(super) fn comm(&self) -> NcclComm {
        self.comm.load(Ordering::Acquire)
    }

    pub(super) fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) == LIVE
    }

    pub(super) fn closed_error(&self) -> Error {
        self.shared.failure().unwrap_or_else(|| {
            Error::new(
                ErrorKind::Aborted,
                format!("nccl comm '{}' was aborted or finalized", self.name),
            )
        })
    }

    /// Counts the caller as a user of the comm until the guard drops; fails
    /// once abort or finalize began.
    pub(super) fn acquire(&self) -> Result<CommUse<'_>> {
        let mut s = lock(&self.slot);
        if !self.is_live() {
            return Err(self.closed_error());
        }
        s.users += 1;
        Ok(CommUse(self))
    }

    /// The comm for NCCL's error details: NULL (NCCL's global last error)
    /// once the comm is no longer LIVE.
    pub(super) fn detail_comm(&self) -> NcclComm {
        if self.is_live() {
            self.comm()
        } else {
            std::ptr::null_mut()
        }
    }

    /// Makes one NCCL call on the comm (the caller holds a [`CommUse`]):
    /// the state is checked just before it, and its result settled.
    pub(super) fn call(&self, what: &str, f: impl FnOnce(NcclComm) -> NcclResult) -> Result<()> {
        if !self.is_live() {
            return Err(self.closed_error().context(what));
        }
        let r = f(self.comm());
        self.settle(r, what)
    }

    /// Result of an NCCL call; on a non-blocking comm, waits (up to the
    /// comm's timeout) until an in-progress call settled, and stops waiting
    /// (without touching the comm again) once it is aborted.
    pub(super) fn settle(&self, r: NcclResult, what: &str) -> Result<()> {
        let r = self.settled(r, what)?;
        self.lib.check(r, what, self.detail_comm())
    }

    /// The final result of a call that answered `r`: on a non-blocking comm,
    /// an in-progress call is polled until NCCL reports something else. An
    /// error means the waiting stopped (timeout, abort, a failed poll) while
    /// NCCL may still be at work.
    pub(super) fn settled(&self, r: NcclResult, what: &str) -> Result<NcclResult> {
        if r != NCCL_IN_PROGRESS || !self.nonblocking {
            return Ok(r);
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            if !self.is_live() {
                return Err(self.closed_error().context(what));
            }
            let mut state = NCCL_SUCCESS;
            let r2 = {
                let _polling = lock(&self.poll);
                // SAFETY: the caller holds a use of the comm; valid out-pointer.
                unsafe { (self.lib.comm_get_async_error)(self.comm(), &mut state) }
            };
            self.lib
                .check(r2, "ncclCommGetAsyncError", self.detail_comm())?;
            match state {
                NCCL_IN_PROGRESS if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(50))
                }
                NCCL_IN_PROGRESS => {
                    return Err(Error::timeout(format!(
                        "{what} still in progress after {} ms",
                        self.timeout.as_millis()
                    )))
                }
                s => return Ok(s),
            }
        }
    }

    /// Stops new users (CLOSING) and waits up to `wait` for the current ones
    /// to leave. Returns the comm for the caller to free, and how many users
    /// are still inside; None when another closer already took the comm.
    pub(super) fn close(&self, wait: Duration) -> Option<(NcclComm, u32)> {
        let mut s = lock(&self.slot);
        if self.state.load(Ordering::Acquire) == RELEASED {
            return None;
        }
        self.state.store(CLOSING, Ordering::Release);
        s = self.wait_for_users(s, wait);
        // Two closers may have waited together: the first one here takes it.
        let c = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        self.state.store(RELEASED, Ordering::Release);
        (!c.is_null()).then_some((c, s.users))
    }

    /// Waits up to `wait` (under `slot`, released while waiting) for the
    /// comm's users to leave.
    fn wait_for_users<'a>(
        &self,
        mut s: MutexGuard<'a, Slot>,
        wait: Duration,
    ) -> MutexGuard<'a, Slot> {
        let deadline = Instant::now() + wait;
        while s.users > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            s = self
                .idle
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        s
    }

    /// After a failure, where the loaded NCCL has ncclCommRevoke (2.28+):
    /// revokes the comm instead of aborting it, so that its operations stop
    /// (NCCL quiesces it) while the comm stays for the survivors'
    /// ncclCommShrink. New users are held off (CLOSING) while the call is
    /// made, then the comm is LIVE again, marked revoked: the comm layer
    /// refuses operations on it (it is aborted there), it is never
    /// finalized, and it is freed with ncclCommAbort when the backend goes.
    /// True when the comm is revoked (now or before); false when it could
    /// not be (no ncclCommRevoke, closing, a user still inside NCCL after
    /// the grace, or the call failed): the caller aborts it.
    pub(super) fn revoke_comm(&self) -> bool {
        let Some(revoke) = self.lib.comm_revoke else {
            return false;
        };
        let _one_at_a_time = lock(&self.revoking);
        if self.revoked.load(Ordering::Acquire) {
            return true;
        }
        let mut s = lock(&self.slot);
        if !self.is_live() {
            return false;
        }
        self.state.store(CLOSING, Ordering::Release);
        s = self.wait_for_users(s, ABORT_GRACE);
        if s.users > 0 {
            return false; // left CLOSING: the abort that follows frees it
        }
        let _ctx = self.device.scoped();
        // SAFETY: a live comm with no user inside (new ones held off).
        let r = unsafe { revoke(self.comm(), NCCL_REVOKE_DEFAULT) };
        let done = match r {
            NCCL_SUCCESS => Ok(()),
            // Non-blocking: quiescing goes on in the background until the
            // comm's state leaves ncclInProgress (to the failure it already
            // had, as likely as not).
            NCCL_IN_PROGRESS => self.wait_revoked(),
            r => Err(self.lib.error(r, "ncclCommRevoke", self.comm())),
        };
        if let Err(e) = done {
            crate::log_warn!(
                "nccl comm '{}': {}; aborting it instead",
                self.name,
                e.message
            );
            return false;
        }
        self.revoked.store(true, Ordering::Release);
        self.state.store(LIVE, Ordering::Release);
        crate::log_info!(
            "nccl comm '{}' revoked after its failure (ncclCommRevoke): it can be shrunk",
            self.name
        );
        true
    }

    /// Polls a non-blocking comm's revocation until its state is no longer
    /// ncclInProgress (the caller holds the comm alone).
    fn wait_revoked(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let mut state = NCCL_IN_PROGRESS;
            let r = {
                let _polling = lock(&self.poll);
                // SAFETY: a live comm held by the caller; valid out-pointer.
                unsafe { (self.lib.comm_get_async_error)(self.comm(), &mut state) }
            };
            if r != NCCL_SUCCESS {
                return Err(self.lib.error(
                    r,
                    "ncclCommGetAsyncError after ncclCommRevoke",
                    self.comm(),
                ));
            }
            if state != NCCL_IN_PROGRESS {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "ncclCommRevoke still in progress after {} ms",
                    self.timeout.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Aborts the NCCL comm (not waiting for peers); see "Abort and
    /// concurrent users" on [`NcclBackend`].
    pub(super) fn abort_comm(&self) -> Result<()> {
        let Some((c, inside)) = self.close(ABORT_GRACE) else {
            return Ok(());
        };
        if inside > 0 {
            crate::log_warn!(
                "nccl comm '{}': {inside} call(s) still inside NCCL after {} ms; calling ncclCommAbort to unblock them",
                self.name,
                ABORT_GRACE.as_millis()
            );
        }
        let _ctx = self.device.scoped();
        // SAFETY: `c` was taken out of the backend by `close` (freed once);
        // no user is inside except one blocked in NCCL, which NCCL allows.
        self.lib.check(
            unsafe { (self.lib.comm_abort)(c) },
            "ncclCommAbort",
            std::ptr::null_mut(),
        )
    }

    /// Finalizes and destroys the NCCL comm, after the users left (waiting
    /// up to the comm's timeout; one still inside then means abort).
    pub(super) fn finalize_comm(&self) -> Result<()> {
        if self.revoked.load(Ordering::Acquire) {
            // NCCL does not finalize a revoked comm: it is only freed.
            self.abort_comm()?;
            return Err(self.closed_error());
        }
        let Some((c, inside)) = self.close(self.timeout) else {
            return Ok(());
        };
        let _ctx = self.device.scoped();
        if inside > 0 {
            // SAFETY: as in `abort_comm`.
            unsafe { (self.lib.comm_abort)(c) };
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("nccl comm '{}': an operation was still being issued {} ms into finalize; aborted", self.name, self.timeout.as_millis()),
            ));
        }
        // SAFETY: `c` is ours alone now (taken by `close`, no users left).
        unsafe {
            let r = (self.lib.comm_finalize)(c);
            let fin = if r == NCCL_IN_PROGRESS || r == NCCL_SUCCESS {
                // Non-blocking comms finish finalizing asynchronously.
                let deadline = Instant::now() + self.timeout;
                loop {
                    let mut st = NCCL_SUCCESS;
                    let r2 = (self.lib.comm_get_async_error)(c, &mut st);
                    if r2 != NCCL_SUCCESS || st != NCCL_IN_PROGRESS || Instant::now() > deadline {
                        break if r2 != NCCL_SUCCESS { r2 } else { st };
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            } else {
                r
            };
            if fin != NCCL_SUCCESS {
                let e = self.lib.error(fin, "ncclCommFinalize", c);
                (self.lib.comm_abort)(c);
                return Err(e);
            }
            self.lib.check(
                (self.lib.comm_destroy)(c),
                "ncclCommDestroy",
                std::ptr::null_mut(),
            )
        }
    }
}
