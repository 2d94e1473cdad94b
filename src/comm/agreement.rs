//! The members of a comm about to be made check through the store that
//! they all passed the same thing (shrink's exclusion list, reconfigure's
//! member list) before they rendezvous: a member that passed something
//! else gets an error naming who differs instead of a hang, and one that
//! never comes is named when the timeout ends the wait.

use crate::error::{Error, ErrorKind, Result};
use crate::store::StoreRef;
use crate::util::Deadline;
use std::time::Duration;

/// Where and for how long the members agree: each publishes under
/// `{scope}/{member}` of `store`.
pub(super) struct Agreement<'a> {
    pub store: &'a StoreRef,
    pub scope: &'a str,
    pub timeout: Duration,
}

impl Agreement<'_> {
    /// Publishes `mine` as member `me` and checks that each of `peers`
    /// published the same text within the timeout. A peer that did not is
    /// worded by `missing(peer, store's timeout message)`; one that
    /// published another text by `differs(peer, its text)`.
    pub(super) fn agree<'p>(
        &self,
        me: &str,
        mine: &str,
        peers: impl IntoIterator<Item = &'p str>,
        missing: impl Fn(&str, &str) -> Error,
        differs: impl Fn(&str, &str) -> Error,
    ) -> Result<()> {
        let scope = self.scope;
        self.store.set(&format!("{scope}/{me}"), mine.as_bytes())?;
        let deadline = Deadline::after(self.timeout);
        for peer in peers.into_iter().filter(|p| *p != me) {
            let key = format!("{scope}/{peer}");
            self.store
                .wait(&[key.as_str()], Some(deadline.remaining()))
                .map_err(|e| match e.kind {
                    ErrorKind::Timeout => missing(peer, &e.message),
                    _ => e,
                })?;
            let theirs = String::from_utf8_lossy(&self.store.get(&key)?).into_owned();
            if theirs != mine {
                return Err(differs(peer, &theirs));
            }
        }
        Ok(())
    }
}
