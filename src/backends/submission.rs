//! What the comm hands a backend with each operation ([`Submission`]) and
//! the comm's side a host backend's executor reaches while it runs one
//! ([`CommLink`]). The comm keeps its own bookkeeping (flight recorder,
//! watchdog list, hooks) behind these, so that a backend needs nothing of
//! `crate::comm`.

use crate::error::{Error, ErrorKind, Result};
use crate::op::{Op, OpOptions};
use crate::work::Work;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

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
    /// The comm, for an operation run on the calling thread (the progress
    /// thread reaches it through [`CommLink`]).
    pub comm: &'a dyn CommEvents,
    /// Called exactly once, before the operation can run.
    pub issued: &'a mut dyn FnMut(&Op, Issue<'_>),
    /// The application's post hooks, if any.
    pub post: Option<PostHook>,
}

impl Submission<'_> {
    /// The operation was refused: the comm records it, the post hooks see
    /// the error; returns it.
    #[inline]
    pub fn refuse(mut self, op: &Op, e: Error) -> Error {
        (self.issued)(op, Issue::Refused(e.kind));
        if let Some(post) = self.post.take() {
            post(&Err(e.clone()), true);
        }
        e
    }

    /// The operation is enqueued on a stream as `work` (device backends):
    /// watched, and its post hooks run now with `completed` false.
    #[inline]
    pub fn enqueued(mut self, op: &Op, work: &Arc<dyn Work>) {
        (self.issued)(op, Issue::Watched(work));
        if let Some(post) = self.post.take() {
            post(&Ok(()), false);
        }
    }

    /// The operation had nothing to do: `work` is complete.
    #[inline]
    pub fn done_at_once(mut self, op: &Op, work: &Arc<dyn Work>) {
        (self.issued)(op, Issue::Done(work));
        if let Some(post) = self.post.take() {
            post(&Ok(()), true);
        }
    }
}

/// The comm as the host executor sees it while an operation runs.
pub trait CommEvents: Send + Sync {
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
