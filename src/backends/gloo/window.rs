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
//! it); a timed-out put, signal or deregister leaves the window unusable.
//! `wait_signal` waits on this rank's counters only and can time out
//! without harm.

use super::shim::{self, UnboundBuffer, Waited};
use super::shm::{host_id, PeerMapping, PeerSignals, Placement, SharedAllocations, SignalArea};
use super::{store_get, store_set, store_wait, GlooBackend};
use crate::backends::WindowBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::store::{PrefixStore, StoreRef};
use crate::util::{lock, Deadline};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// Creates the window of `backend`: connects its context (collective).
pub(super) fn create(backend: &GlooBackend, timeout: Duration) -> Result<Box<dyn WindowBackend>> {
    backend.check_not_broken()?;
    let k = backend.windows_made.fetch_add(1, Ordering::SeqCst);
    let label = format!("window {k} of comm '{}'", backend.name);
    let (rank, size) = (backend.rank, backend.size);
    let ctx = if size > 1 {
        let module = shim::module()?;
        let store: StoreRef = Arc::new(PrefixStore::new(
            &format!("window/{k}"),
            backend.store.clone(),
        ));
        let vt = shim::StoreVtable {
            user: &store as *const StoreRef as *mut c_void,
            set: store_set,
            get: store_get,
            wait: store_wait,
        };
        let ctx = shim::Context::new(
            module,
            rank,
            size,
            &vt,
            timeout,
            backend.hostname.as_deref(),
            backend.iface.as_deref(),
        )
        .map_err(|e| {
            Error::new(
                e.kind(),
                format!(
                    "gloo {label}: connecting rank {rank} of {size}: {}",
                    e.message
                ),
            )
        })?;
        Some(ctx)
    } else {
        None
    };
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
        st: Mutex::new(State {
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
            watch: None,
        }),
        cv: Condvar::new(),
    });
    if size > 1 {
        inner.start_watch()?;
    }
    crate::log_info!("gloo: {} created on rank {rank}/{size}", inner.label);
    Ok(Box::new(GlooWindow { inner }))
}

/// Tag of the address exchange at creation; registrations count from the
/// next one.
const TAG_ADDRESSES: u32 = 1;
const TAG_FIRST_REGISTER: u32 = 2;

/// Every rank publishes the local address of each of its connections, so
/// that a Gloo message naming a peer's address names its rank here (where
/// Gloo knows the address: a connection this rank accepted may be reported
/// by the peer's listening address, and then stays unnamed).
fn exchange_addresses(
    ctx: &shim::Context,
    rank: i32,
    size: i32,
    timeout: Duration,
) -> std::result::Result<Vec<String>, shim::CallError> {
    const LEN: usize = 64;
    let (n, me) = (size as usize, rank as usize);
    let mut mine = vec![0u8; n * LEN];
    for j in (0..n).filter(|j| *j != me) {
        let a = ctx.pair_address(j as i32)?;
        let len = a.len().min(LEN - 1);
        mine[j * LEN..j * LEN + len].copy_from_slice(&a.as_bytes()[..len]);
    }
    let mut all = vec![0u8; n * n * LEN];
    // SAFETY: both buffers hold the sizes given.
    unsafe {
        ctx.allgather(
            mine.as_ptr(),
            all.as_mut_ptr(),
            n * LEN,
            TAG_ADDRESSES,
            timeout,
        )?
    };
    Ok((0..n)
        .map(|j| {
            let bytes = &all[(j * n + me) * LEN..(j * n + me + 1) * LEN];
            let end = bytes.iter().position(|b| *b == 0).unwrap_or(LEN);
            String::from_utf8_lossy(&bytes[..end]).into_owned()
        })
        .collect())
}

/// What each rank tells the others at registration: its buffer's size,
/// where it lies in shared memory (if it does), and its host.
struct Registration {
    bytes: u64,
    /// The buffer, when it lies in shared memory.
    shared: Option<Placement>,
    /// The window's signal area, when it is shared.
    signals: Option<Placement>,
    host: [u64; 2],
}

/// u64 words of an encoded [`Registration`].
const RECORD: usize = 17;

