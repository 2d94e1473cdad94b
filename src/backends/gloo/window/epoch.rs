//! Registration and deregistration: the collective steps that start and
//! end an epoch of a window.

use super::super::shim::{self, UnboundBuffer};
use super::super::shm::host_id;
use super::wire::{Registration, RECORD};
use super::{ms, Inner, Service, ServiceBufs, KIND_STOP, MAGIC, MESSAGE_MAX};
use crate::error::{Error, Result};
use crate::util::Deadline;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Inner {
    pub(super) fn register(
        self: &Arc<Self>,
        buf: *mut c_void,
        bytes: usize,
        timeout: Duration,
    ) -> Result<()> {
        let w = self;
        let d = Deadline::after(timeout);
        w.begin_epoch(buf, bytes)?;
        if w.size == 1 {
            let mut st = w.state();
            st.sizes = vec![bytes];
            st.registered = true;
            return Ok(());
        }
        // The service runs before the exchange, so that a peer's first put
        // (possible as soon as its exchange completes) finds it.
        w.start_service(buf, bytes)?;
        w.exchange_registrations(buf, bytes, &d)
    }

    /// Checks that no buffer is registered and resets the per-epoch state.
    fn begin_epoch(&self, buf: *mut c_void, bytes: usize) -> Result<()> {
        let w = self;
        let n = w.size as usize;
        let mut st = w.state();
        w.usable_fresh(&st, "register")?;
        if st.registered {
            return Err(Error::invalid_usage(format!(
                "gloo {} register: rank {} already registered a buffer; deregister it first",
                w.label, w.rank
            )));
        }
        // A new epoch: nothing from the previous one carries over.
        st.signals = vec![0; n];
        // No peer can signal before the exchange below, and every signal
        // of the previous epoch preceded its sender's STOP.
        st.shm_consumed = vec![0; n];
        for q in 0..n {
            w.area.counter(q).store(0, Ordering::Release);
        }
        st.refused = vec![None; n];
        st.stopped = vec![false; n];
        st.buf = buf as usize;
        st.bytes = bytes;
        Ok(())
    }

    /// Binds the header and data buffers and starts the service thread that
    /// takes peers' messages for this epoch.
    fn start_service(self: &Arc<Self>, buf: *mut c_void, bytes: usize) -> Result<()> {
        let w = self;
        let mut header_mem = Box::new([0u64; MESSAGE_MAX / 8]);
        let mut make = || -> std::result::Result<ServiceBufs, shim::CallError> {
            // SAFETY: header_mem is moved into the same struct (a Box: the
            // address stays); the caller keeps `buf` valid while registered.
            let header = unsafe {
                UnboundBuffer::new(w.ctx(), header_mem.as_mut_ptr() as *mut u8, MESSAGE_MAX)?
            };
            let data = unsafe { UnboundBuffer::new(w.ctx(), buf as *mut u8, bytes)? };
            Ok(ServiceBufs {
                header,
                header_mem: std::mem::replace(&mut header_mem, Box::new([0u64; MESSAGE_MAX / 8])),
                data,
                data_ptr: buf as usize,
            })
        };
        let bufs = Arc::new(make().map_err(|e| w.fail("register", -1, e))?);
        let mut st = w.state();
        st.service_done = false;
        let me = w.clone();
        let b = bufs.clone();
        let thread = std::thread::Builder::new()
            .name("tc-gloo-win".into())
            .spawn(move || me.serve(b, bytes))
            .map_err(|e| Error::system("starting the window's service thread", e))?;
        st.service = Some(Service {
            bufs,
            thread: Some(thread),
        });
        Ok(())
    }

    /// All-gathers every rank's registration (size, shared-memory and signal
    /// placement, host), maps same-host peers and completes the registration.
    fn exchange_registrations(&self, buf: *mut c_void, bytes: usize, d: &Deadline) -> Result<()> {
        let w = self;
        let n = w.size as usize;
        let mine = Registration {
            bytes: bytes as u64,
            shared: w.shared_memory.placement(buf as usize, bytes),
            signals: w.area.placement(),
            host: host_id(),
        }
        .encode();
        let mut all = vec![0u64; n * RECORD];
        let tag = w.tag.fetch_add(1, Ordering::SeqCst);
        // SAFETY: both buffers hold the sizes given.
        let r = unsafe {
            w.ctx().allgather(
                mine.as_ptr() as *const u8,
                all.as_mut_ptr() as *mut u8,
                RECORD * 8,
                tag,
                d.remaining(),
            )
        };
        if let Err(e) = r {
            let err = w.fail("register (size exchange)", -1, e);
            w.mark_broken(err.clone());
            w.stop_service();
            w.state().buf = 0;
            return Err(err);
        }
        let regs: Vec<Registration> = all.chunks(RECORD).map(Registration::decode).collect();
        let (mapped, peer_signals) = regs
            .iter()
            .enumerate()
            .map(|(q, r)| {
                if q == w.rank as usize {
                    None
                } else {
                    w.map_peer(q, r)
                }
            })
            .map(Option::unzip)
            .unzip();
        let mut st = w.state();
        st.sizes = regs.iter().map(|r| r.bytes as usize).collect();
        st.mapped = mapped;
        st.peer_signals = peer_signals;
        st.registered = true;
        Ok(())
    }

    pub(super) fn deregister(&self, timeout: Duration) -> Result<()> {
        let w = self;
        let d = Deadline::after(timeout);
        {
            let mut st = w.state();
            if !st.registered {
                return Err(Error::invalid_usage(format!(
                    "gloo {} deregister: rank {} has no registered buffer",
                    w.label, w.rank
                )));
            }
            st.deregistering = true;
        }
        if w.size == 1 {
            w.finish_deregister();
            return Ok(());
        }
        // STOP follows this rank's earlier puts and signals on each
        // connection, so each peer's service has taken them when it sees it.
        let result = w
            .send_stops(&d)
            .and_then(|()| w.await_peer_stops(&d, timeout));
        if let Err(e) = &result {
            // Whatever failed, nothing may land in the buffer after this
            // returns: closing the connections guarantees it.
            w.mark_broken(e.clone());
        }
        w.stop_service();
        w.finish_deregister();
        result
    }

    /// Clears the epoch's registration.
    fn finish_deregister(&self) {
        let n = self.size as usize;
        let mut st = self.state();
        st.deregistering = false;
        st.registered = false;
        st.buf = 0;
        st.bytes = 0;
        st.sizes = vec![0; n];
        st.mapped = Vec::new();
        st.peer_signals = Vec::new();
    }

    /// Sends STOP to every peer; stops at the first failure.
    fn send_stops(&self, d: &Deadline) -> Result<()> {
        for p in (0..self.size).filter(|p| *p != self.rank) {
            self.send_message("deregister", p, [MAGIC | KIND_STOP, 0, 0, 0], None, None, d)?;
        }
        Ok(())
    }

    /// Waits until this rank's service has seen STOP from every peer (it then
    /// ends), naming the peers that did not stop in time.
    fn await_peer_stops(&self, d: &Deadline, timeout: Duration) -> Result<()> {
        let w = self;
        let n = w.size as usize;
        let mut st = w.state();
        while !st.service_done && st.broken.is_none() && !d.passed() {
            st =
                w.cv.wait_timeout(st, d.remaining())
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
        }
        if let Some(e) = &st.broken {
            return Err(Error::new(
                e.kind,
                format!(
                    "gloo {} deregister on rank {}: {}",
                    w.label, w.rank, e.message
                ),
            ));
        }
        if st.service_done {
            return Ok(());
        }
        let missing: Vec<String> = (0..n)
            .filter(|r| *r != w.rank as usize && !st.stopped[*r])
            .map(|r| r.to_string())
            .collect();
        let msg = format!(
            "gloo {} deregister on rank {}: rank(s) {} did not deregister within {} ms (slow, stopped or gone)",
            w.label,
            w.rank,
            missing.join(", "),
            ms(timeout)
        );
        // A connection lost meanwhile (whose peer Gloo's message
        // did not let us name) is the likelier cause.
        let unnamed = st.lost_peer.map_or(true, |p| !st.stopped[p as usize]);
        Err(match &st.lost {
            Some(lost) if unnamed => Error::remote(format!("{msg}; meanwhile {}", lost.message)),
            _ => Error::timeout(msg),
        })
    }
}
