//! Point-to-point completed on the caller's thread: an asynchronous send
//! whose whole message fits the free space of its ring, and an asynchronous
//! receive whose message is complete already (an early message, or whole at
//! the front of the ring). Issued from the progress thread instead, each
//! small message cost a hand-off to that thread and a wake of the caller
//! at its completion: most of a small non-blocking transfer's time.
//!
//! A receive whose message is not (all) there yet polls for it briefly
//! (about 2 µs) while its sender runs on another CPU and the engine's
//! waits poll ([`super::super::wait`]): back-to-back messages arrive that
//! soon. Anything that would wait longer, or leave a message half read,
//! is declined with nothing done, and the operation runs on the progress
//! thread as before. The executor asks only when nothing is queued or
//! running ahead, so matching on (peer, tag) in order is kept: an early
//! message with the receive's tag is taken first, and a message of another
//! tag at the front of the ring declines (the progress thread's receive
//! sets it aside).

use super::*;

/// Largest message completed at once: a copy that an asynchronous call may
/// make on its caller's thread (larger ones go to the progress thread,
/// overlapping the caller's work, as before).
pub(in crate::backends::gloo) const AT_ONCE_MAX: usize = PIECE;

/// Polls a receive makes for a message on its way (see
/// [`IntraHost::receive_arriving`]): about 2 µs here.
const ARRIVING_POLLS: u32 = 80;

impl IntraHost {
    /// Completes `t` now when no peer has to act first: `Some(Ok(None))`
    /// done, `Some(Ok(Some(why)))` a receive that does not match its
    /// message (skipped, as [`IntraHost::point_to_point`] does),
    /// `Some(Err(_))` a corrupt ring; None, with nothing done, otherwise.
    ///
    /// # Safety
    /// `t`'s buffer is valid for its bytes until this returns.
    pub unsafe fn transfer_at_once(&self, t: &Transfer) -> Option<Result<Option<String>>> {
        // A receive from any source waits for the first of several rings.
        if t.bytes() > AT_ONCE_MAX || t.peer == ANY {
            return None;
        }
        // Held by an operation of another thread (a window's, say): decline.
        let mut inboxes = self.p2p.as_ref()?.try_lock().ok()?;
        match t.is_send {
            true => self.send_at_once(t).then_some(Ok(None)),
            false => self.receive_arriving(&mut inboxes.0[t.peer], t),
        }
    }

    /// [`IntraHost::receive_at_once`], polling up to [`ARRIVING_POLLS`]
    /// times for a message not (all) there yet while its sender runs on
    /// another CPU: a sender issuing messages back to back is usually
    /// a fraction of a microsecond away, and a declined receive costs a
    /// hand-off to the progress thread (and, when that thread shares this
    /// CPU, switches to it and back).
    unsafe fn receive_arriving(
        &self,
        inbox: &mut Inbox,
        t: &Transfer,
    ) -> Option<Result<Option<String>>> {
        let mut polls = 0;
        loop {
            match self.receive_at_once(inbox, t) {
                Arrival::Done(outcome) => return Some(outcome),
                Arrival::Declined => return None,
                Arrival::NotYet if polls == 0 && !self.may_spin_for(t.peer) => return None,
                Arrival::NotYet if polls == ARRIVING_POLLS => return None,
                Arrival::NotYet => {
                    polls += 1;
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// Writes send `t` into its ring when the whole message fits: header
    /// and body, then one store of the head (the receiver sees the whole
    /// message at once) and one look for a sleeping receiver.
    unsafe fn send_at_once(&self, t: &Transfer) -> bool {
        let q = t.peer;
        let ring = self.ring(self.rank, q);
        let data = ring.add(CONTROL);
        let head_word = Self::head(ring);
        let head = head_word.load(Ordering::Relaxed);
        let used = head - Self::tail(ring).load(Ordering::Acquire);
        let bytes = t.bytes();
        let body = padded(bytes);
        if RING - (used as usize) < HEADER + body {
            return false;
        }
        Self::write_header(data, head, t);
        // The body may wrap at the ring's end (a header never does).
        let at = (head as usize + HEADER) % RING;
        let first = bytes.min(RING - at);
        std::ptr::copy_nonoverlapping(t.buf, data.add(at), first);
        std::ptr::copy_nonoverlapping(t.buf.add(first), data, bytes - first);
        head_word.store(head + (HEADER + body) as u64, Ordering::Release);
        self.notify(q);
        true
    }

    /// Receive `t` from the early messages or the ring, when its message
    /// is complete there.
    unsafe fn receive_at_once(&self, inbox: &mut Inbox, t: &Transfer) -> Arrival {
        if let Some(k) = inbox.early.iter().position(|e| e.tag == t.tag) {
            if !inbox.early[k].complete {
                return Arrival::Declined;
            }
            let Some(e) = inbox.early.remove(k) else {
                return Arrival::Declined;
            };
            if let Some(why) = self.mismatch(t, t.peer, e.count, e.dtype) {
                return Arrival::Done(Ok(Some(why)));
            }
            std::ptr::copy_nonoverlapping(e.data.as_ptr(), t.buf, e.data.len());
            return Arrival::Done(Ok(None));
        }
        // The front message is being read elsewhere (skipped): not ours.
        if inbox.reading.is_some() {
            return Arrival::Declined;
        }
        let q = t.peer;
        let ring = self.ring(q, self.rank);
        let data = ring.add(CONTROL);
        let (head_word, tail_word) = (Self::head(ring), Self::tail(ring));
        let head = head_word.load(Ordering::Acquire);
        let tail = tail_word.load(Ordering::Relaxed);
        let there = (head - tail) as usize;
        if there < HEADER {
            return Arrival::NotYet;
        }
        let [magic_tag, bytes, count, dtype] =
            (data.add(tail as usize % RING) as *const [u64; 4]).read();
        if magic_tag >> 32 != MAGIC {
            return Arrival::Done(Err(Error::internal(format!(
                "point-to-point ring from rank {q} to rank {} is corrupt",
                self.rank
            ))));
        }
        let bytes = bytes as usize;
        let body = padded(bytes);
        if magic_tag as u32 != t.tag {
            return Arrival::Declined;
        }
        if there < HEADER + body {
            return Arrival::NotYet;
        }
        let why = self.mismatch(t, q, count, dtype);
        if why.is_none() {
            // The body may wrap at the ring's end (a header never does).
            let at = (tail as usize + HEADER) % RING;
            let first = bytes.min(RING - at);
            std::ptr::copy_nonoverlapping(data.add(at), t.buf, first);
            std::ptr::copy_nonoverlapping(data, t.buf.add(first), bytes - first);
        }
        tail_word.store(tail + (HEADER + body) as u64, Ordering::Release);
        self.notify(q);
        Arrival::Done(Ok(why))
    }
}

/// What a look for a receive's message found.
enum Arrival {
    /// Received (or skipped on a mismatch, or the ring is corrupt).
    Done(Result<Option<String>>),
    /// Its message is not (all) in the ring yet.
    NotYet,
    /// Another thread's or another tag's message is in the way.
    Declined,
}
