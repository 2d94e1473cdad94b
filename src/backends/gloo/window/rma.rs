//! The origin side: puts, signals and waits, and closing the window.

use super::super::shim::{UnboundBuffer, Waited};
use super::{
    ms, Inner, HEADER_BYTES, INLINE_MAX, KIND_PUT, KIND_PUT_INLINE, KIND_SIGNAL, MAGIC, SLOT_DATA,
    SLOT_HEADER,
};
use crate::error::{Error, ErrorKind, Result};
use crate::util::{lock, Deadline};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Inner {
    /// Sends one message (a header, and inline bytes after it) and a
    /// separate payload to `peer`, and waits until written.
    pub(super) fn send_message(
        &self,
        what: &str,
        peer: i32,
        header: [u64; 4],
        inline: Option<(*const u8, usize)>,
        payload: Option<(*const u8, usize)>,
        d: &Deadline,
    ) -> Result<()> {
        let _g = lock(&self.send_lock);
        let extra = inline.map_or(0, |(_, n)| n);
        let mut msg = vec![0u64; (HEADER_BYTES + extra).div_ceil(8)];
        msg[..4].copy_from_slice(&header);
        if let Some((p, n)) = inline {
            // SAFETY: the caller's source holds n bytes; msg has room.
            unsafe {
                std::ptr::copy_nonoverlapping(p, (msg.as_mut_ptr() as *mut u8).add(HEADER_BYTES), n)
            };
        }
        let msg_bytes = HEADER_BYTES + extra;
        // SAFETY: msg and the payload outlive the buffers (dropped below,
        // after the waits; on failure the context is closed first).
        let h = Arc::new(
            unsafe { UnboundBuffer::new(self.ctx(), msg.as_mut_ptr() as *mut u8, msg_bytes) }
                .map_err(|e| self.fail(what, peer, e))?,
        );
        let p = match payload {
            Some((ptr, len)) => Some(Arc::new(
                unsafe { UnboundBuffer::new(self.ctx(), ptr as *mut u8, len) }
                    .map_err(|e| self.fail(what, peer, e))?,
            )),
            None => None,
        };
        {
            let mut st = self.state();
            self.usable(&st, what)?;
            st.inflight.push(h.clone());
            if let Some(p) = &p {
                st.inflight.push(p.clone());
            }
        }
        let result = (|| {
            h.send(peer, SLOT_HEADER, 0, msg_bytes)
                .map_err(|e| self.fail(what, peer, e))?;
            if let (Some(p), Some((_, len))) = (&p, payload) {
                p.send(peer, SLOT_DATA, 0, len)
                    .map_err(|e| self.fail(what, peer, e))?;
            }
            for b in std::iter::once(&h).chain(p.as_ref()) {
                match b.wait_send(Some(d.remaining())) {
                    Ok(Waited::Done(_)) => {}
                    Ok(Waited::Aborted) => {
                        return Err(Error::new(
                            ErrorKind::Aborted,
                            format!(
                                "gloo {} {what} to rank {peer}: the window was closed",
                                self.label
                            ),
                        ))
                    }
                    Err(e) => {
                        let e = if e.kind() == ErrorKind::Timeout {
                            let err = Error::timeout(format!(
                                "gloo {} {what} on rank {} to rank {peer}: not taken within {} ms (rank {peer} is slow, stopped, gone or \
                                 not serving the window: did it register?); the window's connections are now closed",
                                self.label,
                                self.rank,
                                ms(d.timeout())
                            ));
                            self.mark_broken(err.clone());
                            err
                        } else {
                            self.fail(what, peer, e)
                        };
                        return Err(e);
                    }
                }
            }
            Ok(())
        })();
        let mut st = self.state();
        st.inflight
            .retain(|b| !Arc::ptr_eq(b, &h) && p.as_ref().map_or(true, |p| !Arc::ptr_eq(b, p)));
        drop(st);
        if result.is_err() {
            // Gloo may still hold the send: make sure it never reads the
            // buffers again before they are freed.
            self.mark_broken(result.clone().unwrap_err());
        }
        result
    }

    pub(super) fn remote_size(&self, rank: i32) -> usize {
        let st = self.state();
        if !st.registered {
            return 0;
        }
        st.sizes.get(rank as usize).copied().unwrap_or(0)
    }

    /// Checks a put's destination; returns this rank's registered buffer and,
    /// for a same-host peer, the address of its mapped buffer.
    fn put_target(
        &self,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
    ) -> Result<(usize, Option<usize>)> {
        let w = self;
        let (own, size, mapped) = {
            let st = w.state();
            w.usable_fresh(&st, "put")?;
            if !st.registered {
                return Err(Error::invalid_usage(format!(
                    "gloo {} put: rank {} has no registered buffer (register first)",
                    w.label, w.rank
                )));
            }
            if dst_rank < 0 || dst_rank >= w.size {
                return Err(Error::invalid_argument(format!(
                    "argument 'dst_rank': {dst_rank} is outside the window's {} ranks",
                    w.size
                )));
            }
            (
                st.buf,
                st.sizes[dst_rank as usize],
                st.mapped
                    .get(dst_rank as usize)
                    .and_then(|m| m.as_ref())
                    .map(|m| m.ptr as usize),
            )
        };
        match dst_offset.checked_add(bytes) {
            Some(end) if end <= size => {}
            _ => {
                return Err(Error::invalid_argument(format!(
                    "argument 'dst_offset': {dst_offset} + {bytes} bytes exceeds the {size} bytes rank {dst_rank} registered"
                )))
            }
        }
        Ok((own, mapped))
    }

    pub(super) fn put(
        &self,
        src: *const c_void,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        let w = self;
        let d = Deadline::after(timeout);
        let (own, mapped) = w.put_target(bytes, dst_rank, dst_offset)?;
        if bytes == 0 {
            return Ok(());
        }
        if dst_rank == w.rank {
            // SAFETY: in bounds of the registered buffer; memmove semantics
            // for a source inside it.
            unsafe { std::ptr::copy(src as *const u8, (own as *mut u8).add(dst_offset), bytes) };
            return Ok(());
        }
        if let Some(peer_buf) = mapped {
            // A same-host peer's shared buffer: the copy is the put. The
            // signal that follows is a message, sent after the copy.
            // SAFETY: in bounds of the mapping (checked above); memmove
            // semantics for a source inside it.
            unsafe {
                std::ptr::copy(
                    src as *const u8,
                    (peer_buf as *mut u8).add(dst_offset),
                    bytes,
                )
            };
            std::sync::atomic::fence(Ordering::SeqCst);
            return Ok(());
        }
        let (off, n, src) = (
            dst_offset as u64,
            bytes as u64,
            Some((src as *const u8, bytes)),
        );
        if bytes <= INLINE_MAX {
            w.send_message(
                "put",
                dst_rank,
                [MAGIC | KIND_PUT_INLINE, off, n, 0],
                src,
                None,
                &d,
            )
        } else {
            w.send_message(
                "put",
                dst_rank,
                [MAGIC | KIND_PUT, off, n, 0],
                None,
                src,
                &d,
            )
        }
    }

    pub(super) fn signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        let w = self;
        let d = Deadline::after(timeout);
        {
            let mut st = w.state();
            w.usable_fresh(&st, "signal")?;
            if peer < 0 || peer >= w.size {
                return Err(Error::invalid_argument(format!(
                    "argument 'peer': {peer} is outside the window's {} ranks",
                    w.size
                )));
            }
            if peer == w.rank {
                st.signals[peer as usize] += 1;
                w.wake();
                return Ok(());
            }
            if let Some(Some(target)) = st.peer_signals.get(peer as usize) {
                // Same host, shared memory: this rank's puts to `peer` were
                // copies, complete before this increment (release order).
                target.signal(w.rank as usize);
                return Ok(());
            }
        }
        w.send_message(
            "signal",
            peer,
            [MAGIC | KIND_SIGNAL, 0, 0, 0],
            None,
            None,
            &d,
        )
    }

    pub(super) fn wait_signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        let w = self;
        let d = Deadline::after(timeout);
        if peer < 0 || peer >= w.size {
            return Err(Error::invalid_argument(format!(
                "argument 'peer': {peer} is outside the window's {} ranks",
                w.size
            )));
        }
        let p = peer as usize;
        loop {
            // Read before checking: any arrival after this read changes the
            // word, and the wait below then returns at once.
            let seen = w.area.arrivals();
            let mut st = w.state();
            if let Some(msg) = st.refused[p].take() {
                return Err(Error::invalid_argument(format!(
                    "gloo {} wait_signal from rank {peer}: {msg}",
                    w.label
                )));
            }
            if st.signals[p] > 0 {
                st.signals[p] -= 1;
                return Ok(());
            }
            if w.area.counter(p).load(Ordering::Acquire) > st.shm_consumed[p] {
                st.shm_consumed[p] += 1;
                return Ok(());
            }
            w.usable(&st, &format!("wait_signal from rank {peer}"))?;
            if d.passed() {
                return Err(Error::timeout(format!(
                    "gloo {} wait_signal on rank {} from rank {peer}: no signal within {} ms (rank {peer} is slow, stopped or gone, \
                     or signalled fewer times than waited for)",
                    w.label,
                    w.rank,
                    ms(timeout)
                )));
            }
            drop(st);
            // Slices bound a wake-up lost to a peer that died mid-signal.
            w.area
                .wait(seen, d.remaining().min(Duration::from_millis(100)));
        }
    }

    pub(super) fn map_remote(&self, rank: i32) -> Result<*mut c_void> {
        let w = self;
        let st = w.state();
        if !st.registered {
            return Err(Error::invalid_usage(format!(
                "gloo {} map_remote: rank {} has no registered buffer",
                w.label, w.rank
            )));
        }
        if rank == w.rank {
            return Ok(st.buf as *mut c_void);
        }
        match st.mapped.get(rank as usize).and_then(|m| m.as_ref()) {
            Some(m) => Ok(m.ptr as *mut c_void),
            None => Err(Error::unsupported(format!(
                "gloo {} map_remote: rank {rank}'s buffer is not mapped here: only a buffer inside memory from tc_mem_alloc, \
                 registered by a process of this host, can be; use put",
                w.label
            ))),
        }
    }

    pub(super) fn close(&self) {
        let w = self;
        let (inflight, gets, watch, hard) = {
            let mut st = w.state();
            if st.closed {
                return;
            }
            st.closed = true;
            w.wake();
            (
                std::mem::take(&mut st.inflight),
                std::mem::take(&mut st.inflight_gets),
                st.watch.take(),
                st.registered || st.broken.is_some(),
            )
        };
        // Still registered (or broken): close the connections now, so that
        // nothing lands any more and the peers fail fast. After a clean
        // deregistration the context is freed gracefully when dropped: a
        // hard close resets the connections, and a reset can discard a STOP
        // a slower peer has not read yet.
        if hard {
            if let Some(ctx) = &w.ctx {
                ctx.close();
            }
        }
        for b in &inflight {
            b.abort_wait_send();
        }
        for g in &gets {
            g.abort_wait_recv();
        }
        w.stop_service();
        if let Some(mut watch) = watch {
            watch.buf.abort_wait_recv();
            if let Some(t) = watch.thread.take() {
                let _ = t.join();
            }
        }
        let mut st = w.state();
        st.registered = false;
        st.buf = 0;
        st.mapped = Vec::new();
        st.peer_signals = Vec::new();
    }
}