fn encode_placement(p: Option<Placement>) -> [u64; 7] {
    let q = p.unwrap_or_default();
    [
        p.is_some() as u64,
        q.pid,
        q.fd,
        q.offset,
        q.len,
        q.dev,
        q.ino,
    ]
}

fn decode_placement(w: &[u64]) -> Option<Placement> {
    (w[0] == 1).then(|| Placement {
        pid: w[1],
        fd: w[2],
        offset: w[3],
        len: w[4],
        dev: w[5],
        ino: w[6],
    })
}

impl Registration {
    fn encode(&self) -> [u64; RECORD] {
        let mut out = [0u64; RECORD];
        out[0] = self.bytes;
        out[1..8].copy_from_slice(&encode_placement(self.shared));
        out[8..15].copy_from_slice(&encode_placement(self.signals));
        out[15..17].copy_from_slice(&self.host);
        out
    }

    fn decode(w: &[u64]) -> Registration {
        Registration {
            bytes: w[0],
            shared: decode_placement(&w[1..8]),
            signals: decode_placement(&w[8..15]),
            host: [w[15], w[16]],
        }
    }
}

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
        let (first, bufs, watch) = {
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
        }
        if let Some(w) = watch {
            w.abort_wait_recv();
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

    // ---- watcher ------------------------------------------------------------

    fn start_watch(self: &Arc<Self>) -> Result<()> {
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
    fn watch(&self, buf: Arc<UnboundBuffer>) {
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

    // ---- service ------------------------------------------------------------

    fn serve(&self, bufs: Arc<ServiceBufs>, size: usize) {
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
                KIND_PUT => {
                    let (off, len) = (h[1] as usize, h[2] as usize);
                    if off.checked_add(len).is_some_and(|end| end <= size) {
                        if let Err(e) = bufs.data.recv(src, SLOT_DATA, off, len) {
                            break Err(self.fail("service (posting a payload receive)", src, e));
                        }
                        match bufs.data.wait_recv(Some(self.timeout)) {
                            Ok(Waited::Done(_)) => {}
                            Ok(Waited::Aborted) => break Ok(()),
                            Err(e) => break Err(self.fail("service (payload of a put)", src, e)),
                        }
                    } else {
                        // Origins check bounds, so this is a mismatch of
                        // registrations: take the bytes (Gloo cannot drop
                        // them) into scratch and fail the source's next wait.
                        let msg = format!(
                            "a put of {len} bytes at offset {off} from rank {src} exceeds the {size} bytes registered on rank {}; it was dropped",
                            self.rank
                        );
                        crate::log_warn!("gloo {}: {msg}", self.label);
                        if let Err(e) = self.drain(src, len) {
                            break Err(e);
                        }
                        self.state().refused[src as usize] = Some(msg);
                        self.wake();
                    }
                }
                KIND_PUT_INLINE => {
                    let (off, len) = (h[1] as usize, h[2] as usize);
                    if len <= INLINE_MAX && off.checked_add(len).is_some_and(|end| end <= size) {
                        // SAFETY: in bounds of the registered buffer (kept
                        // valid by the caller while registered) and of the
                        // message just received.
                        unsafe {
                            let from = (bufs.header_mem.as_ptr() as *const u8).add(HEADER_BYTES);
                            std::ptr::copy_nonoverlapping(
                                from,
                                (bufs.data_ptr as *mut u8).add(off),
                                len,
                            );
                        }
                    } else {
                        let msg = format!(
                            "a put of {len} bytes at offset {off} from rank {src} exceeds the {size} bytes registered on rank {}; it was dropped",
                            self.rank
                        );
                        crate::log_warn!("gloo {}: {msg}", self.label);
                        self.state().refused[src as usize] = Some(msg);
                        self.wake();
                    }
                }
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

    fn drain(&self, src: i32, len: usize) -> Result<()> {
        let mut scratch: Vec<u8> = Vec::new();
        scratch.try_reserve_exact(len).map_err(|_| {
            Error::internal(format!(
                "gloo {}: no memory to drain a refused put of {len} bytes from rank {src}",
                self.label
            ))
        })?;
        scratch.resize(len, 0);
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
    fn map_peer(&self, q: usize, r: &Registration) -> Option<(PeerMapping, PeerSignals)> {
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

    /// Wakes whoever waits on the window's state: threads on the condition
    /// variable and `wait_signal` on the signal area.
    fn wake(&self) {
        self.cv.notify_all();
        self.area.wake();
    }

    // ---- origin side ----------------------------------------------------------

    /// Sends one message (a header, and inline bytes after it) and a
    /// separate payload to `peer`, and waits until written.
    fn send_message(
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

    fn stop_service(&self) {
        let service = self.state().service.take();
        if let Some(mut s) = service {
            s.bufs.header.abort_wait_recv();
            s.bufs.data.abort_wait_recv();
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl WindowBackend for GlooWindow {
    fn register(&self, buf: *mut c_void, bytes: usize, timeout: Duration) -> Result<()> {
        let w = &self.inner;
        let d = Deadline::after(timeout);
        let n = w.size as usize;
        {
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
        }
        if n == 1 {
            let mut st = w.state();
            st.sizes = vec![bytes];
            st.registered = true;
            return Ok(());
        }
        // The service runs before the exchange, so that a peer's first put
        // (possible as soon as its exchange completes) finds it.
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
        {
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
        }
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

    fn deregister(&self, timeout: Duration) -> Result<()> {
        let w = &self.inner;
        let d = Deadline::after(timeout);
        let n = w.size as usize;
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
        let finish = |w: &Inner| {
            let mut st = w.state();
            st.deregistering = false;
            st.registered = false;
            st.buf = 0;
            st.bytes = 0;
            st.sizes = vec![0; n];
            st.mapped = Vec::new();
            st.peer_signals = Vec::new();
        };
        if n == 1 {
            finish(w);
            return Ok(());
        }
        let mut result = Ok(());
        // STOP follows this rank's earlier puts and signals on each
        // connection, so each peer's service has taken them when it sees it.
        for p in (0..w.size).filter(|p| *p != w.rank) {
            if let Err(e) = w.send_message(
                "deregister",
                p,
                [MAGIC | KIND_STOP, 0, 0, 0],
                None,
                None,
                &d,
            ) {
                result = Err(e);
                break;
            }
        }
        if result.is_ok() {
            // This rank's service ends after STOP from every peer.
            let mut st = w.state();
            while !st.service_done && st.broken.is_none() && !d.passed() {
                st =
                    w.cv.wait_timeout(st, d.remaining())
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
            }
            if let Some(e) = &st.broken {
                result = Err(Error::new(
                    e.kind,
                    format!(
                        "gloo {} deregister on rank {}: {}",
                        w.label, w.rank, e.message
                    ),
                ));
            } else if !st.service_done {
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
                result = Err(match &st.lost {
                    Some(lost) if unnamed => {
                        Error::remote(format!("{msg}; meanwhile {}", lost.message))
                    }
                    _ => Error::timeout(msg),
                });
            }
        }
        if let Err(e) = &result {
            // Whatever failed, nothing may land in the buffer after this
            // returns: closing the connections guarantees it.
            w.mark_broken(e.clone());
        }
        w.stop_service();
        finish(w);
        result
    }

    fn remote_size(&self, rank: i32) -> usize {
        let st = self.inner.state();
        if !st.registered {
            return 0;
        }
        st.sizes.get(rank as usize).copied().unwrap_or(0)
    }

    fn put(
        &self,
        src: *const c_void,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        let w = &self.inner;
        let d = Deadline::after(timeout);
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

    fn signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        let w = &self.inner;
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

    fn wait_signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        let w = &self.inner;
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

    fn map_remote(&self, rank: i32) -> Result<*mut c_void> {
        let w = &self.inner;
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

    fn close(&self) {
        let w = &self.inner;
        let (inflight, watch, hard) = {
            let mut st = w.state();
            if st.closed {
                return;
            }
            st.closed = true;
            w.wake();
            (
                std::mem::take(&mut st.inflight),
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

impl Drop for GlooWindow {
    fn drop(&mut self) {
        self.close();
    }
}
