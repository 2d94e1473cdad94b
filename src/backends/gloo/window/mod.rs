//! One-sided windows (RMA) on the gloo backend.
//!
//! Gloo has no remote memory access, so each window emulates it with
//! messages on a Gloo context of its own (its own TCP connections: window
//! traffic never interleaves with the comm's collectives), rendezvoused
//! through the comm's store under `window/<k>`:
//!
//! - `register` starts a service thread on every rank. It receives a
//!   message of up to 4 KiB from any peer: a 32-byte header, and for a put
//!   of up to 4064 bytes its data; a larger PUT header is followed by its
//!   payload, received from that peer straight into the registered buffer;
//!   a SIGNAL
//!   header counts one signal from its sender; a STOP header says the sender
//!   deregistered.
//! - the origin of a put sends the message (and the payload), and returns
//!   when they are written to the socket. Gloo sends only once the receiver posted
//!   a matching receive, and the service handles one header at a time, so a
//!   later SIGNAL from the same rank is handled after the earlier payloads
//!   landed.
//! - a GET header asks the service for bytes of its buffer, sent back on a
//!   reply slot the origin named (see `get.rs`); it too follows the
//!   origin's earlier puts.
//! - `deregister` sends STOP to every peer, and the service ends after STOP
//!   from every peer: everything they sent before has landed, and nothing
//!   can land after.
//! - a watcher thread keeps a receive posted on every peer's connection that
//!   no peer ever matches: when a connection fails, Gloo fails that receive,
//!   and the window becomes unusable with TC_ERR_REMOTE (a receive from any
//!   rank, as the service's, is not told about a dead connection). Outside
//!   registration, and for a peer that already sent its STOP, a closed
//!   connection is how a peer freeing its window looks: it only fails the
//!   next register, put or signal. Ranks exchange their connections'
//!   addresses at creation so that such a message names the rank where
//!   Gloo's message allows.
//!
//! Gloo closes every connection of a context when one of its waits times
//! out, so the service waits for headers without a timeout (an abort ends
//! it); a timed-out put, get, signal or deregister leaves the window unusable.
//! `wait_signal` waits on this rank's counters only and can time out
//! without harm.

mod epoch;
mod get;
mod rma;
mod same_host;
mod service;
mod watch;
mod wire;

use super::shim::{self, UnboundBuffer};
use super::shm::{PeerMapping, PeerSignals, SharedAllocations, SignalArea};
use super::GlooBackend;
use crate::backends::WindowBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{PrefixStore, StoreRef};
use crate::util::lock;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use wire::exchange_addresses;

/// Gloo slots of the window's messages (its own context: no clash with the
/// comm's slots; Gloo's collectives, used for the size exchange, take small
/// prefixes).
const SLOT_HEADER: u64 = (0x57 << 56) | 1;
const SLOT_DATA: u64 = (0x57 << 56) | 2;
const SLOT_WATCH: u64 = (0x57 << 56) | 3;

const HEADER_BYTES: usize = 32;
/// The service receives headers into a buffer this large, so that a small
/// put travels inside its header: one message instead of two, each of which
/// waits for the receiver's readiness (Gloo accepts a message shorter than
/// the posted receive).
const MESSAGE_MAX: usize = 4096;
const INLINE_MAX: usize = MESSAGE_MAX - HEADER_BYTES;
const MAGIC: u64 = 0x7463_7769_6e64_0000; // "tcwind" + kind in the low byte
const KIND_PUT: u64 = 1;
const KIND_SIGNAL: u64 = 2;
const KIND_STOP: u64 = 3;
const KIND_PUT_INLINE: u64 = 4;
const KIND_GET: u64 = 5;
/// The reply to a GET travels on a slot of its own (this prefix and the
/// origin's sequence number, carried in the header), so that concurrent
/// gets of one origin never take each other's data.
const SLOT_REPLY_BASE: u64 = (0x57 << 56) | (1 << 32);
const SLOT_REPLY_MASK: u64 = !0xffff_ffff;

