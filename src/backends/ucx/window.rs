//! One-sided windows as UCP remote memory access, over the comm's own UCX
//! worker and endpoints (no Gloo context, no thread of their own).
//!
//! - `register` (collective) maps the caller's buffer and this window's
//!   signal counters (one 64-bit counter per origin rank) with
//!   `ucp_mem_map`, packs their remote keys and publishes them, with the
//!   buffer's size and addresses, in the comm's store under
//!   `window/<k>/ucx/<epoch>/<rank>`; every rank unpacks every peer's keys
//!   on its endpoint to that peer.
//! - `put` and `get` are `ucp_put_nbx` and `ucp_get_nbx` (a get flushes the
//!   endpoint first, so that this rank's earlier puts landed); `signal`
//!   flushes the endpoint (the earlier puts landed) and adds one to the
//!   target's counter of this rank with `ucp_atomic_op_nbx`; `wait_signal`
//!   waits until its counter of the peer passed what was consumed,
//!   progressing the worker, and fails when UCX reports the peer failed.
//! - `deregister` (collective) flushes every endpoint, waits until every
//!   rank did (through the store, progressing the worker meanwhile), then
//!   unmaps.
//!
//! Over TCP, UCX emulates these operations with active messages that the
//! target handles when it progresses its worker: besides the target's own
//! window and comm calls, the comm's progress thread progresses the worker
//! while it is idle and a window is registered
//! ([`UcxTransport::progress_idle`]). On RDMA hardware they are one-sided.
//!
//! A failed or timed-out put, get or signal withdraws the comm's UCX
//! endpoints like any failed UCX operation (its peers fail at once); a
//! `wait_signal` that times out harms nothing.
//!
//! `map_remote` of a peer gives a pointer where the peer's buffer can be
//! mapped into this process: `register` also publishes where the buffer
//! lies in memory a same-host peer can map (as the backend's
//! [`SameHostMemory`] describes it), and maps the peers' that can be. A put
//! or get to a peer mapped so is a memory copy through that mapping (in the
//! peer's buffer when `put` returns); signals, and puts and gets to the
//! other peers, go through UCX (its shared-memory transports between
//! same-host peers where `UCX_TLS` allows them).

use super::loader::*;
use super::worker::Request;
use super::UcxTransport;
use crate::backends::WindowBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::store::StoreRef;
use crate::util::{lock, Deadline};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Memory that same-host peers can map, as the backend that owns it
/// describes and maps it (a window's `map_remote`).
pub trait SameHostMemory: Send + Sync {
    /// Where `[buf, buf + bytes)` lies, as a record a peer of this host can
    /// map; empty when it lies in no such memory.
    fn describe(&self, buf: usize, bytes: usize) -> Vec<u8>;
    /// Maps a peer's record here: the buffer's address, and what keeps the
    /// mapping (dropped to unmap it). None when it cannot be mapped here
    /// (another host, an empty record, or the mapping failed).
    fn map(&self, record: &[u8]) -> Option<(*mut u8, Box<dyn Send + Sync>)>;
}

/// A window whose every peer is reached through UCP.
pub struct UcxWindow {
    t: Arc<UcxTransport>,
    same_host: Box<dyn SameHostMemory>,
    /// The comm's store under `window/<k>`.
    store: StoreRef,
    rank: usize,
    size: usize,
    label: String,
    /// Where peers' signals land: one counter per origin (boxed: UCX
    /// writes there by address).
    counters: Box<[AtomicU64]>,
    /// Per origin, the signals already waited for.
    consumed: Box<[AtomicU64]>,
    epoch: AtomicU32,
    closed: AtomicBool,
    reg: Mutex<Option<Registration>>,
}

/// The mappings of one registration.
struct Registration {
    buf: usize,
    epoch: u32,
    /// NULL for an empty buffer.
    memh: MemH,
    counters_memh: MemH,
    peers: Vec<Remote>,
}

