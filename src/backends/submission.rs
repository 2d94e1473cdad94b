//! What the comm hands a backend with each operation ([`Submission`]) and
//! the one way back from a backend to its comm ([`CommEvents`]: what
//! became of an operation as it was issued, whether the comm is still
//! active, an operation that failed), reached directly on the calling
//! thread and through the [`CommLink`] from a backend's own threads. The
//! comm keeps its own bookkeeping (flight recorder, watchdog list) behind
//! it, so that a backend needs nothing of `crate::comm`; the application's
//! post hooks travel with their operation.

use crate::error::{Error, ErrorKind, Result};
use crate::op::{Op, OpOptions};
use crate::work::Work;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The post hooks owed to one operation: run once with its outcome and
/// whether it finished (false: a device operation only enqueued).
pub type PostHook = Box<dyn FnOnce(&Result<()>, bool) + Send>;

/// What became of a submitted operation, told to the comm once.
pub enum Issue<'w> {
    /// Refused before anything was issued.
    Refused(ErrorKind),
    /// Issued; the comm's watchdog guards the work.
    Watched(&'w Arc<dyn Work>),
    /// Nothing to do: the work is complete already.
    Done(&'w Arc<dyn Work>),
}

/// One validated operation's issue request (see [`super::Backend::submit`]).
pub struct Submission<'a> {
    pub opts: &'a OpOptions,
    /// The operation's timeout (the comm's default when `opts` has none).
    pub timeout: Duration,
    /// False when the operation is known to hold host buffers only (a
    /// persistent operation's set-up found it): no look for CUDA buffers.
    pub may_be_device: bool,
    /// "comm 'name' (rank r/n)", for the work's messages.
    pub label: &'a Arc<str>,
    /// The comm, told once what became of the operation before it can run
    /// ([`CommEvents::issued`]), and reached by an operation run on the
    /// calling thread (the progress thread reaches it through
    /// [`CommLink`]).
    pub comm: &'a dyn CommEvents,
    /// The operation's number in the comm's flight recorder.
    pub seq: u64,
    /// The application's post hooks, if any.
    pub post: Option<PostHook>,
}

impl Submission<'_> {
    /// The operation was refused: the comm records it, the post hooks see
    /// the error; returns it.
    #[inline]
    pub fn refuse(mut self, op: &Op, e: Error) -> Error {
        self.tell(op, Issue::Refused(e.kind));
        if let Some(post) = self.post.take() {
            post(&Err(e.clone()), true);
        }
        e
    }

    /// The operation is enqueued on a stream as `work` (device backends):
    /// watched, and its post hooks run now with `completed` false.
    #[inline]
    pub fn enqueued(mut self, op: &Op, work: &Arc<dyn Work>) {
        self.tell(op, Issue::Watched(work));
        if let Some(post) = self.post.take() {
            post(&Ok(()), false);
        }
    }

    /// The operation had nothing to do: `work` is complete.
    #[inline]
    pub fn done_at_once(mut self, op: &Op, work: &Arc<dyn Work>) {
        self.tell(op, Issue::Done(work));
        if let Some(post) = self.post.take() {
            post(&Ok(()), true);
        }
    }
}

impl Submission<'_> {
    /// Tells the comm what became of the operation (exactly once, before
    /// it can run).
    #[inline]
    pub fn tell(&self, op: &Op, issue: Issue<'_>) {
        self.tell_at(op, issue, Instant::now());
    }

    /// [`Submission::tell`] with the time of issue the caller read (and
    /// uses again, for a work it starts at once).
    #[inline]
    pub fn tell_at(&self, op: &Op, issue: Issue<'_>, at: Instant) {
        self.comm
            .issued(self.seq, op, self.opts.async_op, issue, at);
    }
}

/// The comm as its backend sees it: the one way back.
pub trait CommEvents: Send + Sync {
    /// What became of operation `seq` (`op`, asynchronous or not) as it was
    /// issued at `at`: the comm records it and watches its work.
    fn issued(&self, seq: u64, op: &Op, async_op: bool, issue: Issue<'_>, at: Instant);
    /// Fails once the comm was finalized or aborted.
    fn check_active(&self) -> Result<()>;
    /// An operation failed: the comm decides whether it aborts.
    fn operation_failed(&self, err: Error);
}

/// The way back from a backend to its comm, made before the comm (it is in
/// [`super::BackendInit`]) and connected once the comm exists. Holds the
/// comm weakly: the comm owns its backend.
#[derive(Clone, Default)]
pub struct CommLink(Arc<OnceLock<Weak<dyn CommEvents>>>);

impl CommLink {
    /// Connects the link to its comm (once; later calls change nothing).
    pub fn connect(&self, comm: Weak<dyn CommEvents>) {
        let _ = self.0.set(comm);
    }

    fn comm(&self) -> Option<Arc<dyn CommEvents>> {
        self.0.get().and_then(Weak::upgrade)
    }
}

/// The connected comm's answers; without one (not yet connected, or gone),
/// no operation may run.
impl CommEvents for CommLink {
    fn issued(&self, seq: u64, op: &Op, async_op: bool, issue: Issue<'_>, at: Instant) {
        if let Some(comm) = self.comm() {
            comm.issued(seq, op, async_op, issue, at);
        }
    }

    fn check_active(&self) -> Result<()> {
        match self.comm() {
            Some(comm) => comm.check_active(),
            None => Err(Error::invalid_usage(
                "the operation's comm no longer exists",
            )),
        }
    }

    fn operation_failed(&self, err: Error) {
        if let Some(comm) = self.comm() {
            comm.operation_failed(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Probe {
        active: bool,
        failures: Mutex<Vec<ErrorKind>>,
    }

    impl CommEvents for Probe {
        fn issued(&self, _: u64, _: &Op, _: bool, _: Issue<'_>, _: Instant) {}
        fn check_active(&self) -> Result<()> {
            if self.active {
                Ok(())
            } else {
                Err(Error::invalid_usage("finalized"))
            }
        }
        fn operation_failed(&self, err: Error) {
            self.failures.lock().unwrap().push(err.kind);
        }
    }

    #[test]
    fn a_link_reaches_its_comm_only_while_it_lives() {
        let link = CommLink::default();
        assert!(link.check_active().is_err(), "not connected yet");
        let probe = Arc::new(Probe {
            active: true,
            failures: Mutex::new(Vec::new()),
        });
        let weak: Weak<dyn CommEvents> = Arc::downgrade(&probe) as Weak<dyn CommEvents>;
        link.clone().connect(weak);
        assert!(link.check_active().is_ok());
        link.operation_failed(Error::new(ErrorKind::Remote, "peer lost"));
        assert_eq!(*probe.failures.lock().unwrap(), vec![ErrorKind::Remote]);
        drop(probe);
        assert!(link.check_active().is_err(), "the comm is gone");
        link.operation_failed(Error::new(ErrorKind::Remote, "ignored"));
    }
}
