//! Gets: reading a peer's registered buffer.
//!
//! From this rank's own buffer, or a same-host peer's buffer mapped here
//! (registered inside `tc_mem_alloc` memory), a get is a memory copy. Any
//! other peer is asked by message: the origin posts the receive of the
//! reply into the destination, then sends a GET header (offset, length and
//! the reply's slot) on the same connection as its puts; the target's
//! service sends the bytes from its registered buffer. The service takes one
//! header at a time, and a put's payload before the next header, so a get
//! reads every put this rank issued to that target before it. The copy
//! path needs no such care: puts to a mapped peer are copies, complete when
//! they return.

use super::super::shim::{UnboundBuffer, Waited};
use super::{ms, Inner, ServiceBufs, KIND_GET, MAGIC, SLOT_REPLY_BASE, SLOT_REPLY_MASK};
use crate::error::{Error, ErrorKind, Result};
use crate::util::Deadline;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Inner {
    /// Reads `bytes` at `src_offset` of `src_rank`'s registered buffer into
    /// `dst`.
    pub(super) fn get(
        &self,
        dst: *mut c_void,
        bytes: usize,
        src_rank: i32,
        src_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        let d = Deadline::after(timeout);
        let (own, size, mapped) = {
            let st = self.state();
            self.usable_fresh(&st, "get")?;
            if !st.registered {
                return Err(Error::invalid_usage(format!(
                    "gloo {} get: rank {} has no registered buffer (register first)",
                    self.label, self.rank
                )));
            }
            if src_rank < 0 || src_rank >= self.size {
                return Err(Error::invalid_argument(format!(
                    "argument 'src_rank': {src_rank} is outside the window's {} ranks",
                    self.size
                )));
            }
            (
                st.buf,
                st.sizes[src_rank as usize],
                st.mapped
                    .get(src_rank as usize)
                    .and_then(|m| m.as_ref())
                    .map(|m| m.ptr as usize),
            )
        };
        if !src_offset.checked_add(bytes).is_some_and(|end| end <= size) {
            return Err(Error::invalid_argument(format!(
                "argument 'src_offset': {src_offset} + {bytes} bytes exceeds the {size} bytes rank {src_rank} registered"
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let local = if src_rank == self.rank {
            Some(own)
        } else {
            mapped
        };
        if let Some(base) = local {
            // Orders this copy after stores other threads published before
            // the call (a put's copy ends with the same fence).
            std::sync::atomic::fence(Ordering::SeqCst);
            // SAFETY: in bounds of the registered buffer or its mapping
            // (checked above); memmove semantics for overlapping ranges.
            unsafe { std::ptr::copy((base as *const u8).add(src_offset), dst as *mut u8, bytes) };
            return Ok(());
        }
        self.fetch(dst as *mut u8, bytes, src_rank, src_offset, &d)
    }

    /// The message path of a get: posts the reply's receive, asks `peer`'s
    /// service for the bytes and waits for them.
    fn fetch(
        &self,
        dst: *mut u8,
        bytes: usize,
        peer: i32,
        offset: usize,
        d: &Deadline,
    ) -> Result<()> {
        let slot = SLOT_REPLY_BASE | self.next_reply.fetch_add(1, Ordering::Relaxed) as u64;
        // SAFETY: the caller keeps `dst` valid until the get returns; on a
        // failure the window is broken (its connections closed) before the
        // buffer is dropped, so nothing lands in `dst` afterwards.
        let reply = Arc::new(
            unsafe { UnboundBuffer::new(self.ctx(), dst, bytes) }
                .map_err(|e| self.fail("get", peer, e))?,
        );
        {
            let mut st = self.state();
            self.usable(&st, "get")?;
            st.inflight_gets.push(reply.clone());
        }
        let result = (|| {
            reply
                .recv(peer, slot, 0, bytes)
                .map_err(|e| self.fail("get", peer, e))?;
            let header = [MAGIC | KIND_GET, offset as u64, bytes as u64, slot];
            self.send_message("get", peer, header, None, None, d)?;
            match reply.wait_recv(Some(d.remaining())) {
                Ok(Waited::Done(_)) => Ok(()),
                Ok(Waited::Aborted) => Err(self.ended_get(peer)),
                Err(e) if e.kind() == ErrorKind::Timeout => {
                    let err = Error::timeout(format!(
                        "gloo {} get on rank {} from rank {peer}: no reply within {} ms (rank {peer} is slow, stopped, gone or \
                         not serving the window); the window's connections are now closed",
                        self.label,
                        self.rank,
                        ms(d.timeout())
                    ));
                    self.mark_broken(err.clone());
                    Err(err)
                }
                Err(e) => Err(self.fail("get (reply)", peer, e)),
            }
        })();
        self.state()
            .inflight_gets
            .retain(|b| !Arc::ptr_eq(b, &reply));
        if let Err(e) = &result {
            // Gloo may still hold the receive: nothing may land in `dst`
            // once this returns.
            self.mark_broken(e.clone());
        }
        result
    }

    /// Why a get's wait for its reply was ended from outside.
    fn ended_get(&self, peer: i32) -> Error {
        let st = self.state();
        match &st.broken {
            Some(e) => Error::new(
                e.kind,
                format!(
                    "gloo {} get on rank {} from rank {peer}: {}",
                    self.label, self.rank, e.message
                ),
            ),
            None => Error::new(
                ErrorKind::Aborted,
                format!(
                    "gloo {} get from rank {peer}: the window was closed",
                    self.label
                ),
            ),
        }
    }

    /// The service's answer to a GET header from `src`: sends the bytes from
    /// the registered buffer (of `size` bytes) to the slot it names. A
    /// request out of bounds (the origin checks them, so its registrations
    /// disagree with ours) or naming a foreign slot breaks the window: the
    /// origin then fails instead of waiting.
    pub(super) fn reply_to_get(
        &self,
        bufs: &ServiceBufs,
        src: i32,
        header: [u64; 4],
        size: usize,
    ) -> Result<bool> {
        let (off, len, slot) = (header[1] as usize, header[2] as usize, header[3]);
        if slot & SLOT_REPLY_MASK != SLOT_REPLY_BASE
            || !off.checked_add(len).is_some_and(|end| end <= size)
        {
            return Err(Error::internal(format!(
                "gloo {} service on rank {}: a get of {len} bytes at offset {off} from rank {src} does not fit the {size} bytes \
                 registered here (or names slot {slot:#x}): the ranks' registrations disagree",
                self.label, self.rank
            )));
        }
        bufs.data
            .send(src, slot, off, len)
            .map_err(|e| self.fail("service (reply to a get)", src, e))?;
        match bufs.data.wait_send(Some(self.timeout)) {
            Ok(Waited::Done(_)) => Ok(true),
            Ok(Waited::Aborted) => Ok(false),
            Err(e) => Err(self.fail("service (reply to a get)", src, e)),
        }
    }
}