/// A peer's registered buffer and counters as this rank reaches them.
struct Remote {
    bytes: usize,
    addr: u64,
    /// NULL for this rank and for an empty buffer.
    rkey: RKey,
    counters: u64,
    counters_rkey: RKey,
    /// The buffer mapped into this process (a same-host peer's shared
    /// memory), and what keeps the mapping.
    mapped: Option<(usize, Box<dyn Send + Sync>)>,
}

impl Remote {
    /// Where byte `offset` of the buffer lies in this process, when the
    /// buffer is mapped here.
    fn mapped_at(&self, offset: usize) -> Option<*mut u8> {
        self.mapped
            .as_ref()
            .map(|(base, _)| (*base + offset) as *mut u8)
    }
}

/// How long `wait_signal` spins on progress before it sleeps on the
/// worker's events.
const SPIN_FOR: Duration = Duration::from_micros(100);

// The raw UCX handles are used under the locks (the worker's for every
// call that touches the worker).
unsafe impl Send for UcxWindow {}
unsafe impl Sync for UcxWindow {}

impl UcxWindow {
    /// The window `k` of the comm whose store is `store` (already scoped
    /// to `window/<k>`): local, nothing is exchanged before `register`.
    pub fn new(
        t: Arc<UcxTransport>,
        same_host: Box<dyn SameHostMemory>,
        store: StoreRef,
        k: u64,
        comm: &str,
    ) -> Result<UcxWindow> {
        let (rank, size) = {
            let st = lock(&t.state);
            (st.w.rank, st.w.size)
        };
        let zero = |_| AtomicU64::new(0);
        let label = format!("window {k} of comm '{comm}'");
        crate::log_info!("ucx: {label} created on rank {rank}/{size} (UCP remote memory access)");
        Ok(UcxWindow {
            t,
            same_host,
            store,
            rank,
            size,
            label,
            counters: (0..size).map(zero).collect(),
            consumed: (0..size).map(zero).collect(),
            epoch: AtomicU32::new(0),
            closed: AtomicBool::new(false),
            reg: Mutex::new(None),
        })
    }

    fn what(&self, op: &str) -> String {
        format!("{} {op}", self.label)
    }

