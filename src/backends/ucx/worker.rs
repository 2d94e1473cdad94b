//! The UCP context, worker and endpoints of one comm, and the one wait loop
//! every operation goes through: progressed by the calling thread, bounded
//! by the operation's deadline, stopped by the comm's abort, and failed by
//! UCX's peer failure reports (error handling mode "peer").
//!
//! A wait spins on progress (yielding the core between calls) for
//! [`SPIN_FOR`] after the last headway (a small message's answer, and a
//! large transfer's next piece, comes within it), then sleeps on the worker's
//! event file descriptor (armed with `ucp_worker_arm`) for at most
//! [`SLEEP_MS`] at a time, so that a long transfer leaves the CPU to the
//! peers and the socket stack (on a machine with few cores a spinning
//! rank slows the rank it waits for) while the deadline, abort and peer
//! failure checks still run.

use super::loader::{self, *};
use crate::error::{Error, ErrorKind, Result};
use crate::store::StoreRef;
use crate::util::Deadline;
use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The UCX settings this library makes over TCP, as (name for
/// `ucp_config_modify`, value), for messages of up to `eager` bytes sent
/// eagerly: none where the host has verbs devices (RDMA, whose zero-copy
/// rendezvous is UCX's fast path), and none whose UCX variable the user
/// set (`user_set(variable)`: UCX's or the user's value stays).
///
/// - `RNDV_THRESH`, `eager` bytes and a little room: UCX's own threshold
///   (8 KiB on this machine) sends a collective's folded first message of
///   up to 64 KiB as a rendezvous (request, reply, data); one eager message
///   instead took a 2-rank all_reduce of 64 KiB over loopback from 56-74 to
///   45-61 us, of 32 KiB from 37-59 to 19-35 us; a limit of 128 KiB gained
///   nothing at 128 KiB.
/// - `RX_SEG_SIZE` (UCX's `UCX_TCP_RX_SEG_SIZE`), 1 MiB: with error handling
///   on the endpoints (mode "peer", which reports a dead peer) a rendezvous
///   over TCP moves its data as active messages of one receive segment
///   each, 64 KiB by default: a 1 MiB message took 16 `sendmsg` calls and
///   283 us one way over loopback in `ucx_perftest -e` (171 us without error
///   handling), 174 us with 1 MiB segments (4 MiB segments: 278 us). Costs
///   about 10 MB more resident memory per rank (UCX's receive pool). The
///   key goes without its transport's prefix: UCX accepts
///   `TCP_RX_SEG_SIZE` too, and never applies it.
fn tcp_settings(
    eager: usize,
    has_verbs: bool,
    user_set: impl Fn(&str) -> bool,
) -> Vec<(&'static CStr, String)> {
    if has_verbs {
        return Vec::new();
    }
    [
        (c"RNDV_THRESH", "UCX_RNDV_THRESH", eager + 64),
        (c"RX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", 1 << 20),
    ]
    .into_iter()
    .filter(|(_, variable, _)| !user_set(variable))
    .map(|(key, _, bytes)| (key, bytes.to_string()))
    .collect()
}

/// How long a wait spins on progress after the last headway before it
/// sleeps on the event file descriptor. 2 ms rather than 50 us: over TCP
/// a transfer's headway comes in gaps longer than 50 us, and each sleep's
/// wake-up cost more than the spin (2 and 4 ranks on 2 cores, 4 B all_reduce
/// medians of 7 interleaved rounds 9.2 against 10.5 us and 61 against 78
/// us, 64 MiB 47-52 against 49-57 ms); a wait yields the core while it
/// spins, so a peer on the same core still runs.
const SPIN_FOR: Duration = Duration::from_millis(2);
/// The longest sleep on the event file descriptor: how often a sleeping
/// wait checks its deadline and the comm's abort.
const SLEEP_MS: i32 = 5;

/// A peer's slot, handed to UCX as its endpoint's error handler argument:
/// the handler records the failure here, the wait loop reports it.
pub(super) struct PeerSlot {
    /// UCS_OK, or the status of the peer's failure.
    failure: AtomicI32,
}

unsafe extern "C" fn on_peer_failure(arg: *mut c_void, _ep: Ep, status: Status) {
    // SAFETY: `arg` is a `PeerSlot` of a live `Worker` (slots outlive the
    // endpoints: they are dropped after the worker is destroyed).
    let slot = unsafe { &*(arg as *const PeerSlot) };
    let _ =
        slot.failure
            .compare_exchange(UCS_OK, status.min(-1), Ordering::SeqCst, Ordering::SeqCst);
}

/// One posted send or receive.
pub(super) struct Request {
    /// The UCP request; NULL once complete (or completed at once).
    handle: *mut c_void,
    pub peer: usize,
    is_recv: bool,
    /// The final status (UCS_INPROGRESS while pending).
    pub status: Status,
    /// What the receive got (sender's tag, length).
    pub info: TagRecvInfo,
}

/// A send that completes once posted: its bytes are owned here until UCX is
/// done with them.
struct BufferedSend {
    request: Request,
    bytes: Vec<u8>,
}

/// The comm's UCP objects. Used by one thread at a time (the comm runs one
/// host operation at a time), so the worker is single-threaded.
pub(super) struct Worker {
    pub ucp: &'static Ucp,
    pub rank: usize,
    pub size: usize,
    context: loader::Context,
    worker: loader::Worker,
    /// The worker's event file descriptor (owned by UCX), where a wait
    /// sleeps; `None` where UCX gave none (the wait then spins, yielding).
    event_fd: Option<c_int>,
    eps: Vec<Ep>,
    /// Boxed so their addresses, given to UCX, never move.
    peers: Box<[PeerSlot]>,
    buffered: Vec<BufferedSend>,
    /// The byte buffers of completed buffered sends, for the next ones (a
    /// small send then allocates nothing).
    spare_sends: Vec<Vec<u8>>,
    /// Receive buffers kept between calls, each initialised once (a small
    /// receive then neither allocates nor clears memory).
    kept: Vec<Vec<u8>>,
    /// Set once the endpoints were closed after a failure: nothing more
    /// can be sent.
    closed: Option<Error>,
    /// The receive, posted from connect on, of a peer's failure notice
    /// (see [`Worker::withdraw`]), and its buffer (boxed: UCX writes there).
    notice: Option<Request>,
    notice_buf: Box<[u8; NOTICE_BYTES]>,
}

/// How many send and receive buffers a worker keeps between calls, and
/// the largest it keeps (larger ones are freed).
const KEPT_BUFFERS: usize = 64;
const KEPT_BYTES: usize = 64 << 10;

/// A failure notice: the rank its sender blames (u64::MAX: none) and its
/// error message, truncated.
const NOTICE_BYTES: usize = 512;
/// The tag of a failure notice (class wire-up, low bits 1) and the mask
/// that takes it from any sender.
fn notice_tag(sender: usize) -> Tag {
    super::tag(super::CLASS_WIRE_UP, sender, 1)
}
const NOTICE_MASK: Tag = !super::SENDER_BITS;

/// The store key of rank `r`'s worker address.
fn address_key(r: usize) -> String {
    format!("ucx/address/{r}")
}

impl Worker {
    /// The UCP context and worker of this rank (no peers yet), sending
    /// messages of up to `eager` bytes eagerly over TCP (see
    /// [`tcp_settings`]). Fails when UCX cannot be loaded or
    /// initialised.
    pub fn open(rank: usize, size: usize, name: &str, eager: usize) -> Result<Worker> {
        let ucp = loader::ucp()?;
        let mut config: Config = std::ptr::null_mut();
        // SAFETY: reads UCX_* settings from the environment.
        let s = unsafe { (ucp.config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
        check(ucp, s, "ucp_config_read")?;
        let has_verbs =
            std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        let user_set = |variable: &str| std::env::var_os(variable).is_some();
        for (key, value) in tcp_settings(eager, has_verbs, user_set) {
            let c_value = CString::new(value.as_str()).unwrap_or_default();
            // SAFETY: a live config and two C strings. A refusal only
            // leaves UCX's own value.
            let s = unsafe { (ucp.config_modify)(config, key.as_ptr(), c_value.as_ptr()) };
            if s != UCS_OK {
                crate::log_info!("ucx: {key:?} {value} refused ({s}); UCX's own value stays");
            }
        }
        let cname = CString::new(format!("torchcomm {name} rank {rank}")).unwrap_or_default();
        let params = Params {
            field_mask: UCP_PARAM_FIELD_FEATURES
                | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS
                | UCP_PARAM_FIELD_NAME,
            features: UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA | UCP_FEATURE_AMO64,
            request_size: 0,
            request_init: std::ptr::null_mut(),
            request_cleanup: std::ptr::null_mut(),
            tag_sender_mask: 0,
            mt_workers_shared: 0,
            estimated_num_eps: size,
            estimated_num_ppn: 0,
            name: cname.as_ptr(),
        };
        let mut context: loader::Context = std::ptr::null_mut();
        // SAFETY: params and config are valid for the call.
        let s = unsafe { (ucp.init_version)(API_MAJOR, API_MINOR, &params, config, &mut context) };
        // SAFETY: released once, after use.
        unsafe { (ucp.config_release)(config) };
        check(ucp, s, "ucp_init")?;
        let wparams = WorkerParams {
            field_mask: UCP_WORKER_PARAM_FIELD_THREAD_MODE,
            thread_mode: UCS_THREAD_MODE_SINGLE,
            rest: [0; 188],
        };
        let mut worker: loader::Worker = std::ptr::null_mut();
        // SAFETY: a live context.
        let s = unsafe { (ucp.worker_create)(context, &wparams, &mut worker) };
        if let Err(e) = check(ucp, s, "ucp_worker_create") {
            unsafe { (ucp.cleanup)(context) };
            return Err(e);
        }
        let mut fd: c_int = -1;
        // SAFETY: a live worker of a context with the wakeup feature.
        let event_fd = match unsafe { (ucp.worker_get_efd)(worker, &mut fd) } {
            UCS_OK if fd >= 0 => Some(fd),
            _ => None,
        };
        let peers = (0..size)
            .map(|_| PeerSlot {
                failure: AtomicI32::new(UCS_OK),
            })
            .collect();
        Ok(Worker {
            ucp,
            rank,
            size,
            context,
            worker,
            event_fd,
            eps: Vec::new(),
            peers,
            buffered: Vec::new(),
            spare_sends: Vec::new(),
            kept: Vec::new(),
            closed: None,
            notice: None,
            notice_buf: Box::new([0; NOTICE_BYTES]),
        })
    }

    /// This worker's address, as UCX packs it.
    fn address(&self) -> Result<Vec<u8>> {
        let mut attr: WorkerAttr = unsafe { std::mem::zeroed() };
        attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
        // SAFETY: a live worker; the address is released below.
        let s = unsafe { (self.ucp.worker_query)(self.worker, &mut attr) };
        check(self.ucp, s, "ucp_worker_query")?;
        let bytes =
            unsafe { std::slice::from_raw_parts(attr.address as *const u8, attr.address_length) }
                .to_vec();
        unsafe { (self.ucp.worker_release_address)(self.worker, attr.address) };
        Ok(bytes)
    }

    /// Publishes this worker's address in the store, reads every peer's and
    /// creates one endpoint per rank (this one's own too), each reporting
    /// its peer's failure.
    pub fn connect(&mut self, store: &StoreRef, d: &Deadline) -> Result<()> {
        store.set(&address_key(self.rank), &self.address()?)?;
        let keys: Vec<String> = (0..self.size).map(address_key).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait(&refs, Some(d.left()?))?;
        for (r, key) in keys.iter().enumerate() {
            let address = store.get(key)?;
            let params = EpParams {
                field_mask: UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                    | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                address: address.as_ptr() as *const Address,
                err_mode: UCP_ERR_HANDLING_MODE_PEER,
                err_handler_cb: Some(on_peer_failure),
                err_handler_arg: &self.peers[r] as *const PeerSlot as *mut c_void,
                rest: [0; 64],
            };
            let mut ep: Ep = std::ptr::null_mut();
            // SAFETY: a live worker; UCX copies the address.
            let s = unsafe { (self.ucp.ep_create)(self.worker, &params, &mut ep) };
            check(self.ucp, s, &format!("ucp_ep_create to rank {r}"))?;
            self.eps.push(ep);
        }
        let buf = self.notice_buf.as_mut_ptr();
        // SAFETY: the buffer is boxed and lives until the request is
        // cancelled and freed (see `Drop`).
        self.notice =
            Some(unsafe { self.recv(0, buf, NOTICE_BYTES, (notice_tag(0), NOTICE_MASK)) });
        Ok(())
    }

    /// The UCP context (for memory registration, `window.rs`).
    pub(super) fn context(&self) -> loader::Context {
        self.context
    }

    /// The endpoint to `peer`, unless the endpoints were closed after a
    /// failure (that failure).
    pub(super) fn ep(&self, peer: usize) -> Result<Ep> {
        match &self.closed {
            Some(e) => Err(e.clone()),
            None => self.eps.get(peer).copied().ok_or_else(|| {
                Error::internal(format!("ucx: no endpoint to rank {peer} (not connected)"))
            }),
        }
    }

    /// The failure of `peer` as a wait would report it (a failure notice
    /// from any rank, UCX's report of the peer, or the closed endpoints),
    /// if any; for waits that hold no request, such as a window's wait
    /// for a signal.
    pub(super) fn peer_failure(&mut self, peer: usize, what: &str) -> Option<Error> {
        if let Some(e) = self.noticed(what) {
            return Some(e);
        }
        if let Some(e) = &self.closed {
            return Some(e.clone());
        }
        let s = self.peers.get(peer)?.failure.load(Ordering::SeqCst);
        (s != UCS_OK).then(|| {
            Error::remote(format!(
                "ucx {what} on rank {}: peer rank {peer} failed or closed its connection ({})",
                self.rank,
                self.ucp.status_string(s)
            ))
        })
    }

    /// Progresses the worker until it has nothing more to do; true when
    /// it did something.
    pub(super) fn progress(&self) -> bool {
        let mut any = false;
        while self.progress_once() {
            any = true;
        }
        any
    }

    /// One progress call (over TCP, one epoll_wait): true when it did
    /// something.
    fn progress_once(&self) -> bool {
        // SAFETY: a live worker, used by this thread only.
        unsafe { (self.ucp.worker_progress)(self.worker) != 0 }
    }

    /// Sleeps until UCX has an event or [`SLEEP_MS`] passed; returns at
    /// once when events are pending (progress first). Called right after
    /// [`Worker::progress`] found nothing to do.
    fn sleep(&self, fd: c_int) {
        // SAFETY: a live worker, used by this thread only.
        match unsafe { (self.ucp.worker_arm)(self.worker) } {
            UCS_OK => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd. An interruption or error only
                // ends the sleep early.
                unsafe { libc::poll(&mut p, 1, SLEEP_MS) };
            }
            UCS_ERR_BUSY => {}
            _ => std::thread::yield_now(),
        }
    }

    /// Arms the worker's event file descriptor for a sleep that another
    /// thread may interrupt (the caller sleeps on it after releasing the
    /// worker): the descriptor, or None when events are pending (progress
    /// again) or UCX gave none.
    pub(super) fn arm(&self) -> Option<c_int> {
        let fd = self.event_fd?;
        // SAFETY: a live worker, used by this thread only (under the lock).
        (unsafe { (self.ucp.worker_arm)(self.worker) } == UCS_OK).then_some(fd)
    }

    /// Posts a send of `len` bytes at `buf` to `peer`.
    ///
    /// # Safety
    /// `buf` must stay valid for reads of `len` bytes until the request
    /// completes (see [`Worker::wait`]).
    pub unsafe fn send(&mut self, peer: usize, buf: *const u8, len: usize, tag: Tag) -> Request {
        let param = RequestParam::new();
        let p = match &self.closed {
            Some(_) => UCS_ERR_CANCELED as isize as StatusPtr,
            None => (self.ucp.tag_send_nbx)(self.eps[peer], buf as *const c_void, len, tag, &param),
        };
        Request::posted(p, peer, false)
    }

    /// Posts a receive of at most `len` bytes into `buf` of a message whose
    /// tag matches `tag` in the bits of `mask`, from `peer` (whose rank the
    /// tag carries).
    ///
    /// # Safety
    /// `buf` must stay valid for writes of `len` bytes until the request
    /// completes.
    pub unsafe fn recv(
        &mut self,
        peer: usize,
        buf: *mut u8,
        len: usize,
        (tag, mask): (Tag, Tag),
    ) -> Request {
        // Always a request, whose completion gives the sender's tag and
        // length (UCX 1.13 leaves the recv_info of an immediate completion
        // unset here).
        let mut param = RequestParam::new();
        param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        let p = match &self.closed {
            Some(_) => UCS_ERR_CANCELED as isize as StatusPtr,
            None => {
                (self.ucp.tag_recv_nbx)(self.worker, buf as *mut c_void, len, tag, mask, &param)
            }
        };
        Request::posted(p, peer, true)
    }

    /// An empty buffer for [`Worker::send_buffered`]: one a completed
    /// send left, where there is one.
    pub fn send_buffer(&mut self) -> Vec<u8> {
        let mut b = self.spare_sends.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Keeps the buffer of a completed buffered send for a later one.
    fn recycle_send(&mut self, b: Vec<u8>) {
        if self.spare_sends.len() < KEPT_BUFFERS && b.capacity() <= KEPT_BYTES {
            self.spare_sends.push(b);
        }
    }

    /// A receive buffer of at least `len` bytes: one kept from an earlier
    /// call where there is one (its old bytes still there), cleared only
    /// where it is new or grows.
    pub fn kept_buffer(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.kept.pop().unwrap_or_default();
        if b.len() < len {
            b.resize(len, 0);
        }
        b
    }

    /// Takes back a buffer of [`Worker::kept_buffer`] that UCX no longer
    /// writes.
    pub fn keep(&mut self, b: Vec<u8>) {
        if self.kept.len() < KEPT_BUFFERS && b.capacity() <= KEPT_BYTES {
            self.kept.push(b);
        }
    }

    /// Sends `bytes` to `peer`, completing once posted: UCX owns the copy
    /// until the peer took it (later waits progress it; [`Worker::flush`]
    /// waits for it).
    pub fn send_buffered(&mut self, peer: usize, bytes: Vec<u8>, tag: Tag) {
        // SAFETY: the bytes move into `buffered` with the request (a Vec's
        // heap buffer does not move with it).
        let request = unsafe { self.send(peer, bytes.as_ptr(), bytes.len(), tag) };
        self.buffered.push(BufferedSend { request, bytes });
    }

    /// Polls `r` once; true when it is complete.
    fn poll(&self, r: &mut Request) -> bool {
        if r.handle.is_null() {
            return true;
        }
        // SAFETY: a live request of this worker.
        let s = unsafe {
            match r.is_recv {
                true => (self.ucp.tag_recv_request_test)(r.handle, &mut r.info),
                false => (self.ucp.request_check_status)(r.handle),
            }
        };
        if s == UCS_INPROGRESS {
            return false;
        }
        unsafe { (self.ucp.request_free)(r.handle) };
        r.handle = std::ptr::null_mut();
        r.status = s;
        true
    }

    /// Waits until every request in `reqs` is complete, progressing the
    /// worker. Fails (and withdraws every request, see [`Worker::withdraw`])
    /// at the deadline, when `alive` fails (the comm was aborted or broken),
    /// when UCX reports a failed peer, or when a request fails.
    pub fn wait(
        &mut self,
        reqs: &mut [Request],
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
        what: &str,
    ) -> Result<()> {
        let mut spins = 0u32;
        let mut last_headway = Instant::now();
        loop {
            // One progress call, then the requests: the call that completes
            // the wait is not followed by one more that finds nothing.
            let headway = self.progress_once();
            if headway {
                last_headway = Instant::now();
            }
            let mut done = true;
            for r in reqs.iter_mut() {
                done &= self.poll(r);
            }
            let mut buffered = std::mem::take(&mut self.buffered);
            let mut i = 0;
            while i < buffered.len() {
                let b = &mut buffered[i];
                if self.poll(&mut b.request) && b.request.status >= 0 {
                    let done = buffered.swap_remove(i);
                    self.recycle_send(done.bytes);
                } else {
                    i += 1;
                }
            }
            self.buffered = buffered;
            // A completed operation stands even if a peer failed since.
            let failed = match done {
                true => None,
                false => self.noticed(what),
            }
            .or_else(|| self.failure(reqs, what, !done).err());
            let noticed =
                failed.is_some() && self.notice.as_ref().is_some_and(|n| n.handle.is_null());
            if done && failed.is_none() {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            let sleep = self.event_fd.filter(|_| last_headway.elapsed() >= SPIN_FOR);
            let stopped = match failed {
                Some(e) => Some(e),
                None if spins % 64 == 0 || sleep.is_some() => alive().err().or_else(|| {
                    d.passed().then(|| {
                        Error::timeout(format!(
                            "ucx {what} on rank {} timed out after {:?}; a peer is slow, \
                             stopped or gone",
                            self.rank,
                            d.timeout()
                        ))
                    })
                }),
                None => None,
            };
            if let Some(e) = stopped {
                // A rank told of a failure does not tell the others again:
                // the failed rank told every rank.
                self.withdraw_telling(reqs, &e, !noticed);
                return Err(e);
            }
            // While spinning, a rank whose peer (or the socket stack) waits
            // for this core lets it run; after headway more may be ready at
            // once.
            match sleep {
                Some(fd) => self.sleep(fd),
                None if headway => {}
                None => std::thread::yield_now(),
            }
        }
    }

    /// The error of a failed request, or (with `peers`) of a failed peer
    /// of a pending one, if any.
    fn failure(&self, reqs: &[Request], what: &str, peers: bool) -> Result<()> {
        if let Some(e) = &self.closed {
            return Err(e.clone());
        }
        let failed_request = reqs
            .iter()
            .chain(self.buffered.iter().map(|b| &b.request))
            .find(|r| r.status < 0);
        let failed_peer = reqs
            .iter()
            .filter(|r| peers && !r.handle.is_null())
            .find_map(|r| {
                // A receive from any source (posted as from this rank)
                // waits for every peer: any of them failing fails it.
                let any = r.is_recv && r.peer == self.rank;
                let of = match any {
                    true => 0..self.peers.len(),
                    false => r.peer..r.peer + 1,
                };
                of.filter(|q| !any || *q != self.rank).find_map(|q| {
                    let s = self.peers[q].failure.load(Ordering::SeqCst);
                    (s != UCS_OK).then_some((q, s))
                })
            });
        let (peer, status) = match (failed_peer, failed_request) {
            (Some(f), _) => f,
            (None, Some(r)) if r.status == UCS_ERR_MESSAGE_TRUNCATED => {
                return Err(Error::invalid_usage(format!(
                    "ucx {what} on rank {}: rank {} sent more bytes than this rank expects \
                     (the ranks called different operations or sizes)",
                    self.rank, r.peer
                )))
            }
            (None, Some(r)) => (r.peer, r.status),
            (None, None) => return Ok(()),
        };
        Err(Error::remote(format!(
            "ucx {what} on rank {}: peer rank {peer} failed or closed its connection ({})",
            self.rank,
            self.ucp.status_string(status)
        )))
    }

    /// The error of a failure notice received from a peer, if one came.
    fn noticed(&mut self, what: &str) -> Option<Error> {
        let mut n = self.notice.take()?;
        let done = self.poll(&mut n);
        let status = n.status;
        let (sender, length) = (super::sender_of(n.info.sender_tag), n.info.length);
        self.notice = Some(n);
        if !done || status != UCS_OK {
            return None;
        }
        let b = &self.notice_buf[..length.min(NOTICE_BYTES)];
        let message = String::from_utf8_lossy(b.get(8..).unwrap_or_default());
        Some(Error::remote(format!(
            "ucx {what} on rank {}: rank {sender} failed and told this rank: {message}",
            self.rank
        )))
    }

    /// After a failure: tells every peer (a failure notice, see
    /// [`Worker::noticed`]: every rank fails its operation now rather than
    /// at its timeout, whether or not it exchanges with this one or the
    /// failed one), cancels this rank's receives and closes every endpoint,
    /// then waits (briefly) until UCX let go of every buffer. The worker
    /// sends nothing more.
    pub fn withdraw(&mut self, reqs: &mut [Request], why: &Error) {
        self.withdraw_telling(reqs, why, true)
    }

    fn withdraw_telling(&mut self, reqs: &mut [Request], why: &Error, tell: bool) {
        if tell {
            self.tell_peers(why);
        }
        for r in reqs.iter().filter(|r| r.is_recv && !r.handle.is_null()) {
            // SAFETY: a live receive of this worker.
            unsafe { (self.ucp.request_cancel)(self.worker, r.handle) };
        }
        self.close_endpoints(why, true);
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            self.progress();
            let mut done = true;
            for r in reqs.iter_mut() {
                done &= self.poll(r);
            }
            if done || Instant::now() > until {
                break;
            }
        }
        // A request UCX still holds after that is handed back to it (it frees
        // it when done), so that the worker can be destroyed.
        for r in reqs.iter_mut() {
            self.release(r);
        }
    }

    /// Sends `why` as a failure notice to every peer not known to have
    /// failed, and waits (up to 500 ms) until UCX sent them.
    fn tell_peers(&mut self, why: &Error) {
        if self.closed.is_some() || self.eps.is_empty() {
            return;
        }
        let mut bytes = u64::MAX.to_ne_bytes().to_vec();
        let m = why.message.as_bytes();
        bytes.extend_from_slice(&m[..m.len().min(NOTICE_BYTES - 8)]);
        let me = self.rank;
        let mut sent = Vec::new();
        for p in (0..self.size).filter(|p| *p != me) {
            if self.peers[p].failure.load(Ordering::SeqCst) != UCS_OK {
                continue;
            }
            // SAFETY: `bytes` outlives every request (it is leaked below
            // when one is still pending).
            sent.push(unsafe { self.send(p, bytes.as_ptr(), bytes.len(), notice_tag(me)) });
        }
        let until = Instant::now() + Duration::from_millis(500);
        loop {
            self.progress();
            let mut done = true;
            for r in sent.iter_mut() {
                done &= self.poll(r);
            }
            if done || Instant::now() > until {
                break;
            }
        }
        if sent.iter().any(|r| !r.handle.is_null()) {
            // UCX may still read the bytes: they stay allocated.
            for r in sent.iter_mut() {
                self.release(r);
            }
            std::mem::forget(bytes);
        }
    }

    /// Closes every endpoint once: by force after a failure (the peers'
    /// error handlers fire now), else after flushing what is in flight.
    fn close_endpoints(&mut self, why: &Error, force: bool) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(Error::new(
            if why.kind == ErrorKind::InvalidUsage {
                ErrorKind::Remote
            } else {
                why.kind
            },
            format!(
                "ucx endpoints closed after an earlier failure: {}",
                why.message
            ),
        ));
        let mut param = RequestParam::new();
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = if force { UCP_EP_CLOSE_FLAG_FORCE } else { 0 };
        let mut closing = Vec::new();
        for ep in self.eps.drain(..) {
            // SAFETY: a live endpoint, closed once.
            let p = unsafe { (self.ucp.ep_close_nbx)(ep, &param) };
            if status_of_ptr(p) == UCS_INPROGRESS {
                closing.push(p);
            }
        }
        let until = Instant::now() + Duration::from_secs(1);
        while !closing.is_empty() && Instant::now() < until {
            self.progress();
            closing.retain(|p| {
                // SAFETY: live close requests.
                let s = unsafe { (self.ucp.request_check_status)(*p) };
                if s != UCS_INPROGRESS {
                    unsafe { (self.ucp.request_free)(*p) };
                }
                s == UCS_INPROGRESS
            });
        }
        for p in closing {
            // SAFETY: a live close request, released once.
            unsafe { (self.ucp.request_free)(p) };
        }
        let mut buffered = std::mem::take(&mut self.buffered);
        for b in &mut buffered {
            self.release(&mut b.request);
        }
        self.buffered = buffered;
    }

    /// Hands a request that may still be pending back to UCX, which frees
    /// it when it completes.
    fn release(&self, r: &mut Request) {
        if !r.handle.is_null() {
            // SAFETY: a live request of this worker, released once.
            unsafe { (self.ucp.request_free)(r.handle) };
            r.handle = std::ptr::null_mut();
        }
    }

    /// Waits until UCX completed every buffered send (an eager one is
    /// done once handed over, a rendezvous one once its receive was
    /// posted), bounded by `d` and `alive` like every wait.
    pub fn flush(&mut self, d: &Deadline, alive: &dyn Fn() -> Result<()>) -> Result<()> {
        // Sends that UCX completed as they were posted (small eager ones,
        // as a rule) need no wait, nor a progress call.
        let at_once = |b: &BufferedSend| b.request.handle.is_null() && b.request.status >= 0;
        if self.closed.is_none() && self.buffered.iter().all(at_once) {
            // Emptied in place: the list keeps its capacity for the next
            // call's sends.
            let mut buffered = std::mem::take(&mut self.buffered);
            for b in buffered.drain(..) {
                self.recycle_send(b.bytes);
            }
            self.buffered = buffered;
            return Ok(());
        }
        let buffered = std::mem::take(&mut self.buffered);
        let (mut reqs, bytes): (Vec<Request>, Vec<Vec<u8>>) =
            buffered.into_iter().map(|b| (b.request, b.bytes)).unzip();
        let r = self.wait(&mut reqs, d, alive, "point-to-point send");
        // The bytes stay alive until UCX let go of them (wait, or withdraw
        // on failure, released every request).
        if r.is_ok() {
            for b in bytes {
                self.recycle_send(b);
            }
        }
        r
    }
}

impl Request {
    pub(super) fn posted(p: StatusPtr, peer: usize, is_recv: bool) -> Request {
        let status = status_of_ptr(p);
        Request {
            handle: if status == UCS_INPROGRESS {
                p
            } else {
                std::ptr::null_mut()
            },
            peer,
            is_recv,
            status,
            info: TagRecvInfo::default(),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut n) = self.notice.take() {
            if !n.handle.is_null() {
                // SAFETY: a live receive of this worker; cancelled, it
                // completes at the next progress, then freed.
                unsafe { (self.ucp.request_cancel)(self.worker, n.handle) };
                self.progress();
                self.poll(&mut n);
                self.release(&mut n);
            }
        }
        self.close_endpoints(
            &Error::new(ErrorKind::Aborted, "the comm was destroyed"),
            false,
        );
        // SAFETY: destroyed once, after every endpoint; the peer slots
        // (error handler arguments) are dropped after this.
        unsafe {
            (self.ucp.worker_destroy)(self.worker);
            (self.ucp.cleanup)(self.context);
        }
    }
}

fn check(ucp: &Ucp, s: Status, what: &str) -> Result<()> {
    if s == UCS_OK {
        Ok(())
    } else {
        Err(Error::unavailable(format!(
            "{what} failed: {} (UCX {})",
            ucp.status_string(s),
            ucp.version
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::tcp_settings;

    #[test]
    fn tcp_settings_are_made_only_without_verbs_devices_nor_the_users_value() {
        let made = |has_verbs, user_set: &[&str]| {
            tcp_settings(65_592, has_verbs, |v| user_set.contains(&v))
                .into_iter()
                .map(|(key, value)| (key.to_str().unwrap().to_string(), value))
                .collect::<Vec<_>>()
        };
        let both = [
            ("RNDV_THRESH".to_string(), "65656".to_string()),
            ("RX_SEG_SIZE".to_string(), "1048576".to_string()),
        ];
        assert_eq!(made(false, &[]), both);
        assert_eq!(made(false, &["UCX_RNDV_THRESH"]), both[1..]);
        assert_eq!(made(false, &["UCX_TCP_RX_SEG_SIZE"]), both[..1]);
        assert!(made(true, &[]).is_empty());
    }
}