/// Creates the window of `backend`: connects its context (collective).
pub(super) fn create(backend: &GlooBackend, timeout: Duration) -> Result<Box<dyn WindowBackend>> {
    backend.check_not_broken()?;
    let k = backend.windows_made.fetch_add(1, Ordering::SeqCst);
    if let Some(t) = over_ucx(backend)? {
        let store: StoreRef = Arc::new(PrefixStore::new(
            &format!("window/{k}"),
            backend.store.clone(),
        ));
        let same_host = Box::new(same_host::SharedBuffers {
            allocations: backend.shared_memory.clone(),
            label: format!("window {k} of comm '{}'", backend.name),
        });
        let w =
            crate::backends::ucx::UcxWindow::new(t.clone(), same_host, store, k, &backend.name)?;
        return Ok(Box::new(w));
    }
    let label = format!("window {k} of comm '{}'", backend.name);
    let (rank, size) = (backend.rank, backend.size);
    let ctx = connect_context(backend, k, &label, timeout)?;
    let n = size as usize;
    let peer_addresses = match &ctx {
        Some(c) => exchange_addresses(c, rank, size, timeout)
            .map_err(|e| Error::new(e.kind(), format!("gloo {label}: {}", e.message)))?,
        None => vec![String::new()],
    };
    let inner = Arc::new(Inner {
        rank,
        size,
        label,
        timeout,
        shared_memory: backend.shared_memory.clone(),
        area: SignalArea::new(n)?,
        ctx,
        peer_addresses,
        send_lock: Mutex::new(()),
        tag: AtomicU32::new(TAG_FIRST_REGISTER),
        next_reply: AtomicU32::new(0),
        st: Mutex::new(State::initial(n)),
        cv: Condvar::new(),
    });
    if size > 1 {
        inner.start_watch()?;
    }
    crate::log_info!("gloo: {} created on rank {rank}/{size}", inner.label);
    Ok(Box::new(GlooWindow { inner }))
}

/// The comm's UCX transport when its windows go over UCX: whenever the
/// comm has one (it carries its operations between hosts over UCX, on the
/// flat path or a hierarchy's leaders' step; same-host peers' `tc_mem_alloc`
/// buffers are mapped by the UCX window too); never with
/// `TORCHCOMM_UCX_WINDOWS=0` (every rank must agree; it is read per
/// process, like the transport setting).
fn over_ucx(backend: &GlooBackend) -> Result<Option<&Arc<crate::backends::ucx::UcxTransport>>> {
    let Some(t) = backend.routes.ucx() else {
        return Ok(None);
    };
    match std::env::var("TORCHCOMM_UCX_WINDOWS").as_deref() {
        Err(_) | Ok("") | Ok("1") => Ok(Some(t)),
        Ok("0") => Ok(None),
        Ok(v) => Err(Error::invalid_argument(format!(
            "TORCHCOMM_UCX_WINDOWS is '{v}'; it takes 0 or 1"
        ))),
    }
}

/// Connects the window's own Gloo context over a store prefix of its own,
/// with the comm's address selection; none for one rank.
fn connect_context(
    backend: &GlooBackend,
    k: u64,
    label: &str,
    timeout: Duration,
) -> Result<Option<shim::Context>> {
    if backend.size <= 1 {
        return Ok(None);
    }
    let prefix = format!("window/{k}");
    let store: StoreRef = Arc::new(PrefixStore::new(&prefix, backend.store.clone()));
    let ranks = (backend.rank, backend.size);
    let ctx = (backend.routes.tcp().options()).connect(ranks, &store, timeout, label)?;
    Ok(Some(ctx))
}

impl State {
    /// A window's state before its first registration.
    fn initial(n: usize) -> State {
        State {
            buf: 0,
            bytes: 0,
            registered: false,
            sizes: vec![0; n],
            mapped: Vec::new(),
            peer_signals: Vec::new(),
            shm_consumed: vec![0; n],
            signals: vec![0; n],
            refused: vec![None; n],
            stopped: vec![false; n],
            service: None,
            service_done: true,
            broken: None,
            lost: None,
            lost_peer: None,
            deregistering: false,
            closed: false,
            inflight: Vec::new(),
            inflight_gets: Vec::new(),
            watch: None,
        }
    }
}

/// Tag of the address exchange at creation; registrations count from the
/// next one.
const TAG_ADDRESSES: u32 = 1;
const TAG_FIRST_REGISTER: u32 = 2;

pub(super) struct GlooWindow {
    inner: Arc<Inner>,
}