    /// Fails once the window was closed or the comm broke or was aborted.
    fn usable(&self, op: &str) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("ucx {}: the window is closed", self.what(op)),
            ));
        }
        self.t.alive().map_err(|e| {
            Error::new(
                e.kind,
                format!("ucx {} on rank {}: {}", self.what(op), self.rank, e.message),
            )
        })
    }

    fn not_registered(&self, op: &str) -> Error {
        Error::invalid_usage(format!(
            "ucx {} on rank {}: no buffer is registered",
            self.what(op),
            self.rank
        ))
    }

    fn check_rank(&self, r: i32, arg: &str, op: &str) -> Result<usize> {
        if r < 0 || r as usize >= self.size {
            return Err(Error::invalid_argument(format!(
                "ucx {}: {arg} {r} is not a rank of this comm (0..{})",
                self.what(op),
                self.size
            )));
        }
        Ok(r as usize)
    }

    /// Posts one operation on the endpoint to `peer` with `post` and waits
    /// for it (the worker's wait: deadline, peer failure, abort).
    fn run(
        &self,
        peer: usize,
        op: &str,
        d: &Deadline,
        post: impl FnOnce(&Ucp, Ep) -> StatusPtr,
    ) -> Result<()> {
        let what = self.what(op);
        let alive = || self.usable(op);
        let mut st = lock(&self.t.state);
        let w = &mut st.w;
        let ep = w.ep(peer)?;
        let p = post(w.ucp, ep);
        let mut reqs = [Request::posted(p, peer, false)];
        w.wait(&mut reqs, d, &alive, &what)
    }

    fn flush(&self, peer: usize, op: &str, d: &Deadline) -> Result<()> {
        let param = RequestParam::new();
        // SAFETY: a live endpoint; the flush moves no caller memory.
        self.run(peer, op, d, |u, ep| unsafe { (u.ep_flush_nbx)(ep, &param) })
    }

    /// Maps `bytes` at `addr` for remote reads and writes.
    fn map(&self, addr: *mut c_void, bytes: usize) -> Result<MemH> {
        let st = lock(&self.t.state);
        let params = MemMapParams {
            field_mask: UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | UCP_MEM_MAP_PARAM_FIELD_PROT,
            address: addr,
            length: bytes,
            flags: 0,
            prot: UCP_MEM_MAP_PROT_ALL,
            memory_type: 0,
        };
        let mut memh: MemH = std::ptr::null_mut();
        // SAFETY: a live context; the memory is the caller's (registered).
        let s = unsafe { (st.w.ucp.mem_map)(st.w.context(), &params, &mut memh) };
        if s != UCS_OK {
            return Err(Error::unavailable(format!(
                "ucx {} on rank {}: ucp_mem_map of {bytes} bytes failed: {}",
                self.what("register"),
                self.rank,
                st.w.ucp.status_string(s)
            )));
        }
        Ok(memh)
    }

    /// The packed remote key of `memh` (empty for NULL).
    fn pack(&self, memh: MemH) -> Result<Vec<u8>> {
        if memh.is_null() {
            return Ok(Vec::new());
        }
        let st = lock(&self.t.state);
        let u = st.w.ucp;
        let (mut p, mut n): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: a live mapping of this context; released below.
        let s = unsafe { (u.rkey_pack)(st.w.context(), memh, &mut p, &mut n) };
        if s != UCS_OK {
            return Err(Error::unavailable(format!(
                "ucx {}: ucp_rkey_pack failed: {}",
                self.what("register"),
                u.status_string(s)
            )));
        }
        let v = unsafe { std::slice::from_raw_parts(p as *const u8, n) }.to_vec();
        unsafe { (u.rkey_buffer_release)(p) };
        Ok(v)
    }

    fn unpack(&self, peer: usize, packed: &[u8]) -> Result<RKey> {
        if packed.is_empty() || peer == self.rank {
            return Ok(std::ptr::null_mut());
        }
        let st = lock(&self.t.state);
        let ep = st.w.ep(peer)?;
        let mut rkey: RKey = std::ptr::null_mut();
        // SAFETY: a live endpoint; UCX copies what it needs.
        let s =
            unsafe { (st.w.ucp.ep_rkey_unpack)(ep, packed.as_ptr() as *const c_void, &mut rkey) };
        if s != UCS_OK {
            return Err(Error::remote(format!(
                "ucx {} on rank {}: the remote key of rank {peer} could not be unpacked: {}",
                self.what("register"),
                self.rank,
                st.w.ucp.status_string(s)
            )));
        }
        Ok(rkey)
    }

    /// Releases a registration's keys and mappings (local).
    fn release(&self, r: Registration) {
        let st = lock(&self.t.state);
        let u = st.w.ucp;
        for p in &r.peers {
            for k in [p.rkey, p.counters_rkey] {
                if !k.is_null() {
                    // SAFETY: a key unpacked here, destroyed once.
                    unsafe { (u.rkey_destroy)(k) };
                }
            }
        }
        for m in [r.memh, r.counters_memh] {
            if !m.is_null() {
                // SAFETY: a mapping of this context, unmapped once.
                unsafe { (u.mem_unmap)(st.w.context(), m) };
            }
        }
        self.t.window_deregistered();
    }

    /// Waits until `keys` are all in the store, progressing the worker
    /// meanwhile (peers' emulated operations may need this rank's
    /// progress), bounded by `d`; fails as soon as UCX reports a peer
    /// failed or a peer's failure notice comes.
    fn store_wait(&self, keys: &[String], d: &Deadline, op: &str) -> Result<()> {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        loop {
            if self.store.check(&refs)? {
                return Ok(());
            }
            self.usable(op)?;
            if d.passed() {
                let missing: Vec<usize> = refs
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| !self.store.check(&[k]).unwrap_or(false))
                    .map(|(r, _)| r)
                    .collect();
                return Err(Error::timeout(format!(
                    "ucx {} on rank {} timed out after {:?} waiting for rank(s) {missing:?}",
                    self.what(op),
                    self.rank,
                    d.timeout()
                )));
            }
            if let Ok(mut st) = self.t.state.try_lock() {
                st.w.progress();
                // A peer that failed (or told of a failure) never comes.
                let what = self.what(op);
                let peers = (0..self.size).filter(|p| *p != self.rank);
                if let Some(e) = peers.into_iter().find_map(|p| st.w.peer_failure(p, &what)) {
                    return Err(e);
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn registration<'a>(&self, g: &'a Option<Registration>, op: &str) -> Result<&'a Registration> {
        self.usable(op)?;
        g.as_ref().ok_or_else(|| self.not_registered(op))
    }

    /// The remote address of `bytes` at `offset` of `peer`'s buffer,
    /// refused (naming the argument) when out of its bounds.
    fn bounds(
        &self,
        reg: &Registration,
        peer: usize,
        offset: usize,
        bytes: usize,
        names: (&str, &str),
    ) -> Result<u64> {
        let size = reg.peers[peer].bytes;
        if !matches!(offset.checked_add(bytes), Some(end) if end <= size) {
            return Err(Error::invalid_argument(format!(
                "ucx {}: {} {offset} + {bytes} bytes is past the end of rank {peer}'s {size}-byte buffer",
                self.what(names.0),
                names.1
            )));
        }
        Ok(reg.peers[peer].addr + offset as u64)
    }
}

