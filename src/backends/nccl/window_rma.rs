//! The nccl window itself: registration, puts, signal records and waits
//! over NCCL's host RMA calls (the mapping is described in [`super::window`]).

use super::loader::*;
use super::work::Shared;
use super::NcclBackend;
use crate::backends::WindowBackend;
use crate::cuda::{self, Stream as CudaStream};
use crate::error::{Error, ErrorKind, Result};
use crate::util::lock;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

/// Signal records a window keeps per origin: an origin may run this many
/// signals ahead of the target's waits.
pub(super) const RING: usize = 256;
/// Bytes of the control buffer that stage a put's source (per put call).
const STAGE: usize = 1 << 20;
/// The outgoing signal record: after the staging part.
const OUT_SLOT: usize = STAGE;
/// The incoming rings of signal records, one per origin.
const RINGS: usize = STAGE + 64;
/// A record is (signal number mod 2^24) << 40 | the origin's operation
/// count (to that target, in this window) at the signal, counting it.
const POSITION_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << 24) - 1;

/// Per comm (NCCL counts signals per comm): operations sent to each peer
/// and signals consumed from each, over all of the comm's windows.
#[derive(Default)]
struct CommCounts {
    sent: Vec<u64>,
    consumed: Vec<u64>,
    /// A window of this comm has a registered buffer.
    registered: bool,
    /// A wait ended before NCCL's did: the counts no longer match NCCL's.
    broken: Option<String>,
}

type CountsRegistry = HashMap<usize, (Weak<Shared>, Arc<Mutex<CommCounts>>)>;

/// The counts of the comm whose backend shares `shared` (keyed by its
/// allocation, which the `Weak` keeps from being reused).
fn comm_counts(shared: &Arc<Shared>, n: usize) -> Arc<Mutex<CommCounts>> {
    static REGISTRY: OnceLock<Mutex<CountsRegistry>> = OnceLock::new();
    let mut reg = lock(REGISTRY.get_or_init(Default::default));
    reg.retain(|_, (w, _)| w.strong_count() > 0);
    let key = Arc::as_ptr(shared) as usize;
    let entry = reg.entry(key).or_insert_with(|| {
        let counts = CommCounts {
            sent: vec![0; n],
            consumed: vec![0; n],
            ..Default::default()
        };
        (Arc::downgrade(shared), Arc::new(Mutex::new(counts)))
    });
    entry.1.clone()
}

/// What one registration holds.
struct Registered {
    user: usize,
    sizes: Vec<usize>,
    user_win: usize,
    ctl_win: usize,
    ctl: Control,
    /// Operations each peer had sent this rank before this window.
    base: Vec<u64>,
    /// This window's operations and signals sent to each peer.
    sent: Vec<u64>,
    signals_sent: Vec<u64>,
    /// Signals of each peer consumed by this window's waits.
    signals_waited: Vec<u64>,
}

/// The control buffer (staging, outgoing record, incoming rings).
struct Control {
    ptr: *mut c_void,
    from_nccl: bool,
}

impl Control {
    fn new(lib: &Nccl, ranks: usize) -> Result<Control> {
        let bytes = RINGS + ranks * RING * 8;
        let (ptr, from_nccl) = match lib.mem_alloc {
            Some(alloc) => {
                let mut p = std::ptr::null_mut();
                // SAFETY: valid out-pointer; the device's context is current.
                lib.check(
                    unsafe { alloc(&mut p, bytes) },
                    "ncclMemAlloc (window control buffer)",
                    std::ptr::null_mut(),
                )?;
                (p, true)
            }
            None => (cuda::device_alloc(bytes)?, false),
        };
        let c = Control { ptr, from_nccl };
        cuda::copy_to_device(c.at(RINGS), &vec![0u8; ranks * RING * 8])?;
        Ok(c)
    }

    fn at(&self, offset: usize) -> *mut c_void {
        (self.ptr as usize + offset) as *mut c_void
    }

    fn free(&self, lib: &Nccl) {
        match (self.from_nccl, lib.mem_free) {
            // SAFETY: allocated by ncclMemAlloc, freed once.
            (true, Some(free)) => unsafe {
                free(self.ptr);
            },
            _ => {
                let _ = cuda::device_free(self.ptr);
            }
        }
    }
}

