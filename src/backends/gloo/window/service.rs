//! The service thread: takes the peers' messages (puts, signals, STOPs) into
//! this rank's registered buffer and counters, and answers their gets.

use super::super::shim::UnboundBuffer;
use super::super::shim::Waited;
use super::super::shm::{host_id, PeerMapping, PeerSignals};
use super::wire::Registration;
use super::{
    Inner, ServiceBufs, HEADER_BYTES, INLINE_MAX, KIND_GET, KIND_PUT, KIND_PUT_INLINE, KIND_SIGNAL,
    KIND_STOP, MAGIC, MESSAGE_MAX, SLOT_DATA, SLOT_HEADER,
};
use crate::error::{Error, Result};
use crate::util::try_filled;
use std::sync::Arc;

impl Inner {
    pub(super) fn serve(&self, bufs: Arc<ServiceBufs>, size: usize) {
        let n = self.size as usize;
        let mut stops = 0;
        let result: Result<()> = loop {
            if let Err(e) = bufs.header.recv_any(&[], SLOT_HEADER, 0, MESSAGE_MAX) {
                break Err(self.fail("service (posting a header receive)", -1, e));
            }
            let src = match bufs.header.wait_recv(None) {
                Ok(Waited::Done(src)) => src,
                Ok(Waited::Aborted) => break Ok(()),
                Err(e) => break Err(self.fail("service (header)", -1, e)),
            };
            // SAFETY: the completed receive wrote the header (Gloo's buffer
            // lock orders it before the wait's return).
            let h: [u64; 4] =
                unsafe { std::ptr::read_volatile(bufs.header_mem.as_ptr() as *const [u64; 4]) };
            if src < 0 || src as usize >= n || h[0] & !0xff != MAGIC {
                break Err(Error::internal(format!(
                    "gloo {} service on rank {}: malformed header {:#x} from rank {src}",
                    self.label, self.rank, h[0]
                )));
            }
            match h[0] & 0xff {
                KIND_PUT => match self.take_put(&bufs, src, h, size) {
                    Ok(true) => {}
                    Ok(false) => break Ok(()),
                    Err(e) => break Err(e),
                },
                KIND_PUT_INLINE => self.take_inline_put(&bufs, src, h, size),
                KIND_GET => match self.reply_to_get(&bufs, src, h, size) {
                    Ok(true) => {}
                    Ok(false) => break Ok(()),
                    Err(e) => break Err(e),
                },
                KIND_SIGNAL => {
                    self.state().signals[src as usize] += 1;
                    self.wake();
                }
                KIND_STOP => {
                    self.state().stopped[src as usize] = true;
                    self.wake();
                    stops += 1;
                    if stops == n - 1 {
                        break Ok(());
                    }
                }
                k => {
                    break Err(Error::internal(format!(
                        "gloo {} service on rank {}: unknown message kind {k} from rank {src}",
                        self.label, self.rank
                    )))
                }
            }
        };
        if let Err(e) = result {
            crate::log_warn!("{}", e.message);
            self.mark_broken(e);
        }
        self.state().service_done = true;
        self.wake();
    }

    /// Receives a put's payload into the registered buffer, or drains and
    /// refuses one out of bounds; `Ok(false)` when the window was aborted.
    fn take_put(&self, bufs: &ServiceBufs, src: i32, h: [u64; 4], size: usize) -> Result<bool> {
        let (off, len) = (h[1] as usize, h[2] as usize);
        if off.checked_add(len).is_some_and(|end| end <= size) {
            bufs.data
                .recv(src, SLOT_DATA, off, len)
                .map_err(|e| self.fail("service (posting a payload receive)", src, e))?;
            match bufs.data.wait_recv(Some(self.timeout)) {
                Ok(Waited::Done(_)) => Ok(true),
                Ok(Waited::Aborted) => Ok(false),
                Err(e) => Err(self.fail("service (payload of a put)", src, e)),
            }
        } else {
            // Origins check bounds, so this is a mismatch of
            // registrations: take the bytes (Gloo cannot drop
            // them) into scratch and fail the source's next wait.
            let msg = self.put_out_of_bounds(src, off, len, size);
            self.drain(src, len)?;
            self.refuse(src, msg);
            Ok(true)
        }
    }

    /// Copies a put carried in the header message into the registered
    /// buffer, or refuses one out of bounds.
    fn take_inline_put(&self, bufs: &ServiceBufs, src: i32, h: [u64; 4], size: usize) {
        let (off, len) = (h[1] as usize, h[2] as usize);
        if len <= INLINE_MAX && off.checked_add(len).is_some_and(|end| end <= size) {
            // SAFETY: in bounds of the registered buffer (kept
            // valid by the caller while registered) and of the
            // message just received.
            unsafe {
                let from = (bufs.header_mem.as_ptr() as *const u8).add(HEADER_BYTES);
                std::ptr::copy_nonoverlapping(from, (bufs.data_ptr as *mut u8).add(off), len);
            }
        } else {
            let msg = self.put_out_of_bounds(src, off, len, size);
            self.refuse(src, msg);
        }
    }

    /// Logs a dropped put and returns the message its source's next wait fails with.
    fn put_out_of_bounds(&self, src: i32, off: usize, len: usize, size: usize) -> String {
        let msg = format!(
            "a put of {len} bytes at offset {off} from rank {src} exceeds the {size} bytes registered on rank {}; it was dropped",
            self.rank
        );
        crate::log_warn!("gloo {}: {msg}", self.label);
        msg
    }

    /// Records that `src`'s put was refused, for its next wait to report.
    fn refuse(&self, src: i32, msg: String) {
        self.state().refused[src as usize] = Some(msg);
        self.wake();
    }

    pub(super) fn drain(&self, src: i32, len: usize) -> Result<()> {
        let what = format!(
            "gloo {}: draining a refused put from rank {src}",
            self.label
        );
        let mut scratch = try_filled(0u8, len, &what)?;
        // SAFETY: scratch outlives the buffer (dropped at the end of scope,
        // after the receive completed or the window broke).
        let ub = unsafe { UnboundBuffer::new(self.ctx(), scratch.as_mut_ptr(), len) }
            .map_err(|e| self.fail("service", src, e))?;
        ub.recv(src, SLOT_DATA, 0, len)
            .map_err(|e| self.fail("service (draining a refused put)", src, e))?;
        ub.wait_recv(Some(self.timeout))
            .map_err(|e| self.fail("service (draining a refused put)", src, e))?;
        Ok(())
    }

    /// Maps rank `q`'s buffer and signal area when both are shared and on
    /// this host; None (puts and signals travel as messages) otherwise.
    /// Both or neither: a signal by memory must never overtake a put still
    /// travelling as a message.
    pub(super) fn map_peer(
        &self,
        q: usize,
        r: &Registration,
    ) -> Option<(PeerMapping, PeerSignals)> {
        let (buf, signals) = (r.shared.as_ref()?, r.signals.as_ref()?);
        if r.host != host_id() || r.host == [0, 0] {
            return None;
        }
        match PeerMapping::map(buf)
            .and_then(|m| Ok((m, PeerSignals::map(signals, self.size as usize)?)))
        {
            Ok(both) => Some(both),
            Err(e) => {
                crate::log_info!(
                    "gloo {}: rank {q}'s shared buffer cannot be mapped here ({e}); puts and signals to it travel as messages",
                    self.label
                );
                None
            }
        }
    }
}