fn encode(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::new();
    for p in parts {
        v.extend_from_slice(&(p.len() as u64).to_le_bytes());
        v.extend_from_slice(p);
    }
    v
}

fn decode(mut b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?) as usize;
        out.push(b.get(8..8 + n)?.to_vec());
        b = &b[8 + n..];
    }
    Some(out)
}

fn word(b: &[u8]) -> u64 {
    b.try_into().map(u64::from_le_bytes).unwrap_or(0)
}

impl WindowBackend for UcxWindow {
    fn register(&self, buf: *mut c_void, bytes: usize, timeout: Duration) -> Result<()> {
        let d = Deadline::after(timeout);
        self.usable("register")?;
        let mut g = lock(&self.reg);
        if g.is_some() {
            return Err(Error::invalid_usage(format!(
                "ucx {}: a buffer is already registered",
                self.what("register")
            )));
        }
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst);
        let memh = match bytes {
            0 => std::ptr::null_mut(),
            _ => self.map(buf, bytes)?,
        };
        let counters_memh = self.map(
            self.counters.as_ptr() as *mut c_void,
            self.size * std::mem::size_of::<u64>(),
        );
        self.t.window_registered();
        let mut reg = Registration {
            buf: buf as usize,
            epoch,
            memh,
            counters_memh: std::ptr::null_mut(),
            peers: Vec::new(),
        };
        let result = (|| {
            reg.counters_memh = counters_memh?;
            let record = encode(&[
                &(bytes as u64).to_le_bytes(),
                &(buf as u64).to_le_bytes(),
                &(self.counters.as_ptr() as u64).to_le_bytes(),
                &self.pack(reg.memh)?,
                &self.pack(reg.counters_memh)?,
                &self.same_host.describe(buf as usize, bytes),
            ]);
            let keys: Vec<String> = (0..self.size).map(|r| format!("ucx/{epoch}/{r}")).collect();
            self.store.set(&keys[self.rank], &record)?;
            self.store_wait(&keys, &d, "register")?;
            for (r, key) in keys.iter().enumerate() {
                let parts = decode(&self.store.get(key)?)
                    .filter(|p| p.len() == 6)
                    .ok_or_else(|| {
                        Error::internal(format!(
                            "ucx {}: rank {r}'s record is malformed",
                            self.what("register")
                        ))
                    })?;
                let rkey = self.unpack(r, &parts[3]);
                let counters_rkey = self.unpack(r, &parts[4]);
                // Kept whichever unpacked, so that `release` destroys it.
                reg.peers.push(Remote {
                    bytes: word(&parts[0]) as usize,
                    addr: word(&parts[1]),
                    rkey: *rkey.as_ref().unwrap_or(&std::ptr::null_mut()),
                    counters: word(&parts[2]),
                    counters_rkey: *counters_rkey.as_ref().unwrap_or(&std::ptr::null_mut()),
                    mapped: match r == self.rank {
                        true => None,
                        false => self
                            .same_host
                            .map(&parts[5])
                            .map(|(p, keep)| (p as usize, keep)),
                    },
                });
                rkey?;
                counters_rkey?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                *g = Some(reg);
                Ok(())
            }
            Err(e) => {
                self.release(reg);
                Err(e)
            }
        }
    }

