//! Sends through Gloo that complete once their bytes are buffered, as the
//! shared-memory path's do.
//!
//! Gloo's TCP transport pairs a send with its receive by a rendezvous: the
//! payload leaves only after the receiver posted its buffer. Operations of
//! a comm run one at a time, so a send that waited for its receive would
//! hold up this rank's own later receives: two ranks that both send first
//! (even with asynchronous sends) would wait for each other forever. So a
//! send copies its descriptor and payload into memory of its own, posts
//! both to Gloo and completes; Gloo's network thread moves the bytes when
//! the receive is posted. Its posts are waited for later: when more than
//! [`MAX_BYTES`] or [`MAX_SENDS`] are buffered (the oldest first, by then
//! usually long done), and by `finalize`. A failure found there (a peer
//! that exited before receiving, a timeout) fails that operation and
//! breaks the comm, named, as any Gloo failure does.

use super::{shim, GlooTcp};
use crate::backends::gloo::memory::{copy, Scratch};
use crate::error::{Error, ErrorKind, Result};
use crate::util::{lock, Deadline};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Buffered payload bytes beyond which a new send first waits for the
/// oldest ones (past it, a send waits for its receive, as Gloo's own).
const MAX_BYTES: usize = 64 << 20;
/// Buffered sends beyond which a new send first waits for the oldest.
const MAX_SENDS: usize = 1024;
/// The descriptor ahead of the payload: element count, dtype, bytes.
pub(super) const DESC_WORDS: usize = 3;
pub(super) const DESC_BYTES: usize = DESC_WORDS * 8;

/// One send in flight: its descriptor and payload in one allocation,
/// posted as two Gloo sends (one when the payload is empty).
struct InFlight {
    /// Declared first: dropped before the memory it covers.
    ubuf: shim::UnboundBuffer,
    _memory: Scratch,
    posts: usize,
    bytes: usize,
    peer: i32,
    deadline: Deadline,
}

#[derive(Default)]
struct Queue {
    sends: VecDeque<InFlight>,
    bytes: usize,
}

/// The sends of one comm whose Gloo posts were not waited for yet. Must be
/// dropped before the comm's Gloo context.
#[derive(Default)]
pub(super) struct BufferedSends(Mutex<Queue>);

impl GlooTcp {
    /// Buffers a send of `bytes` at `payload` to `peer` under `desc` and
    /// posts it (descriptor to `desc_slot`, payload to `data_slot`).
    ///
    /// # Safety
    /// `payload` is valid for reads of `bytes`.
    pub(super) unsafe fn buffered_send(
        &self,
        peer: i32,
        desc: [u64; DESC_WORDS],
        payload: *const u8,
        (desc_slot, data_slot): (u64, u64),
        d: &Deadline,
    ) -> Result<()> {
        let bytes = desc[2] as usize;
        self.make_room(bytes)?;
        let mut memory = Scratch::new(DESC_BYTES + bytes)?;
        copy(memory.ptr(), desc.as_ptr() as *const u8, DESC_BYTES);
        copy(memory.ptr().add(DESC_BYTES), payload, bytes);
        let what = "point-to-point send";
        let ubuf = shim::UnboundBuffer::new(self.ctx(), memory.ptr(), DESC_BYTES + bytes)
            .map_err(|e| self.fail(what, e))?;
        ubuf.send(peer, desc_slot, 0, DESC_BYTES)
            .map_err(|e| self.fail(what, e))?;
        let mut posts = 1;
        if bytes > 0 {
            // Posted already: on failure it is waited for with the rest.
            let sent = ubuf.send(peer, data_slot, DESC_BYTES, bytes);
            posts += sent.is_ok() as usize;
            sent.map_err(|e| self.fail(what, e))?;
        }
        let mut q = lock(&self.buffered.0);
        q.bytes += bytes;
        q.sends.push_back(InFlight {
            ubuf,
            _memory: memory,
            posts,
            bytes,
            peer,
            deadline: *d,
        });
        Ok(())
    }

    /// Waits for the oldest sends until `bytes` more fit the limits.
    fn make_room(&self, bytes: usize) -> Result<()> {
        loop {
            let oldest = {
                let mut q = lock(&self.buffered.0);
                let full = q.sends.len() >= MAX_SENDS || q.bytes + bytes > MAX_BYTES;
                // Not popped unless full: dropping a send cancels it.
                if !full {
                    return Ok(());
                }
                let Some(s) = q.sends.pop_front() else {
                    return Ok(());
                };
                q.bytes -= s.bytes;
                s
            };
            self.complete(oldest)?;
        }
    }

    /// Waits until every buffered send was received (each by its own
    /// operation's deadline).
    pub(in crate::backends::gloo) fn flush_buffered_sends(&self) -> Result<()> {
        loop {
            let oldest = {
                let mut q = lock(&self.buffered.0);
                let Some(s) = q.sends.pop_front() else {
                    return Ok(());
                };
                q.bytes -= s.bytes;
                s
            };
            self.complete(oldest)?;
        }
    }

    fn complete(&self, s: InFlight) -> Result<()> {
        let what = format!(
            "point-to-point send of {} bytes to rank {} (buffered; completed \
             on this rank when it was issued)",
            s.bytes, s.peer
        );
        for _ in 0..s.posts {
            let left = s.deadline.left()?;
            match s.ubuf.wait_send(Some(left)) {
                Ok(shim::Waited::Done(_)) => {}
                Ok(shim::Waited::Aborted) => {
                    return Err(Error::new(ErrorKind::Aborted, format!("{what}: aborted")))
                }
                Err(mut e) => {
                    e.peer.get_or_insert(s.peer);
                    return Err(self.fail(&what, e));
                }
            }
        }
        Ok(())
    }
}
