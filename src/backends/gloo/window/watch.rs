//! The watcher: a receive no peer matches, posted on every connection, that
//! fails when a connection does.

use super::super::shim::{UnboundBuffer, Waited};
use super::{Inner, Watch, SLOT_WATCH};
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Inner {
    pub(super) fn start_watch(self: &Arc<Self>) -> Result<()> {
        let n = self.size as usize;
        let mut mem = vec![0u8; n];
        // SAFETY: `mem` lives in the Watch next to the buffer, which is
        // dropped first (close joins the thread, then drops both).
        let buf = unsafe { UnboundBuffer::new(self.ctx(), mem.as_mut_ptr(), n) }
            .map_err(|e| Error::new(e.kind(), format!("gloo {}: {}", self.label, e.message)))?;
        let buf = Arc::new(buf);
        for p in (0..self.size).filter(|p| *p != self.rank) {
            buf.recv(p, SLOT_WATCH, p as usize, 1)
                .map_err(|e| self.fail("watch", p, e))?;
        }
        let me = self.clone();
        let b = buf.clone();
        let thread = std::thread::Builder::new()
            .name("tc-gloo-win-watch".into())
            .spawn(move || me.watch(b))
            .map_err(|e| Error::system("starting the window's watcher thread", e))?;
        self.state().watch = Some(Watch {
            buf,
            _mem: mem,
            thread: Some(thread),
        });
        Ok(())
    }

    /// Ends when a connection fails (the window becomes unusable) or at close.
    pub(super) fn watch(&self, buf: Arc<UnboundBuffer>) {
        loop {
            match buf.wait_recv(None) {
                Ok(Waited::Aborted) => return,
                Ok(Waited::Done(_)) => continue, // nobody sends on this slot
                Err(e) => {
                    let peer = self.peer_in_message(&e.message);
                    let who = peer.map_or("a peer's connection".to_string(), |p| {
                        format!("the connection to rank {p}")
                    });
                    let msg = format!(
                        "gloo {} on rank {}: {who} failed (the peer died, was killed, or freed the window): {}",
                        self.label, self.rank, e.message
                    );
                    let mut st = self.state();
                    if st.closed {
                        return;
                    }
                    if st.registered && st.deregistering {
                        // A peer that finished deregistering may free its
                        // window while this rank still takes the last
                        // STOPs; its own STOP arrived before its connection
                        // closed. Give the service a moment to count it.
                        if let Some(p) = peer {
                            let grace = Instant::now() + Duration::from_millis(500);
                            while !st.stopped[p as usize]
                                && !st.service_done
                                && Instant::now() < grace
                            {
                                st = self
                                    .cv
                                    .wait_timeout(st, Duration::from_millis(20))
                                    .unwrap_or_else(|e| e.into_inner())
                                    .0;
                            }
                            if !st.stopped[p as usize] && !st.service_done {
                                drop(st);
                                crate::log_warn!("{msg}");
                                self.mark_broken(Error::remote(msg));
                                return;
                            }
                        }
                    }
                    if !st.registered || st.deregistering {
                        // Not serving: fail the next register/put/signal
                        // only (see `lost`).
                        crate::log_info!("{msg}");
                        st.lost = Some(Error::remote(msg));
                        st.lost_peer = peer;
                        self.wake();
                        return;
                    }
                    drop(st);
                    crate::log_warn!("{msg}");
                    self.mark_broken(Error::remote(msg));
                    return;
                }
            }
        }
    }
}