    fn deregister(&self, timeout: Duration) -> Result<()> {
        let d = Deadline::after(timeout);
        let mut g = lock(&self.reg);
        let epoch = self.registration(&g, "deregister")?.epoch;
        let mut result = Ok(());
        for p in (0..self.size).filter(|p| *p != self.rank) {
            result = result.and_then(|()| self.flush(p, "deregister", &d));
        }
        if result.is_ok() {
            let keys: Vec<String> = (0..self.size)
                .map(|r| format!("ucx/{epoch}/done/{r}"))
                .collect();
            result = self
                .store
                .set(&keys[self.rank], b"1")
                .and_then(|()| self.store_wait(&keys, &d, "deregister"));
        }
        if let Some(r) = g.take() {
            self.release(r);
        }
        result
    }

    fn remote_size(&self, rank: i32) -> usize {
        let g = lock(&self.reg);
        g.as_ref()
            .and_then(|r| r.peers.get(rank as usize))
            .map_or(0, |p| p.bytes)
    }

    fn put(
        &self,
        src: *const c_void,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        let d = Deadline::after(timeout);
        let peer = self.check_rank(dst_rank, "dst_rank", "put")?;
        let g = lock(&self.reg);
        let reg = self.registration(&g, "put")?;
        let addr = self.bounds(reg, peer, dst_offset, bytes, ("put", "dst_offset"))?;
        if bytes == 0 {
            return Ok(());
        }
        if peer == self.rank {
            // SAFETY: in bounds of this rank's registered buffer; the
            // source holds `bytes` (the caller's contract).
            unsafe { std::ptr::copy(src as *const u8, addr as *mut u8, bytes) };
            return Ok(());
        }
        if let Some(at) = reg.peers[peer].mapped_at(dst_offset) {
            // SAFETY: in bounds of the peer's buffer, mapped here; a copy
            // that allows overlap, since the source may lie in a mapping
            // too. A later signal fences before it goes out.
            unsafe { std::ptr::copy(src as *const u8, at, bytes) };
            return Ok(());
        }
        let rkey = reg.peers[peer].rkey;
        let param = RequestParam::new();
        // SAFETY: `src` stays valid until the wait returns (or the request
        // was withdrawn); the remote range was checked.
        self.run(peer, "put", &d, |u, ep| unsafe {
            (u.put_nbx)(ep, src, bytes, addr, rkey, &param)
        })
    }

    fn get(
        &self,
        dst: *mut c_void,
        bytes: usize,
        src_rank: i32,
        src_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        let d = Deadline::after(timeout);
        let peer = self.check_rank(src_rank, "src_rank", "get")?;
        let g = lock(&self.reg);
        let reg = self.registration(&g, "get")?;
        let addr = self.bounds(reg, peer, src_offset, bytes, ("get", "src_offset"))?;
        if bytes == 0 {
            return Ok(());
        }
        if peer == self.rank {
            // SAFETY: as for a put to self.
            unsafe { std::ptr::copy(addr as *const u8, dst as *mut u8, bytes) };
            return Ok(());
        }
        if let Some(at) = reg.peers[peer].mapped_at(src_offset) {
            // SAFETY: as for a put through the mapping; this rank's earlier
            // puts to the peer went the same way, so they are there.
            unsafe { std::ptr::copy(at as *const u8, dst as *mut u8, bytes) };
            return Ok(());
        }
        // This rank's earlier puts to the peer land first.
        self.flush(peer, "get", &d)?;
        let rkey = reg.peers[peer].rkey;
        let param = RequestParam::new();
        // SAFETY: `dst` stays valid for writes until the wait returns.
        self.run(peer, "get", &d, |u, ep| unsafe {
            (u.get_nbx)(ep, dst, bytes, addr, rkey, &param)
        })
    }