pub(super) struct NcclWindow {
    /// The comm's backend. SAFETY: a window holds its comm (`Arc<Comm>`),
    /// which owns the boxed backend for its whole life, so the backend
    /// outlives this.
    backend: *const NcclBackend,
    origin: CudaStream,
    waits: CudaStream,
    closed: AtomicBool,
    counts: Arc<Mutex<CommCounts>>,
    reg: RwLock<Option<Registered>>,
    /// The state of puts and signals (taken by the origin lane).
    origin_lock: Mutex<()>,
    /// Signals to this rank itself, not yet waited for.
    self_signals: Mutex<u64>,
    self_cv: Condvar,
}

unsafe impl Send for NcclWindow {}
unsafe impl Sync for NcclWindow {}

impl NcclWindow {
    pub(super) fn new(backend: &NcclBackend) -> Result<NcclWindow> {
        Ok(NcclWindow {
            backend,
            origin: CudaStream::new(&backend.device, 0)?,
            waits: CudaStream::new(&backend.device, 0)?,
            closed: AtomicBool::new(false),
            counts: comm_counts(&backend.shared, backend.size as usize),
            reg: RwLock::new(None),
            origin_lock: Mutex::new(()),
            self_signals: Mutex::new(0),
            self_cv: Condvar::new(),
        })
    }

    fn b(&self) -> &NcclBackend {
        // SAFETY: see the field's doc.
        unsafe { &*self.backend }
    }

    fn me(&self) -> usize {
        self.b().rank as usize
    }

    /// One NCCL call on the comm, serialized with the comm's issuing. The
    /// window's streams are its own and never capture, so the call runs in
    /// the relaxed capture interaction mode, as an uncaptured operation's
    /// calls do (see the head of `enqueue.rs`).
    fn nccl(&self, what: &str, f: impl FnOnce(NcclComm) -> NcclResult) -> Result<()> {
        let b = self.b();
        let _serial = lock(&b.issue);
        let _use = b.acquire()?;
        let _ctx = b.device.scoped()?;
        cuda::with_relaxed_capture_mode(|| b.call(what, f))
    }