struct Inner {
    rank: i32,
    size: i32,
    label: String,
    /// The window's creation timeout: bounds the payload that follows a
    /// PUT header.
    timeout: Duration,
    /// The comm's shared allocations: a buffer registered in one is mapped
    /// by same-host peers.
    shared_memory: Arc<SharedAllocations>,
    /// Where this rank's signals arrive and its waits sleep.
    area: SignalArea,
    /// None for a world of one rank.
    ctx: Option<shim::Context>,
    /// How each peer's address appears in this rank's Gloo messages.
    peer_addresses: Vec<String>,
    /// Serializes this rank's sends (put, signal, STOP): one message at a
    /// time, so a header and its payload are never separated.
    send_lock: Mutex<()>,
    /// Next tag of a collective on the window's context (same on all ranks:
    /// register is collective).
    tag: AtomicU32,
    /// Sequence number of this rank's next GET (its reply slot).
    next_reply: AtomicU32,
    st: Mutex<State>,
    /// Signals, refusals, STOPs, the service's end and failures.
    cv: Condvar,
}

struct State {
    /// The registered buffer (address) and its size.
    buf: usize,
    bytes: usize,
    registered: bool,
    /// Every rank's registered size (from register's exchange).
    sizes: Vec<usize>,
    /// Per rank, its buffer mapped here (same host, from tc_mem_alloc);
    /// empty when not registered.
    mapped: Vec<Option<PeerMapping>>,
    /// Per rank whose buffer is mapped, its signal area: signals to it are
    /// counter increments (empty when not registered).
    peer_signals: Vec<Option<PeerSignals>>,
    /// Signals from each rank through this rank's area already waited for.
    shm_consumed: Vec<u64>,
    /// Signals received and not yet waited for, per source.
    signals: Vec<u64>,
    /// A put from this source that was refused here, reported by the next
    /// wait_signal from it.
    refused: Vec<Option<String>>,
    /// STOP received from this source in the current deregistration.
    stopped: Vec<bool>,
    service: Option<Service>,
    service_done: bool,
    /// Set once the window is unusable.
    broken: Option<Error>,
    /// A connection that failed while no buffer was being served (a peer
    /// freeing its window after deregistering looks the same as one that
    /// died): fails the next register, put or signal, and breaks nothing
    /// in flight (a deregistration still takes the STOPs that arrived).
    lost: Option<Error>,
    /// The rank whose connection was lost, where Gloo's message named it.
    lost_peer: Option<i32>,
    /// Between the start and the end of deregister.
    deregistering: bool,
    closed: bool,
    /// Origin buffers whose sends are in flight (close ends their waits).
    inflight: Vec<Arc<UnboundBuffer>>,
    /// Destination buffers of gets waiting for their reply (close and
    /// breaking end their waits).
    inflight_gets: Vec<Arc<UnboundBuffer>>,
    watch: Option<Watch>,
}

struct Service {
    bufs: Arc<ServiceBufs>,
    thread: Option<JoinHandle<()>>,
}

/// The service's receive buffers, shared so that another thread can abort
/// their waits.
struct ServiceBufs {
    header: UnboundBuffer,
    /// Backs `header` (declared after it: dropped after it).
    header_mem: Box<[u64; MESSAGE_MAX / 8]>,
    data: UnboundBuffer,
    /// The registered buffer's address (inline puts are copied there).
    data_ptr: usize,
}

struct Watch {
    buf: Arc<UnboundBuffer>,
    _mem: Vec<u8>,
    thread: Option<JoinHandle<()>>,
}

// The raw buffer address in `State` is only written through by the service
// thread while the buffer is registered (the caller keeps it alive).
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

impl Inner {
    fn ctx(&self) -> &shim::Context {
        self.ctx
            .as_ref()
            .expect("a window context exists for more than one rank")
    }