    fn signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        let d = Deadline::after(timeout);
        let peer = self.check_rank(peer, "peer", "signal")?;
        let g = lock(&self.reg);
        let reg = self.registration(&g, "signal")?;
        if peer == self.rank {
            self.counters[peer].fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        // The earlier puts land before the signal: UCX's by the flush,
        // those copied through a mapping of the peer's buffer (and this
        // thread's own stores there) by the fence.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.flush(peer, "signal", &d)?;
        let r = &reg.peers[peer];
        let (at, rkey) = (r.counters + 8 * self.rank as u64, r.counters_rkey);
        let one: u64 = 1;
        let mut param = RequestParam::new();
        param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
        param.datatype = UCP_DATATYPE_U64;
        // SAFETY: `one` outlives the wait; the counter's address and key
        // are the peer's.
        self.run(peer, "signal", &d, |u, ep| unsafe {
            (u.atomic_op_nbx)(
                ep,
                UCP_ATOMIC_OP_ADD,
                &one as *const u64 as *const c_void,
                1,
                at,
                rkey,
                &param,
            )
        })
    }

    fn wait_signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        let d = Deadline::after(timeout);
        let p = self.check_rank(peer, "peer", "wait_signal")?;
        let what = self.what("wait_signal");
        let start = Instant::now();
        loop {
            let seen = self.consumed[p].load(Ordering::SeqCst);
            if self.counters[p].load(Ordering::SeqCst) > seen {
                if self.consumed[p]
                    .compare_exchange(seen, seen + 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Ok(());
                }
                continue;
            }
            self.usable("wait_signal")?;
            let spinning = start.elapsed() < SPIN_FOR;
            let mut armed = None;
            if p != self.rank {
                // Busy: whoever holds the worker progresses it.
                if let Ok(mut st) = self.t.state.try_lock() {
                    if !st.w.progress() && !spinning {
                        armed = st.w.arm();
                    }
                    if let Some(e) = st.w.peer_failure(p, &what) {
                        return Err(e);
                    }
                }
            }
            if d.passed() {
                return Err(Error::timeout(format!(
                    "ucx {what} on rank {} for a signal from rank {p} timed out after {:?}",
                    self.rank,
                    d.timeout()
                )));
            }
            // Spin briefly (a signal's answer comes within), then sleep on
            // the worker's events (a peer's message wakes it) for at most a
            // millisecond at a time, with the worker released so that this
            // rank's other calls and its progress thread use it meanwhile.
            match armed {
                _ if spinning => std::thread::yield_now(),
                Some(fd) => {
                    let mut pfd = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd; an error only ends the sleep.
                    unsafe { libc::poll(&mut pfd, 1, 1) };
                }
                None => std::thread::sleep(Duration::from_micros(50)),
            }
        }
    }

    fn map_remote(&self, rank: i32) -> Result<*mut c_void> {
        let r = self.check_rank(rank, "rank", "map_remote")?;
        let g = lock(&self.reg);
        let reg = self.registration(&g, "map_remote")?;
        if r == self.rank {
            return Ok(reg.buf as *mut c_void);
        }
        match &reg.peers[r].mapped {
            Some((p, _)) => Ok(*p as *mut c_void),
            None => Err(Error::unsupported(format!(
                "ucx {}: rank {r}'s buffer is not mapped here: only a buffer inside memory from \
                 tc_mem_alloc, registered by a process of this host, can be; use get",
                self.what("map_remote")
            ))),
        }
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(r) = lock(&self.reg).take() {
            self.release(r);
        }
    }
}

impl Drop for UcxWindow {
    fn drop(&mut self) {
        self.close();
    }
}