    /// Waits until `stream` ran what was issued on it, polling so that a
    /// timeout, the window's free and the comm's abort end the wait.
    fn finish(&self, stream: &CudaStream, what: &str, timeout: Duration) -> Result<()> {
        let b = self.b();
        let _ctx = b.device.scoped()?;
        let done = b.events.get()?;
        done.record(stream.raw())?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            if done.query()? {
                return Ok(());
            }
            if self.closed.load(Ordering::Acquire) {
                return Err(Error::new(
                    ErrorKind::Aborted,
                    format!(
                        "{what} on {}: the window was freed, or its comm aborted, while it ran",
                        b.label
                    ),
                ));
            }
            if !b.is_live() {
                return Err(b.closed_error().context(what));
            }
            if Instant::now() > deadline {
                return Err(Error::timeout(format!(
                    "{what} on {} did not complete within {} ms",
                    b.label,
                    timeout.as_millis()
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn window_register(&self, buf: *mut c_void, bytes: usize, what: &str) -> Result<usize> {
        let f = self
            .b()
            .lib
            .comm_window_register
            .ok_or_else(|| Error::internal("ncclCommWindowRegister vanished"))?;
        let mut win: WinHandle = std::ptr::null_mut();
        // SAFETY: the caller keeps `buf` valid for `bytes` until deregistered.
        self.nccl(what, |c| unsafe {
            f(c, buf, bytes, &mut win, NCCL_WIN_COLL_SYMMETRIC)
        })?;
        if win.is_null() {
            return Err(Error::unsupported(format!(
                "{what} on {}: NCCL {} registered no window (it returned a NULL window: this comm has no symmetric \
                 memory support, e.g. the GPU or driver lacks CUDA VMM / multicast, or NCCL_WIN_ENABLE=0)",
                self.b().label,
                self.b().lib.version_string()
            )));
        }
        Ok(win as usize)
    }

    fn window_deregister(&self, win: usize) -> Result<()> {
        let f = self
            .b()
            .lib
            .comm_window_deregister
            .ok_or_else(|| Error::internal("ncclCommWindowDeregister vanished"))?;
        // SAFETY: a live window of this comm.
        self.nccl("ncclCommWindowDeregister", |c| unsafe {
            f(c, win as WinHandle)
        })
    }

    /// All-gathers (size, operations sent to each rank) of every rank.
    fn exchange(&self, size: usize, timeout: Duration) -> Result<Vec<Vec<u64>>> {
        let b = self.b();
        let n = b.size as usize;
        let row = n + 1;
        let mut mine = vec![size as u64];
        mine.extend_from_slice(&lock(&self.counts).sent);
        let _ctx = b.device.scoped()?;
        let table = cuda::DeviceBuffer::zeroed(&b.device, row * n * 8)?;
        let at = (table.ptr() as usize + self.me() * row * 8) as *mut c_void;
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        cuda::copy_to_device(at, &bytes)?;
        let stream = self.origin.raw() as Stream;
        // SAFETY: in-place all-gather within `table`.
        self.nccl("ncclAllGather (window sizes)", |c| unsafe {
            (b.lib.all_gather)(at, table.ptr(), row, NCCL_UINT64, c, stream)
        })?;
        self.finish(&self.origin, "register (exchanging window sizes)", timeout)?;
        let mut all = vec![0u8; row * n * 8];
        cuda::copy_to_host(&mut all, table.ptr())?;
        let words: Vec<u64> = all
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(words.chunks(row).map(|r| r.to_vec()).collect())
    }

    /// The rest of [`WindowBackend::register`] once this comm's counts
    /// were claimed.
    fn register_claimed(
        &self,
        buf: *mut c_void,
        bytes: usize,
        timeout: Duration,
    ) -> Result<Registered> {
        let b = self.b();
        let n = b.size as usize;
        let ctl = {
            let _ctx = b.device.scoped()?;
            Control::new(b.lib, n)?
        };
        let user_win = match self.window_register(
            buf,
            bytes,
            "register (ncclCommWindowRegister of the buffer)",
        ) {
            Ok(w) => w,
            Err(e) => {
                ctl.free(b.lib);
                return Err(e);
            }
        };
        let ctl_bytes = RINGS + n * RING * 8;
        let ctl_win = self.window_register(
            ctl.ptr,
            ctl_bytes,
            "register (ncclCommWindowRegister of the control buffer)",
        )?;
        let table = self.exchange(bytes, timeout)?;
        Ok(Registered {
            user: buf as usize,
            sizes: table.iter().map(|r| r[0] as usize).collect(),
            user_win,
            ctl_win,
            ctl,
            base: table.iter().map(|r| r[1 + self.me()]).collect(),
            sent: vec![0; n],
            signals_sent: vec![0; n],
            signals_waited: vec![0; n],
        })
    }

    /// One ncclPutSignal of `bytes` at `src` (inside a registered window)
    /// to `peer`'s window `win` at `offset`, counted as sent.
    fn put_signal(
        &self,
        r: &mut Registered,
        src: *const c_void,
        bytes: usize,
        peer: i32,
        win: usize,
        offset: usize,
    ) -> Result<()> {
        let b = self.b();
        let f = b
            .lib
            .put_signal
            .ok_or_else(|| Error::internal("ncclPutSignal vanished"))?;
        let stream = self.origin.raw() as Stream;
        // SAFETY: `src` lies in a registered window; the bounds were checked.
        self.nccl("ncclPutSignal", |c| unsafe {
            f(
                src,
                bytes,
                NCCL_UINT8,
                peer,
                win as WinHandle,
                offset,
                0,
                0,
                0,
                c,
                stream,
            )
        })?;
        r.sent[peer as usize] += 1;
        lock(&self.counts).sent[peer as usize] += 1;
        Ok(())
    }

    /// Waits for `ops` more of NCCL's signals from `peer` (consumes them).
    fn wait_ops(&self, peer: i32, ops: u64, timeout: Duration) -> Result<()> {
        let f = self
            .b()
            .lib
            .wait_signal
            .ok_or_else(|| Error::internal("ncclWaitSignal vanished"))?;
        let mut desc = WaitSignalDesc {
            op_cnt: ops.min(i32::MAX as u64) as i32,
            peer,
            sig_idx: 0,
            ctx: 0,
        };
        let stream = self.waits.raw() as Stream;
        // SAFETY: one valid descriptor.
        self.nccl("ncclWaitSignal", |c| unsafe { f(1, &mut desc, c, stream) })?;
        let what = format!("wait_signal (for {ops} signal(s) of rank {peer})");
        if let Err(e) = self.finish(&self.waits, &what, timeout) {
            lock(&self.counts).broken = Some(e.message.clone());
            return Err(e);
        }
        lock(&self.counts).consumed[peer as usize] += desc.op_cnt as u64;
        Ok(())
    }

    fn read_record(&self, r: &Registered, peer: usize, slot: usize) -> Result<u64> {
        let mut word = [0u8; 8];
        let _ctx = self.b().device.scoped()?;
        cuda::copy_to_host(&mut word, r.ctl.at(RINGS + (peer * RING + slot) * 8))?;
        Ok(u64::from_le_bytes(word))
    }

    fn wait_self(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut n = lock(&self.self_signals);
        while *n == 0 {
            if self.closed.load(Ordering::Acquire) {
                return Err(Error::new(
                    ErrorKind::Aborted,
                    "wait_signal: the window was freed while it waited",
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::timeout(format!(
                    "wait_signal on {}: no signal from this rank itself within {} ms",
                    self.b().label,
                    timeout.as_millis()
                )));
            }
            n = self
                .self_cv
                .wait_timeout(n, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *n -= 1;
        Ok(())
    }

    fn registered(&self) -> Result<std::sync::RwLockReadGuard<'_, Option<Registered>>> {
        let g = self.reg.read().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            return Err(Error::invalid_usage(
                "this rank has no buffer registered with the window",
            ));
        }
        Ok(g)
    }
}

/// The window's ncclWindow_t (an opaque pointer).
#[allow(non_camel_case_types)]
type WinHandle = super::loader::NcclWindow;

impl WindowBackend for NcclWindow {
    fn register(&self, buf: *mut c_void, bytes: usize, timeout: Duration) -> Result<()> {
        {
            let mut c = lock(&self.counts);
            if c.registered {
                return Err(Error::invalid_usage(format!(
                    "register on a window of {}: another window of this comm has a registered buffer; NCCL counts \
                     signals per comm, not per window, so two could not tell their signals apart: deregister it first",
                    self.b().label
                )));
            }
            c.registered = true;
        }
        match self.register_claimed(buf, bytes, timeout) {
            Ok(r) => {
                *self.reg.write().unwrap_or_else(|e| e.into_inner()) = Some(r);
                Ok(())
            }
            Err(e) => {
                lock(&self.counts).registered = false;
                Err(e)
            }
        }
    }

    fn deregister(&self, _timeout: Duration) -> Result<()> {
        let Some(r) = self.reg.write().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        lock(&self.counts).registered = false;
        let first = self.window_deregister(r.user_win);
        let second = self.window_deregister(r.ctl_win);
        if first.is_ok() && second.is_ok() {
            let _ctx = self.b().device.scoped();
            r.ctl.free(self.b().lib);
        }
        first.and(second)
    }

    fn remote_size(&self, rank: i32) -> usize {
        let g = self.reg.read().unwrap_or_else(|e| e.into_inner());
        g.as_ref()
            .and_then(|r| r.sizes.get(rank as usize).copied())
            .unwrap_or(0)
    }

    fn put(
        &self,
        src: *const c_void,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        let _origin = lock(&self.origin_lock);
        let mut g = self.reg.write().unwrap_or_else(|e| e.into_inner());
        let r = g
            .as_mut()
            .ok_or_else(|| Error::invalid_usage("put: no buffer registered"))?;
        let stream = self.origin.raw();
        if dst_rank as usize == self.me() {
            let _ctx = self.b().device.scoped()?;
            cuda::memcpy_async((r.user + dst_offset) as *mut c_void, src, bytes, stream)?;
            return self.finish(&self.origin, "put", timeout);
        }
        let inside =
            (src as usize) >= r.user && (src as usize) + bytes <= r.user + r.sizes[self.me()];
        if inside {
            let win = r.user_win;
            self.put_signal(r, src, bytes, dst_rank, win, dst_offset)?;
            return self.finish(&self.origin, "put", timeout);
        }
        let mut done = 0;
        while done < bytes {
            let len = (bytes - done).min(STAGE);
            {
                let _ctx = self.b().device.scoped()?;
                cuda::memcpy_async(
                    r.ctl.at(0),
                    (src as usize + done) as *const c_void,
                    len,
                    stream,
                )?;
            }
            let (stage, win) = (r.ctl.at(0) as *const c_void, r.user_win);
            self.put_signal(r, stage, len, dst_rank, win, dst_offset + done)?;
            self.finish(&self.origin, "put", timeout)?;
            done += len;
        }
        Ok(())
    }

    fn get(
        &self,
        dst: *mut c_void,
        bytes: usize,
        src_rank: i32,
        src_offset: usize,
        timeout: Duration,
    ) -> Result<()> {
        let g = self.registered()?;
        let r = g.as_ref().expect("checked");
        if src_rank as usize != self.me() {
            return Err(Error::unsupported(format!(
                "argument 'src_rank': get from rank {src_rank} on {}: NCCL's one-sided API has puts only \
                 (ncclPutSignal), no get, and a get would need rank {src_rank} to take part; have it put the data \
                 instead, or use a gloo comm for windows (a get from this rank's own buffer works)",
                self.b().label
            )));
        }
        let _origin = lock(&self.origin_lock);
        {
            let _ctx = self.b().device.scoped()?;
            cuda::memcpy_async(
                dst,
                (r.user + src_offset) as *const c_void,
                bytes,
                self.origin.raw(),
            )?;
        }
        self.finish(&self.origin, "get", timeout)
    }

    fn signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        if peer as usize == self.me() {
            *lock(&self.self_signals) += 1;
            self.self_cv.notify_all();
            return Ok(());
        }
        let _origin = lock(&self.origin_lock);
        let mut g = self.reg.write().unwrap_or_else(|e| e.into_inner());
        let r = g
            .as_mut()
            .ok_or_else(|| Error::invalid_usage("signal: no buffer registered"))?;
        let p = peer as usize;
        let k = r.signals_sent[p];
        let record = ((k + 1) & SEQ_MASK) << POSITION_BITS | (r.sent[p] + 1);
        {
            let _ctx = self.b().device.scoped()?;
            cuda::copy_to_device(r.ctl.at(OUT_SLOT), &record.to_le_bytes())?;
        }
        let slot = RINGS + (self.me() * RING + (k as usize % RING)) * 8;
        let out = r.ctl.at(OUT_SLOT) as *const c_void;
        let ctl_win = r.ctl_win;
        self.put_signal(r, out, 8, peer, ctl_win, slot)?;
        r.signals_sent[p] += 1;
        self.finish(&self.origin, "signal", timeout)
    }

    fn wait_signal(&self, peer: i32, timeout: Duration) -> Result<()> {
        if peer as usize == self.me() {
            return self.wait_self(timeout);
        }
        if let Some(why) = lock(&self.counts).broken.clone() {
            return Err(Error::invalid_usage(format!(
                "wait_signal on {}: an earlier wait on this comm ended before NCCL's wait did ({why}); NCCL's \
                 signal counts can no longer be matched: abort the comm",
                self.b().label
            )));
        }
        let p = peer as usize;
        let (k, base) = {
            let g = self.registered()?;
            let r = g.as_ref().expect("checked");
            (r.signals_waited[p], r.base[p])
        };
        let consumed = lock(&self.counts).consumed[p];
        if consumed < base {
            self.wait_ops(peer, base - consumed, timeout)?;
        }
        let want = (k + 1) & SEQ_MASK;
        let older = (k + 1).wrapping_sub(RING as u64) & SEQ_MASK;
        loop {
            let record = {
                let g = self.registered()?;
                self.read_record(g.as_ref().expect("checked"), p, k as usize % RING)?
            };
            let seq = record >> POSITION_BITS;
            let consumed = lock(&self.counts).consumed[p];
            if seq == want {
                let at = base + (record & ((1 << POSITION_BITS) - 1));
                if consumed < at {
                    self.wait_ops(peer, at - consumed, timeout)?;
                }
                let mut g = self.reg.write().unwrap_or_else(|e| e.into_inner());
                if let Some(r) = g.as_mut() {
                    r.signals_waited[p] += 1;
                }
                return Ok(());
            }
            if record != 0 && seq != older {
                return Err(Error::invalid_usage(format!(
                    "wait_signal on {}: rank {peer} ran more than {RING} signals ahead of this rank's waits \
                     (its signal records overwrote each other); wait for signals sooner",
                    self.b().label
                )));
            }
            self.wait_ops(peer, 1, timeout)?;
        }
    }

    fn map_remote(&self, rank: i32) -> Result<*mut c_void> {
        let g = self.registered()?;
        let r = g.as_ref().expect("checked");
        if rank as usize == self.me() {
            return Ok(r.user as *mut c_void);
        }
        Err(Error::unsupported(format!(
            "argument 'rank': map_remote of rank {rank} on {}: NCCL windows give no host-usable pointer to another \
             rank's device memory",
            self.b().label
        )))
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.self_cv.notify_all();
        if self.reg.read().unwrap_or_else(|e| e.into_inner()).is_some() {
            // NCCL keeps the registration (and our control buffer, which
            // stays allocated) until the comm is destroyed: deregistering
            // is collective and the other ranks may not be here.
            lock(&self.counts).registered = false;
        }
    }
}