    /// The rank whose address a Gloo message names, if known.
    fn peer_in_message(&self, message: &str) -> Option<i32> {
        let named = |a: &str| {
            // A whole address: "[ip]:port" not followed by more digits.
            message
                .match_indices(a)
                .any(|(i, _)| !message[i + a.len()..].starts_with(|c: char| c.is_ascii_digit()))
        };
        self.peer_addresses
            .iter()
            .position(|a| !a.is_empty() && named(a))
            .map(|j| j as i32)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.st)
    }

    /// `usable`, and no connection lost since the last registration.
    fn usable_fresh(&self, st: &State, what: &str) -> Result<()> {
        self.usable(st, what)?;
        if let Some(e) = &st.lost {
            return Err(Error::new(
                e.kind,
                format!(
                    "gloo {} {what} on rank {}: {}",
                    self.label, self.rank, e.message
                ),
            ));
        }
        Ok(())
    }

    fn usable(&self, st: &State, what: &str) -> Result<()> {
        if st.closed {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("gloo {} {what}: the window is closed", self.label),
            ));
        }
        if let Some(e) = &st.broken {
            return Err(Error::new(
                e.kind,
                format!("gloo {} {what} on rank {}: the window is unusable after an earlier failure: {}", self.label, self.rank, e.message),
            ));
        }
        Ok(())
    }

    /// Makes the window unusable (the first failure is kept), closes its
    /// connections (peers fail fast and nothing lands any more) and ends the
    /// service's waits.
    fn mark_broken(&self, err: Error) {
        let (first, bufs, watch, gets) = {
            let mut st = self.state();
            let first = st.broken.is_none() && !st.closed;
            if first {
                st.broken = Some(err);
            }
            self.wake();
            (
                first,
                st.service.as_ref().map(|s| s.bufs.clone()),
                st.watch.as_ref().map(|w| w.buf.clone()),
                st.inflight_gets.clone(),
            )
        };
        if !first {
            return;
        }
        if let Some(ctx) = &self.ctx {
            ctx.close();
        }
        if let Some(b) = bufs {
            b.header.abort_wait_recv();
            b.data.abort_wait_recv();
            b.data.abort_wait_send();
        }
        if let Some(w) = watch {
            w.abort_wait_recv();
        }
        for g in gets {
            g.abort_wait_recv();
        }
    }

    /// An error for a failed shim call of `what` with `peer`; failures of the
    /// context break the window.
    fn fail(&self, what: &str, peer: i32, e: shim::CallError) -> Error {
        let kind = e.kind();
        let hint = match kind {
            ErrorKind::Timeout => "; the peer is slow, stopped, gone or not serving the window; the window's connections are now closed",
            ErrorKind::Remote => "; the peer failed or closed its connection",
            _ => "",
        };
        let peer = if peer >= 0 {
            format!(" (peer rank {peer})")
        } else {
            String::new()
        };
        let err = Error::new(
            kind,
            format!(
                "gloo {} {what} on rank {}{peer}: {}{hint}",
                self.label, self.rank, e.message
            ),
        );
        if matches!(
            kind,
            ErrorKind::Timeout | ErrorKind::Remote | ErrorKind::Internal
        ) {
            self.mark_broken(err.clone());
        }
        err
    }

    /// Wakes whoever waits on the window's state: threads on the condition
    /// variable and `wait_signal` on the signal area.
    fn wake(&self) {
        self.cv.notify_all();
        self.area.wake();
    }

    fn stop_service(&self) {
        let service = self.state().service.take();
        if let Some(mut s) = service {
            s.bufs.header.abort_wait_recv();
            s.bufs.data.abort_wait_recv();
            s.bufs.data.abort_wait_send();
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl WindowBackend for GlooWindow {
    fn register(&self, buf: *mut c_void, bytes: usize, timeout: Duration) -> Result<()> {
        self.inner.register(buf, bytes, timeout)
    }

    fn deregister(&self, timeout: Duration) -> Result<()> {
        self.inner.deregister(timeout)
    }

    fn remote_size(&self, rank: i32) -> usize {
        self.inner.remote_size(rank)
    }

    fn put(
        &self,
        src: *const c_void,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        self.inner.put(src, bytes, dst_rank, dst_offset, timeout)
    }

    fn get(
        &self,
        dst: *mut c_void,
        bytes: usize,
        src_rank: i32,
        src_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        self.inner.get(dst, bytes, src_rank, src_offset, timeout)
    }

    fn signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        self.inner.signal(peer, timeout)
    }

    fn wait_signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        self.inner.wait_signal(peer, timeout)
    }

    fn map_remote(&self, rank: i32) -> Result<*mut c_void> {
        self.inner.map_remote(rank)
    }

    fn close(&self) {
        self.inner.close()
    }
}

impl Drop for GlooWindow {
    fn drop(&mut self) {
        self.close();
    }
}
