//! The comm's side of its windows (src/window/): the comm keeps a weak
//! reference to each window's lanes, waits for them at finalize and ends
//! them at abort. The window module depends on the comm, not the other way
//! round: the comm sees a window only through [`WindowLanes`].

use super::Comm;
use crate::error::Error;
use crate::util::lock;
use std::sync::{Arc, Weak};

/// What a comm does with the calls of one of its windows. Nothing in here
/// calls into the comm; the comm calls it holding none of its locks.
pub trait WindowLanes: Send + Sync {
    /// Blocks until no call of the window is queued or running; returns
    /// the first failure of an asynchronous call that no drain returned
    /// yet.
    fn drain(&self) -> Option<Error>;

    /// The comm was aborted (`err` says how): queued calls complete with
    /// `err`, later ones are refused, and the running one is ended.
    fn abort_outstanding(&self, err: &Error);
}

impl Comm {
    /// Tracks a new window's lanes (see [`Comm::finalize`], [`Comm::abort`]).
    pub(crate) fn add_window(&self, lanes: Weak<dyn WindowLanes>) {
        let mut windows = lock(&self.windows);
        windows.retain(|w| w.strong_count() > 0);
        windows.push(lanes);
    }

    /// The lanes of the windows still alive, taken out of the lock: the
    /// comm calls into its windows holding none of its locks.
    pub(super) fn live_windows(&self) -> Vec<Arc<dyn WindowLanes>> {
        let mut windows = lock(&self.windows);
        windows.retain(|w| w.strong_count() > 0);
        windows.iter().filter_map(Weak::upgrade).collect()
    }

    /// Ends the outstanding calls of the comm's windows with `err`
    /// (`ErrorKind::Aborted`) and closes their backends.
    pub(super) fn abort_windows(&self, err: &Error) {
        for w in self.live_windows() {
            w.abort_outstanding(err);
        }
    }
}
