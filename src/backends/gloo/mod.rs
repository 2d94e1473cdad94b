//! Host backend over Gloo (TCP transport): every operation on host memory.
//!
//! The Gloo calls live in a separate module, `libtorchcomm-gloo.so` (see
//! [`shim`]), loaded on first use so that programs that never use this
//! backend need no Gloo. Operations run one at a time on the comm's progress
//! thread, in issue order, so every rank allocates the same sequence of Gloo
//! tags (one per Gloo call, never reused while in flight).
//!
//! Safety rails around traps of this Gloo build:
//! - a size mismatch between ranks makes Gloo terminate the receiving
//!   process, so sizes are agreed before every transfer whose sizes could
//!   differ: a 16-byte (count, dtype) exchange precedes each point-to-point
//!   transfer, and the per-rank counts of the v-variants are all-gathered and
//!   compared first; with `TORCHCOMM_CHECK_COLLECTIVES=1` every collective
//!   first all-gathers (op, dtype, count, root, reduce op) and fails on all
//!   ranks, naming the rank that differs;
//! - without that check, ranks that call different collectives would send
//!   messages of the wrong size, which makes Gloo's network thread throw
//!   (uncatchable: the process terminates), or of the right size with the
//!   wrong meaning (silently wrong results): every Gloo tag of a collective
//!   carries a hash of its signature, so such ranks exchange nothing and
//!   fail at the timeout, told to enable the check (the shared-memory path
//!   checks every collective always, see [`intra_host`]);
//! - after a timeout or a vanished peer the context is closed (Gloo closes it
//!   on timeouts anyway), which makes the peers fail fast too; later
//!   operations fail at once;
//! - Gloo has no gatherv and no reduce-scatter: reduce-scatter is one
//!   all-to-all (block r to rank r) followed by a local reduction of the
//!   received blocks in rank order; the list forms go through contiguous
//!   scratch buffers.

mod intra_host;
pub mod reduce;
pub mod shim;
mod shm;
mod signature;
mod window;

use super::{Backend, BackendInit, WindowBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::op::{Op, P2p};
use crate::store::StoreRef;
use crate::types::{DType, PremulFactor, RedKind, ReduceOp};
use crate::util::{lock, overlaps, Deadline};
use reduce::Scale;
use signature::{
    describe_fingerprint, describe_sig, fingerprint, signature_words, tag_salt, CHECK_HINT,
    FAILED_ALONE, TAG_COUNTER_BITS,
};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// Creates the backend: loads the Gloo module, connects the full mesh
/// through the comm's store and agrees on settings with every peer.
pub fn create(init: BackendInit) -> Result<Box<dyn Backend>> {
    Ok(Box::new(GlooBackend::connect(init)?))
}

const SLOT_PREFIX_P2P: u64 = 0x40;
const SLOT_KIND_SENDER_DESC: u64 = 1;
const SLOT_KIND_RECEIVER_DESC: u64 = 2;
const SLOT_KIND_DATA: u64 = 3;
const HELLO_MAGIC: u64 = 0x7463_676c_6f6f_0001; // "tcgloo" v1
/// How long a rank whose operation timed out or lost a peer waits for the
/// other ranks' failure reports (see `GlooBackend::diagnose`). Together with
/// the thread start and store round trips it stays within the comm's
/// watchdog grace, so the diagnosis is part of the first error message.
const DIAGNOSIS_WINDOW: Duration = Duration::from_millis(400);

struct Seqs {
    /// Counts Gloo calls of collectives (the same on every rank): the low
    /// [`TAG_COUNTER_BITS`] of each call's tag.
    tag: u32,
    /// The rest of the tag: a hash of the running collective's signature
    /// (see [`tag_salt`]), 0 outside collectives.
    salt: u32,
    /// Next sequence number of a send to / receive from each peer.
    send: Vec<u64>,
    recv: Vec<u64>,
}

pub struct GlooBackend {
    rank: i32,
    size: i32,
    name: String,
    /// None for a world of one rank, where every operation is local.
    ctx: Option<shim::Context>,
    seqs: Mutex<Seqs>,
    /// Set once the context is unusable (peer failure, timeout, abort).
    broken: Mutex<Option<Error>>,
    check_collectives: bool,
    /// How each peer's address appears in this rank's Gloo messages (the
    /// peer's local address of its connection to this rank).
    peer_addresses: Vec<String>,
    /// The comm's store (scoped by its name), for failure reports.
    store: StoreRef,
    /// Operations run so far: the report of a failure names its number.
    ops_run: AtomicU64,
    /// Set by the first failure that was diagnosed.
    diagnosed: AtomicBool,
    /// Windows created so far (each rendezvouses under `window/<k>`).
    windows_made: AtomicU64,
    /// The address selection of the comm's context, reused by windows.
    hostname: Option<String>,
    iface: Option<String>,
    /// Memory from `tc_mem_alloc`, shared with same-host peers' windows.
    shared_memory: std::sync::Arc<shm::SharedAllocations>,
    /// Shared-memory collectives, when every rank is on this host.
    intra: Option<intra_host::IntraHost>,
}

// ---- store callbacks for the shim ------------------------------------------

fn write_err(err: *mut c_char, errlen: usize, msg: &str) {
    if err.is_null() || errlen == 0 {
        return;
    }
    let n = msg.len().min(errlen - 1);
    // SAFETY: err has errlen writable bytes (shim contract).
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err as *mut u8, n);
        *err.add(n) = 0;
    }
}

fn store_call(err: *mut c_char, errlen: usize, f: impl FnOnce() -> Result<()>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            write_err(err, errlen, &e.message);
            if e.kind == ErrorKind::Timeout {
                1
            } else {
                2
            }
        }
        Err(_) => {
            write_err(err, errlen, "panic in the store");
            2
        }
    }
}

unsafe fn key_str<'a>(key: *const c_char) -> Result<&'a str> {
    CStr::from_ptr(key)
        .to_str()
        .map_err(|_| Error::internal("store key is not UTF-8"))
}

unsafe extern "C" fn store_set(
    user: *mut c_void,
    key: *const c_char,
    data: *const c_void,
    len: usize,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    store_call(err, errlen, || {
        let store = &*(user as *const StoreRef);
        let value = if len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(data as *const u8, len)
        };
        store.set(key_str(key)?, value)
    })
}

unsafe extern "C" fn store_get(
    user: *mut c_void,
    key: *const c_char,
    sink: *mut c_void,
    put: shim::SinkFn,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    store_call(err, errlen, || {
        let store = &*(user as *const StoreRef);
        let v = store.get(key_str(key)?)?;
        put(sink, v.as_ptr() as *const c_void, v.len());
        Ok(())
    })
}

unsafe extern "C" fn store_wait(
    user: *mut c_void,
    keys: *const *const c_char,
    nkeys: usize,
    timeout_ms: i64,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    store_call(err, errlen, || {
        let store = &*(user as *const StoreRef);
        let mut ks = Vec::with_capacity(nkeys);
        for i in 0..nkeys {
            ks.push(key_str(*keys.add(i))?);
        }
        store.wait(&ks, Some(Duration::from_millis(timeout_ms.max(1) as u64)))
    })
}

// ---- helpers ----------------------------------------------------------------

/// 8-byte aligned scratch memory.
struct Scratch(Vec<u64>);

impl Scratch {
    fn new(bytes: usize) -> Scratch {
        Scratch(vec![0u64; bytes.div_ceil(8)])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

/// `bytes` at `input`, or a private copy of them when `needed` (the copy
/// must be kept alive while the returned pointer is used).
unsafe fn private_input(
    input: *const u8,
    bytes: usize,
    needed: bool,
) -> (Option<Scratch>, *const u8) {
    if !needed {
        return (None, input);
    }
    let mut c = Scratch::new(bytes);
    copy(c.ptr(), input, bytes);
    let p = c.ptr() as *const u8;
    (Some(c), p)
}

/// memmove of `n` bytes (no-op when equal or empty).
unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 && !std::ptr::eq(dst, src) {
        std::ptr::copy(src, dst, n);
    }
}

fn premul_factor(op: &ReduceOp, dtype: DType) -> Result<f64> {
    match op.factor {
        PremulFactor::Host(f) => Ok(f),
        PremulFactor::Pointer(p) => {
            if p.is_null() {
                return Err(Error::null_argument("op.premul_factor_ptr"));
            }
            // SAFETY: the caller passes one element of the op's dtype in host
            // memory (the only memory this backend handles).
            unsafe { reduce::read_scalar(dtype, p as *const u8) }
        }
    }
}

impl GlooBackend {
    fn connect(init: BackendInit) -> Result<GlooBackend> {
        let module = shim::module()?;
        let check = crate::config::config().check_collectives;
        let n = init.size as usize;
        let hint = |k: &str| {
            init.hints
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let hostname = hint("gloo.hostname").or_else(|| env("TORCHCOMM_GLOO_HOSTNAME"));
        let iface = hint("gloo.iface")
            .or_else(|| env("TORCHCOMM_GLOO_IFACE"))
            .or_else(|| env("GLOO_SOCKET_IFNAME"));
        let ctx = if init.size > 1 {
            let store: StoreRef = init.store.clone();
            let vt = shim::StoreVtable {
                user: &store as *const StoreRef as *mut c_void,
                set: store_set,
                get: store_get,
                wait: store_wait,
            };
            let ctx = shim::Context::new(
                module,
                init.rank,
                init.size,
                &vt,
                init.timeout,
                hostname.as_deref(),
                iface.as_deref(),
            )
            .map_err(|e| {
                Error::new(
                    e.kind(),
                    format!(
                        "gloo: connecting rank {} of {} for comm '{}': {}",
                        init.rank, init.size, init.name, e.message
                    ),
                )
            })?;
            Some(ctx)
        } else {
            None
        };
        let backend = GlooBackend {
            rank: init.rank,
            size: init.size,
            name: init.name.clone(),
            ctx,
            seqs: Mutex::new(Seqs {
                tag: 1,
                salt: 0,
                send: vec![0; n],
                recv: vec![0; n],
            }),
            broken: Mutex::new(None),
            check_collectives: check,
            peer_addresses: Vec::new(),
            store: init.store.clone(),
            ops_run: AtomicU64::new(0),
            diagnosed: AtomicBool::new(false),
            windows_made: AtomicU64::new(0),
            shared_memory: Default::default(),
            intra: None,
            hostname,
            iface,
        };
        let mut backend = backend;
        backend.hello(init.timeout)?;
        backend.peer_addresses = backend.exchange_addresses(init.timeout)?;
        if init.size > 1 {
            let deadline = Deadline::after(init.timeout);
            let label = format!("gloo comm '{}' rank {}/{}", init.name, init.rank, init.size);
            backend.intra = intra_host::IntraHost::setup(
                init.rank as usize,
                init.size as usize,
                &label,
                describe_fingerprint,
                &|words| {
                    backend.all_gather_words(words, &deadline, "connect (shared-memory setup)")
                },
            )?;
        }
        crate::log_info!(
            "gloo: comm '{}' rank {}/{} connected (module {})",
            init.name,
            init.rank,
            init.size,
            module.path
        );
        Ok(backend)
    }

    /// Every rank checks that its peers run the same module ABI and the same
    /// collective-check setting (a rank checking alone would desynchronise).
    fn hello(&self, timeout: Duration) -> Result<()> {
        let deadline = Deadline::after(timeout);
        let mine = [
            HELLO_MAGIC,
            self.check_collectives as u64,
            self.size as u64,
            0,
        ];
        let all = self.all_gather_words(&mine, &deadline, "connect")?;
        for (r, theirs) in all.chunks(4).enumerate() {
            if theirs[0] != HELLO_MAGIC || theirs[2] != self.size as u64 {
                return Err(Error::invalid_usage(format!(
                    "gloo: rank {r} runs an incompatible torchcomm gloo module"
                )));
            }
            if theirs[1] != mine[1] {
                return Err(Error::invalid_usage(format!(
                    "TORCHCOMM_CHECK_COLLECTIVES is {} on rank {} but {} on rank {r}: set it alike on every rank",
                    mine[1], self.rank, theirs[1]
                )));
            }
        }
        Ok(())
    }

    /// Every rank publishes the local address of each of its connections, so
    /// that a failure message naming an address can name the rank. (Gloo
    /// reports the listening address for connections this rank accepted
    /// from; the ephemeral port of a connection the peer initiated is not
    /// known, and such messages keep the bare address.)
    fn exchange_addresses(&self, timeout: Duration) -> Result<Vec<String>> {
        const WORDS: usize = 8; // 64 bytes per address
        let (n, me) = (self.size as usize, self.rank as usize);
        if n == 1 {
            return Ok(vec![String::new()]);
        }
        let mut mine = vec![0u64; n * WORDS];
        for j in (0..n).filter(|j| *j != me) {
            let a = self
                .ctx()
                .pair_address(j as i32)
                .map_err(|e| self.fail("connect", e))?;
            let bytes = a.as_bytes();
            let dst = unsafe {
                std::slice::from_raw_parts_mut(mine[j * WORDS..].as_mut_ptr() as *mut u8, WORDS * 8)
            };
            let len = bytes.len().min(WORDS * 8);
            dst[..len].copy_from_slice(&bytes[..len]);
        }
        let deadline = Deadline::after(timeout);
        let all = self.all_gather_words(&mine, &deadline, "connect")?;
        Ok((0..n)
            .map(|j| {
                let words = &all[(j * n + me) * WORDS..(j * n + me + 1) * WORDS];
                let bytes =
                    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, WORDS * 8) };
                let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
                String::from_utf8_lossy(&bytes[..end]).into_owned()
            })
            .collect())
    }

    /// The rank whose address the message names, if any.
    fn peer_in_message(&self, message: &str) -> Option<i32> {
        self.peer_addresses
            .iter()
            .position(|a| !a.is_empty() && message.contains(a.as_str()))
            .map(|j| j as i32)
    }

    fn next_tag(&self) -> u32 {
        let mut s = lock(&self.seqs);
        let t = s.tag | s.salt << TAG_COUNTER_BITS;
        s.tag = (s.tag + 1) % (1 << TAG_COUNTER_BITS);
        s.tag = s.tag.max(1);
        t
    }

    fn check_not_broken(&self) -> Result<()> {
        match &*lock(&self.broken) {
            None => Ok(()),
            Some(e) => Err(Error::new(
                if e.kind == ErrorKind::Aborted {
                    ErrorKind::Aborted
                } else {
                    e.kind
                },
                format!(
                    "gloo context of comm '{}' is unusable after an earlier failure: {}",
                    self.name, e.message
                ),
            )),
        }
    }

    /// Marks the context unusable and closes its connections, so that blocked
    /// peers fail now rather than at their timeout.
    fn mark_broken(&self, err: &Error) {
        let first = {
            let mut b = lock(&self.broken);
            let first = b.is_none();
            b.get_or_insert_with(|| err.clone());
            first
        };
        if first {
            if let Some(ctx) = &self.ctx {
                ctx.close();
            }
            if let Some(ih) = &self.intra {
                ih.wake_self();
            }
        }
    }

    /// Converts a shim failure of `what` into an error; failures that leave
    /// the context unusable break it.
    fn fail(&self, what: &str, e: shim::CallError) -> Error {
        let peer = e
            .peer
            .or_else(|| self.peer_in_message(&e.message))
            .map(|p| format!(" (peer rank {p})"))
            .unwrap_or_default();
        let kind = e.kind();
        let hint = match kind {
            ErrorKind::Timeout => "; a peer is slow, stopped or gone",
            ErrorKind::Remote => "; a peer failed or closed its connection",
            _ => "",
        };
        let err = Error::new(
            kind,
            format!(
                "gloo {what} on rank {}{peer}: {}{hint}",
                self.rank, e.message
            ),
        );
        if matches!(
            kind,
            ErrorKind::Timeout | ErrorKind::Remote | ErrorKind::Internal
        ) {
            self.mark_broken(&err);
        }
        err
    }

    /// After this rank's first timeout or lost connection, names the likely
    /// culprit: every rank that fails this way reports "operation number,
    /// name, kind" in the store, then waits up to [`DIAGNOSIS_WINDOW`] for
    /// the others' reports. Ranks that never report are stopped, hung, dead
    /// or not yet at this operation; ranks that failed in another operation
    /// are out of step. The store work runs on its own thread and
    /// connection, so a store host that is itself stopped costs no more
    /// than the window.
    fn diagnose(&self, op: &Op, seq: u64, kind: ErrorKind) -> String {
        let (me, n) = (self.rank as usize, self.size as usize);
        let store = self.store.clone();
        let op_name = op.name();
        let call = signature_words(op).map_or(op_name.to_string(), |w| describe_sig(&w));
        let mine = format!("{seq} {op_name} {kind:?} {call}");
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("tc-gloo-diag".into())
            .spawn(move || {
                let key = |r: usize| format!("failure_report/{r}");
                let collect = || -> Result<Vec<Option<String>>> {
                    let store = store.clone_store().unwrap_or(store);
                    store.set(&key(me), mine.as_bytes())?;
                    let deadline = Instant::now() + DIAGNOSIS_WINDOW;
                    let mut reports: Vec<Option<String>> = vec![None; n];
                    loop {
                        for (r, slot) in reports.iter_mut().enumerate() {
                            if r != me && slot.is_none() && store.check(&[&key(r)])? {
                                *slot = Some(
                                    String::from_utf8_lossy(&store.get(&key(r))?).into_owned(),
                                );
                            }
                        }
                        let missing = reports
                            .iter()
                            .enumerate()
                            .any(|(r, v)| r != me && v.is_none());
                        if !missing || Instant::now() >= deadline {
                            return Ok(reports);
                        }
                        std::thread::sleep(Duration::from_millis(40));
                    }
                };
                let _ = tx.send(collect());
            });
        if spawned.is_err() {
            return String::new();
        }
        let reports = match rx.recv_timeout(DIAGNOSIS_WINDOW + Duration::from_millis(150)) {
            Ok(Ok(reports)) => reports,
            Ok(Err(e)) => {
                return format!("; the other ranks' state is unknown (store: {})", e.message)
            }
            Err(_) => {
                return "; the other ranks' state is unknown (the store did not answer)".into()
            }
        };
        let list = |v: &[usize]| {
            let shown: Vec<String> = v.iter().take(8).map(|r| r.to_string()).collect();
            let more = if v.len() > 8 {
                format!(" and {} more", v.len() - 8)
            } else {
                String::new()
            };
            format!(
                "{} {}{more}",
                if v.len() == 1 { "rank" } else { "ranks" },
                shown.join(", ")
            )
        };
        let silent: Vec<usize> = (0..n)
            .filter(|r| *r != me && reports[*r].is_none())
            .collect();
        let mut parts = Vec::new();
        if !silent.is_empty() {
            parts.push(format!(
                "no failure report from {} within {} ms (stopped, hung, dead or not yet at operation #{seq})",
                list(&silent),
                DIAGNOSIS_WINDOW.as_millis()
            ));
        }
        for (r, report) in reports.iter().enumerate() {
            let Some(report) = report else { continue };
            let mut it = report.splitn(4, ' ');
            let (their_seq, their_op) = (it.next().unwrap_or("?"), it.next().unwrap_or("?"));
            let their_call = it.nth(1).unwrap_or("?");
            if their_seq != seq.to_string() {
                parts.push(format!("rank {r} failed in operation #{their_seq} ({their_op}) while this rank was at #{seq} ({op_name}): the ranks are out of step"));
            } else if their_call != call {
                parts.push(format!("rank {r} called {their_call} as operation #{seq}, this rank {call}: the ranks called different collectives"));
            }
        }
        if parts.is_empty() {
            return format!("; every other rank failed in the same operation (#{seq})");
        }
        format!("; {}", parts.join("; "))
    }

    fn ctx(&self) -> &shim::Context {
        self.ctx.as_ref().expect("gloo context exists for size > 1")
    }

    // ---- primitives (local fallbacks for one rank) ----------------------------

    fn all_gather_words(&self, mine: &[u64], d: &Deadline, what: &str) -> Result<Vec<u64>> {
        let n = self.size as usize;
        let mut all = vec![0u64; mine.len() * n];
        if n == 1 {
            all.copy_from_slice(mine);
            return Ok(all);
        }
        let tag = self.next_tag();
        let t = d.left()?;
        // SAFETY: both buffers are sized for the call.
        unsafe {
            self.ctx().allgather(
                mine.as_ptr() as *const u8,
                all.as_mut_ptr() as *mut u8,
                std::mem::size_of_val(mine),
                tag,
                t,
            )
        }
        .map_err(|e| self.fail(what, e))?;
        Ok(all)
    }

    unsafe fn g_allreduce(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        f: reduce::ReduceFn,
        d: &Deadline,
    ) -> Result<()> {
        if self.size == 1 || count == 0 {
            return Ok(());
        }
        let tag = self.next_tag();
        self.ctx()
            .allreduce(
                std::ptr::null(),
                buf,
                count,
                dtype.size(),
                f,
                tag,
                d.left()?,
            )
            .map_err(|e| self.fail("all_reduce", e))
    }

    // ---- checks -----------------------------------------------------------------

    fn check_collective(&self, op: &Op, d: &Deadline) -> Result<()> {
        let Some(sig) = signature_words(op) else {
            return Ok(());
        };
        let mine = [sig[0], sig[1], sig[2], sig[3], sig[4], 0, 0, 0];
        let all = self.all_gather_words(&mine, d, "collective check")?;
        let me = self.rank as usize;
        for (r, theirs) in all.chunks(8).enumerate() {
            if theirs != mine {
                return Err(Error::invalid_usage(format!(
                    "TORCHCOMM_CHECK_COLLECTIVES: rank {me} called {} but rank {r} called {}",
                    describe_sig(&mine),
                    describe_sig(theirs)
                )));
            }
        }
        Ok(())
    }

    /// All ranks must pass the same per-rank counts to a v-variant.
    fn agree_counts(&self, what: &str, counts: &[usize], d: &Deadline) -> Result<()> {
        let mine: Vec<u64> = counts.iter().map(|c| *c as u64).collect();
        let all = self.all_gather_words(&mine, d, what)?;
        for (r, theirs) in all.chunks(mine.len()).enumerate() {
            if theirs != mine.as_slice() {
                return Err(Error::invalid_usage(format!(
                    "{what}: ranks disagree on the per-rank counts: rank {} has {:?}, rank {r} has {:?}",
                    self.rank, mine, theirs
                )));
            }
        }
        Ok(())
    }

    // ---- operations -------------------------------------------------------------

    fn execute(&self, op: &Op, d: &Deadline) -> Result<()> {
        if self.check_collectives {
            self.check_collective(op, d)?;
        }
        if let Some(ih) = &self.intra {
            // SAFETY: as for `execute_gloo`.
            if let Some(result) = unsafe { self.intra_host_op(ih, op, d) } {
                // Ranks that failed mid-operation are out of step. Argument
                // errors come before any sync, and calls that differ are
                // found by all ranks at the same sync: those stay in step.
                return result.inspect_err(|e| {
                    if !matches!(
                        e.kind,
                        ErrorKind::InvalidUsage
                            | ErrorKind::InvalidArgument
                            | ErrorKind::Unsupported
                    ) {
                        self.mark_broken(e)
                    }
                });
            }
        }
        lock(&self.seqs).salt = tag_salt(op);
        let result = self.execute_gloo(op, d);
        lock(&self.seqs).salt = 0;
        result
    }

    /// `op` through Gloo, its tags carrying its salt (see [`tag_salt`]).
    fn execute_gloo(&self, op: &Op, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        // SAFETY (whole match): the comm validated every pointer against its
        // count, and the caller keeps the buffers alive until completion.
        unsafe {
            match op {
                Op::Send {
                    buf,
                    count,
                    dtype,
                    peer,
                } => self.p2p(
                    &[P2p {
                        is_send: true,
                        buf: *buf,
                        count: *count,
                        dtype: *dtype,
                        peer: *peer,
                    }],
                    d,
                ),
                Op::Recv {
                    buf,
                    count,
                    dtype,
                    peer,
                } => self.p2p(
                    &[P2p {
                        is_send: false,
                        buf: *buf,
                        count: *count,
                        dtype: *dtype,
                        peer: *peer,
                    }],
                    d,
                ),
                Op::Batch { ops } => self.p2p(ops, d),
                Op::Broadcast {
                    buf,
                    count,
                    dtype,
                    root,
                } => {
                    let bytes = count * dtype.size();
                    if n == 1 || bytes == 0 {
                        return Ok(());
                    }
                    let tag = self.next_tag();
                    self.ctx()
                        .broadcast(buf.as_u8(), bytes, *root, tag, d.left()?)
                        .map_err(|e| self.fail("broadcast", e))
                }
                Op::AllReduce {
                    buf,
                    count,
                    dtype,
                    op,
                } if self.sums_halves(*dtype, op.kind) && *count >= n => {
                    // A reduce-scatter (summing in f32, rounding once) and an
                    // all-gather: the data volume of a ring all-reduce, the
                    // precision of one rounding instead of one per rank.
                    let counts: Vec<usize> = (0..n)
                        .map(|r| *count / n + usize::from(r < *count % n))
                        .collect();
                    let es = dtype.size();
                    let offset = counts[..me].iter().sum::<usize>() * es;
                    self.reduce_scatter_blocks(
                        buf.as_u8(),
                        buf.as_u8().add(offset),
                        &counts,
                        *dtype,
                        op,
                        d,
                    )?;
                    let sizes: Vec<usize> = counts.iter().map(|c| c * es).collect();
                    let mut own = Scratch::new(sizes[me]);
                    copy(own.ptr(), buf.as_u8().add(offset), sizes[me]);
                    let tag = self.next_tag();
                    self.ctx()
                        .allgatherv(own.ptr(), buf.as_u8(), &sizes, tag, d.left()?)
                        .map_err(|e| self.fail("all_reduce", e))
                }
                Op::AllReduce {
                    buf,
                    count,
                    dtype,
                    op,
                } => {
                    let f = reduce::kernel(*dtype, op.kind)?;
                    if op.kind == RedKind::PremulSum {
                        let k = premul_factor(op, *dtype)?;
                        reduce::scale(*dtype, buf.as_u8(), buf.as_u8(), *count, Scale::Mul(k))?;
                    }
                    self.g_allreduce(buf.as_u8(), *count, *dtype, f, d)?;
                    if op.kind == RedKind::Avg {
                        reduce::scale(
                            *dtype,
                            buf.as_u8(),
                            buf.as_u8(),
                            *count,
                            Scale::Div(n as u64),
                        )?;
                    }
                    Ok(())
                }
                Op::Reduce {
                    buf,
                    count,
                    dtype,
                    root,
                    op,
                } if self.sums_halves(*dtype, op.kind) && *count >= n => {
                    self.reduce_halves(buf.as_u8(), *count, *dtype, *root, op, d)
                }
                Op::Reduce {
                    buf,
                    count,
                    dtype,
                    root,
                    op,
                } => self.reduce(buf.as_u8(), *count, *dtype, *root, op, d),
                Op::AllGather {
                    outputs,
                    input,
                    count,
                    dtype,
                } => {
                    let bytes = count * dtype.size();
                    let mut tmp = Scratch::new(bytes * n);
                    self.all_gather_into(input.as_u8(), tmp.ptr(), bytes, d)?;
                    for (r, out) in outputs.iter().enumerate() {
                        copy(out.as_u8(), tmp.ptr().add(r * bytes), bytes);
                    }
                    Ok(())
                }
                Op::AllGatherSingle {
                    output,
                    input,
                    count,
                    dtype,
                } => {
                    let bytes = count * dtype.size();
                    let out = output.as_u8();
                    if input.as_u8() == out.add(me * bytes) {
                        self.all_gather_into(std::ptr::null(), out, bytes, d)
                    } else if overlaps(input.as_u8(), bytes, out, bytes * n) {
                        let mut tmp = Scratch::new(bytes);
                        copy(tmp.ptr(), input.as_u8(), bytes);
                        self.all_gather_into(tmp.ptr(), out, bytes, d)
                    } else {
                        self.all_gather_into(input.as_u8(), out, bytes, d)
                    }
                }
                Op::AllGatherV {
                    output,
                    input,
                    counts,
                    dtype,
                } => {
                    self.agree_counts("all_gather_v", counts, d)?;
                    let es = dtype.size();
                    let sizes: Vec<usize> = counts.iter().map(|c| c * es).collect();
                    let total: usize = sizes.iter().sum();
                    let mine = sizes[me];
                    let out = output.as_u8();
                    if n == 1 {
                        copy(out, input.as_u8(), mine);
                        return Ok(());
                    }
                    if total == 0 {
                        return Ok(());
                    }
                    let mut tmp = Scratch::new(mine);
                    copy(tmp.ptr(), input.as_u8(), mine);
                    let tag = self.next_tag();
                    self.ctx()
                        .allgatherv(tmp.ptr(), out, &sizes, tag, d.left()?)
                        .map_err(|e| self.fail("all_gather_v", e))?;
                    Ok(())
                }
                Op::ReduceScatter {
                    output,
                    inputs,
                    count,
                    dtype,
                    op,
                } => {
                    let bytes = count * dtype.size();
                    let mut tmp = Scratch::new(bytes * n);
                    for (r, p) in inputs.iter().enumerate() {
                        copy(tmp.ptr().add(r * bytes), p.as_u8(), bytes);
                    }
                    self.reduce_scatter_blocks(
                        tmp.ptr(),
                        output.as_u8(),
                        &vec![*count; n],
                        *dtype,
                        op,
                        d,
                    )
                }
                Op::ReduceScatterSingle {
                    output,
                    input,
                    count,
                    dtype,
                    op,
                } => self.reduce_scatter_blocks(
                    input.as_u8(),
                    output.as_u8(),
                    &vec![*count; n],
                    *dtype,
                    op,
                    d,
                ),
                Op::ReduceScatterV {
                    output,
                    input,
                    counts,
                    dtype,
                    op,
                } => {
                    self.agree_counts("reduce_scatter_v", counts, d)?;
                    self.reduce_scatter_blocks(input.as_u8(), output.as_u8(), counts, *dtype, op, d)
                }
                Op::AllToAll {
                    outputs,
                    inputs,
                    count,
                    dtype,
                } => {
                    let bytes = count * dtype.size();
                    let mut tin = Scratch::new(bytes * n);
                    let mut tout = Scratch::new(bytes * n);
                    for (r, p) in inputs.iter().enumerate() {
                        copy(tin.ptr().add(r * bytes), p.as_u8(), bytes);
                    }
                    self.all_to_all(tin.ptr(), tout.ptr(), bytes, d)?;
                    for (r, p) in outputs.iter().enumerate() {
                        copy(p.as_u8(), tout.ptr().add(r * bytes), bytes);
                    }
                    Ok(())
                }
                Op::AllToAllSingle {
                    output,
                    input,
                    count,
                    dtype,
                } => {
                    let bytes = count * dtype.size();
                    if overlaps(input.as_u8(), bytes * n, output.as_u8(), bytes * n) {
                        let mut tin = Scratch::new(bytes * n);
                        copy(tin.ptr(), input.as_u8(), bytes * n);
                        self.all_to_all(tin.ptr(), output.as_u8(), bytes, d)
                    } else {
                        self.all_to_all(input.as_u8(), output.as_u8(), bytes, d)
                    }
                }
                Op::AllToAllVSingle {
                    output,
                    output_counts,
                    input,
                    input_counts,
                    dtype,
                } => self.all_to_all_v(
                    output.as_u8(),
                    output_counts,
                    input.as_u8(),
                    input_counts,
                    *dtype,
                    d,
                ),
                Op::Barrier => {
                    if n == 1 {
                        return Ok(());
                    }
                    let tag = self.next_tag();
                    self.ctx()
                        .barrier(tag, d.left()?)
                        .map_err(|e| self.fail("barrier", e))
                }
                Op::Scatter {
                    output,
                    inputs,
                    count,
                    dtype,
                    root,
                } => {
                    let bytes = count * dtype.size();
                    if n == 1 {
                        copy(output.as_u8(), inputs[0].as_u8(), bytes);
                        return Ok(());
                    }
                    if bytes == 0 {
                        return Ok(());
                    }
                    let mut ins: Vec<*const u8> = Vec::new();
                    let mut own = Scratch::new(0);
                    if self.rank == *root {
                        ins = inputs.iter().map(|p| p.as_u8() as *const u8).collect();
                        if overlaps(ins[me], bytes, output.as_u8(), bytes) {
                            own = Scratch::new(bytes);
                            copy(own.ptr(), ins[me], bytes);
                            ins[me] = own.ptr();
                        }
                    }
                    let tag = self.next_tag();
                    let r = self
                        .ctx()
                        .scatter(&ins, output.as_u8(), bytes, *root, tag, d.left()?)
                        .map_err(|e| self.fail("scatter", e));
                    drop(own);
                    r
                }
                Op::Gather {
                    outputs,
                    input,
                    count,
                    dtype,
                    root,
                } => {
                    let bytes = count * dtype.size();
                    if n == 1 {
                        copy(outputs[0].as_u8(), input.as_u8(), bytes);
                        return Ok(());
                    }
                    if bytes == 0 {
                        return Ok(());
                    }
                    let is_root = self.rank == *root;
                    let mut tmp = Scratch::new(if is_root { bytes * n } else { 0 });
                    let tag = self.next_tag();
                    self.ctx()
                        .gather(input.as_u8(), tmp.ptr(), bytes, *root, tag, d.left()?)
                        .map_err(|e| self.fail("gather", e))?;
                    if is_root {
                        for (r, p) in outputs.iter().enumerate() {
                            copy(p.as_u8(), tmp.ptr().add(r * bytes), bytes);
                        }
                    }
                    Ok(())
                }
            }
        }
    }

    /// float16/bfloat16 sums (and AVG, PREMUL_SUM) over several ranks, which
    /// this backend accumulates in f32.
    /// Runs `op` through shared memory (see [`intra_host`]) when that path
    /// takes it; None sends it to Gloo. The choice depends only on the
    /// operation's kind, never on this rank's buffers, so every rank makes
    /// the same one: buffers that overlap in a way the chunked copies would
    /// break go through a private copy instead.
    ///
    /// # Safety
    /// The comm validated the operation's buffers against its counts.
    unsafe fn intra_host_op(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        d: &Deadline,
    ) -> Option<Result<()>> {
        let alive = || self.check_not_broken();
        // The operation's first sync publishes and checks its fingerprint.
        let first = std::cell::Cell::new(fingerprint(op));
        let sync = |what: &str| ih.sync(what, first.take().as_ref(), d, &alive);
        let result = self.intra_host_dispatch(ih, op, &sync)?;
        // An operation that never synced (nothing to move, or an error
        // before its first transfer) still meets the other ranks' first
        // sync, so that they stay in step and see a mismatch; an error
        // shows as a call of its own that fails every rank.
        if let Some(fp) = first.take() {
            let fp = match result {
                Ok(()) => fp,
                Err(_) => signature::Fingerprint {
                    op: FAILED_ALONE,
                    ..Default::default()
                },
            };
            let synced = ih.sync(op.name(), Some(&fp), d, &alive);
            return Some(result.and(synced));
        }
        Some(result)
    }

    /// The shared-memory form of `op`, if it has one. `sync` must be the
    /// first thing every form synchronises through.
    ///
    /// # Safety
    /// As for [`GlooBackend::intra_host_op`].
    unsafe fn intra_host_dispatch(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        sync: &intra_host::SyncAll,
    ) -> Option<Result<()>> {
        let (n, me) = (ih.size(), ih.rank());
        let reduction = |dtype: DType, op: &ReduceOp| -> Result<intra_host::Reduction> {
            Ok(intra_host::Reduction {
                dtype,
                f: reduce::kernel(dtype, op.kind)?,
                premul: if op.kind == RedKind::PremulSum {
                    Some(premul_factor(op, dtype)?)
                } else {
                    None
                },
                avg: op.kind == RedKind::Avg,
                halves: self.sums_halves(dtype, op.kind),
            })
        };
        match op {
            Op::Barrier => Some(sync("barrier")),
            Op::Broadcast {
                buf,
                count,
                dtype,
                root,
            } => Some(ih.broadcast(buf.as_u8(), count * dtype.size(), *root as usize, sync)),
            Op::AllReduce {
                buf,
                count,
                dtype,
                op,
            } => Some(
                reduction(*dtype, op).and_then(|r| ih.reduce(buf.as_u8(), *count, &r, None, sync)),
            ),
            Op::Reduce {
                buf,
                count,
                dtype,
                root,
                op,
            } => Some(
                reduction(*dtype, op)
                    .and_then(|r| ih.reduce(buf.as_u8(), *count, &r, Some(*root as usize), sync)),
            ),
            Op::AllGatherSingle {
                output,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let out = output.as_u8();
                // Later chunks read the input after earlier ones wrote the
                // output: fine in place or apart, else read a copy.
                let in_place = std::ptr::eq(input.as_u8(), out.add(me * bytes));
                let (_copy, input) = private_input(
                    input.as_u8(),
                    bytes,
                    !in_place && overlaps(input.as_u8(), bytes, out, bytes * n),
                );
                Some(ih.all_gather(out, input, bytes, sync))
            }
            Op::ReduceScatterSingle {
                output,
                input,
                count,
                dtype,
                op,
            } => {
                let (es, out) = (dtype.size(), output.as_u8());
                let in_place = std::ptr::eq(out, input.as_u8().add(me * count * es));
                let clash = !in_place && overlaps(input.as_u8(), count * es * n, out, count * es);
                let (_copy, input) = private_input(input.as_u8(), count * es * n, clash);
                Some(
                    reduction(*dtype, op)
                        .and_then(|r| ih.reduce_scatter(out, input, *count, &r, sync)),
                )
            }
            Op::AllToAllSingle {
                output,
                input,
                count,
                dtype,
            } => {
                let (block, out) = (count * dtype.size(), output.as_u8());
                // Each chunk is read whole before any of it is written.
                let clash = !std::ptr::eq(out, input.as_u8())
                    && overlaps(input.as_u8(), block * n, out, block * n);
                let (_copy, input) = private_input(input.as_u8(), block * n, clash);
                Some(ih.all_to_all(out, input, block, sync))
            }
            Op::AllGather {
                outputs,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let mut all = Scratch::new(bytes * n);
                Some(
                    ih.all_gather(all.ptr(), input.as_u8(), bytes, sync)
                        .map(|()| {
                            for (r, out) in outputs.iter().enumerate() {
                                copy(out.as_u8(), all.ptr().add(r * bytes), bytes);
                            }
                        }),
                )
            }
            Op::ReduceScatter {
                output,
                inputs,
                count,
                dtype,
                op,
            } => {
                let bytes = count * dtype.size();
                let mut packed = Scratch::new(bytes * n);
                for (r, p) in inputs.iter().enumerate() {
                    copy(packed.ptr().add(r * bytes), p.as_u8(), bytes);
                }
                Some(reduction(*dtype, op).and_then(|r| {
                    ih.reduce_scatter(output.as_u8(), packed.ptr(), *count, &r, sync)
                }))
            }
            Op::AllToAll {
                outputs,
                inputs,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let (mut packed, mut received) = (Scratch::new(bytes * n), Scratch::new(bytes * n));
                for (r, p) in inputs.iter().enumerate() {
                    copy(packed.ptr().add(r * bytes), p.as_u8(), bytes);
                }
                Some(
                    ih.all_to_all(received.ptr(), packed.ptr(), bytes, sync)
                        .map(|()| {
                            for (r, out) in outputs.iter().enumerate() {
                                copy(out.as_u8(), received.ptr().add(r * bytes), bytes);
                            }
                        }),
                )
            }
            Op::AllGatherV {
                output,
                input,
                counts,
                dtype,
            } => {
                let es = dtype.size();
                let (total, before) = (
                    counts.iter().sum::<usize>(),
                    counts[..me].iter().sum::<usize>(),
                );
                let in_place = std::ptr::eq(input.as_u8(), output.as_u8().add(before * es));
                let clash = !in_place
                    && overlaps(input.as_u8(), counts[me] * es, output.as_u8(), total * es);
                let (_copy, input) = private_input(input.as_u8(), counts[me] * es, clash);
                Some(ih.all_gather_v(output.as_u8(), input, counts, es, sync))
            }
            Op::ReduceScatterV {
                output,
                input,
                counts,
                dtype,
                op,
            } => {
                let (es, out) = (dtype.size(), output.as_u8());
                let (total, before) = (
                    counts.iter().sum::<usize>(),
                    counts[..me].iter().sum::<usize>(),
                );
                let in_place = std::ptr::eq(out, input.as_u8().add(before * es));
                let clash = !in_place && overlaps(input.as_u8(), total * es, out, counts[me] * es);
                let (_copy, input) = private_input(input.as_u8(), total * es, clash);
                Some(
                    reduction(*dtype, op)
                        .and_then(|r| ih.reduce_scatter_v(out, input, counts, &r, sync)),
                )
            }
            Op::AllToAllVSingle {
                output,
                output_counts,
                input,
                input_counts,
                dtype,
            } => {
                let es = dtype.size();
                let (in_total, out_total) = (
                    input_counts.iter().sum::<usize>(),
                    output_counts.iter().sum::<usize>(),
                );
                // In place with the same splits, each chunk is read before it
                // is written; any other overlap reads a copy.
                let same_layout = output.0 == input.0 && input_counts == output_counts;
                let clash = !same_layout
                    && overlaps(input.as_u8(), in_total * es, output.as_u8(), out_total * es);
                let (_copy, input) = private_input(input.as_u8(), in_total * es, clash);
                Some(ih.all_to_all_v(output.as_u8(), output_counts, input, input_counts, es, sync))
            }
            Op::Gather {
                outputs,
                input,
                count,
                dtype,
                root,
            } => {
                let bytes = count * dtype.size();
                // The root writes outputs while later chunks of its input are
                // still to be read: its own block in place, or apart, or a copy.
                let clash = outputs.iter().enumerate().any(|(r, o)| {
                    overlaps(input.as_u8(), bytes, o.as_u8(), bytes) && !(r == me && o.0 == input.0)
                });
                let (_copy, input) = private_input(input.as_u8(), bytes, clash);
                let outs: Vec<*mut u8> = outputs.iter().map(|o| o.as_u8()).collect();
                Some(ih.gather(&outs, input, bytes, *root as usize, sync))
            }
            Op::Scatter {
                output,
                inputs,
                count,
                dtype,
                root,
            } => {
                let bytes = count * dtype.size();
                // The root's output written while later chunks of its inputs
                // are still to be read: received into a copy instead.
                let clash = inputs.iter().enumerate().any(|(r, i)| {
                    overlaps(i.as_u8(), bytes, output.as_u8(), bytes)
                        && !(r == me && i.0 == output.0)
                });
                let mut landing = Scratch::new(if clash { bytes } else { 0 });
                let out = if clash { landing.ptr() } else { output.as_u8() };
                let ins: Vec<*const u8> = inputs.iter().map(|i| i.as_u8() as *const u8).collect();
                Some(
                    ih.scatter(out, &ins, bytes, *root as usize, sync)
                        .map(|()| {
                            if clash {
                                copy(output.as_u8(), landing.ptr(), bytes);
                            }
                        }),
                )
            }
            _ => None,
        }
    }

    fn sums_halves(&self, dtype: DType, kind: RedKind) -> bool {
        self.size > 1
            && matches!(dtype, DType::F16 | DType::BF16)
            && matches!(kind, RedKind::Sum | RedKind::Avg | RedKind::PremulSum)
    }

    /// All-gather of `bytes` per rank into `out`; `input` NULL means the
    /// caller's block is already in place.
    unsafe fn all_gather_into(
        &self,
        input: *const u8,
        out: *mut u8,
        bytes: usize,
        d: &Deadline,
    ) -> Result<()> {
        let me = self.rank as usize;
        if self.size == 1 || bytes == 0 {
            if !input.is_null() {
                copy(out.add(me * bytes), input, bytes);
            }
            return Ok(());
        }
        let tag = self.next_tag();
        self.ctx()
            .allgather(input, out, bytes, tag, d.left()?)
            .map_err(|e| self.fail("all_gather", e))
    }

    unsafe fn all_to_all(
        &self,
        input: *const u8,
        out: *mut u8,
        bytes: usize,
        d: &Deadline,
    ) -> Result<()> {
        if self.size == 1 {
            copy(out, input, bytes);
            return Ok(());
        }
        if bytes == 0 {
            return Ok(());
        }
        let tag = self.next_tag();
        self.ctx()
            .alltoall(input, out, bytes, tag, d.left()?)
            .map_err(|e| self.fail("all_to_all", e))
    }

    unsafe fn all_to_all_v(
        &self,
        out: *mut u8,
        out_counts: &[usize],
        input: *const u8,
        in_counts: &[usize],
        dtype: DType,
        d: &Deadline,
    ) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        // Every rank learns every rank's splits, so all find any mismatch.
        let mut mine: Vec<u64> = in_counts.iter().map(|c| *c as u64).collect();
        mine.extend(out_counts.iter().map(|c| *c as u64));
        let all = self.all_gather_words(&mine, d, "all_to_all_v_single split exchange")?;
        let row = |r: usize| &all[r * 2 * n..(r + 1) * 2 * n];
        for src in 0..n {
            for dst in 0..n {
                let sent = row(src)[dst];
                let expected = row(dst)[n + src];
                if sent != expected {
                    return Err(Error::invalid_usage(format!(
                        "all_to_all_v_single: rank {src} sends {sent} elements to rank {dst}, which expects {expected} from it \
                         (seen from rank {me})"
                    )));
                }
            }
        }
        let es = dtype.size();
        let in_bytes: Vec<usize> = in_counts.iter().map(|c| c * es).collect();
        let out_bytes: Vec<usize> = out_counts.iter().map(|c| c * es).collect();
        let in_total: usize = in_bytes.iter().sum();
        let out_total: usize = out_bytes.iter().sum();
        if n == 1 {
            copy(out, input, in_total);
            return Ok(());
        }
        let grand_total: u64 = all.chunks(2 * n).map(|r| r[..n].iter().sum::<u64>()).sum();
        if grand_total == 0 {
            return Ok(());
        }
        let mut tin = Scratch::new(0);
        let mut input = input;
        if overlaps(input, in_total, out, out_total) {
            tin = Scratch::new(in_total);
            copy(tin.ptr(), input, in_total);
            input = tin.ptr();
        }
        let tag = self.next_tag();
        let r = self
            .ctx()
            .alltoallv(input, &in_bytes, out, &out_bytes, tag, d.left()?)
            .map_err(|e| self.fail("all_to_all_v_single", e));
        drop(tin);
        r
    }

    /// Reduce-scatter of `input` (blocks of `counts[r]` elements in rank
    /// order) into this rank's block at `output`: every rank sends block `r`
    /// straight to rank `r` in one all-to-all, and each rank reduces the
    /// blocks it received in rank order. Each rank sends (n-1)/n of its input
    /// once, half of what an all-reduce moves. float16/bfloat16 sums
    /// accumulate in f32 and round once. `output` may lie inside `input` (in
    /// place): it is written only after the exchange.
    unsafe fn reduce_scatter_blocks(
        &self,
        input: *const u8,
        output: *mut u8,
        counts: &[usize],
        dtype: DType,
        op: &ReduceOp,
        d: &Deadline,
    ) -> Result<()> {
        let (n, me) = (self.size as usize, self.rank as usize);
        let es = dtype.size();
        let f = reduce::kernel(dtype, op.kind)?;
        let total: usize = counts.iter().sum();
        let mine = counts[me];
        let mut input = input;
        // PREMUL_SUM scales each rank's own contribution before the sum; the
        // caller's input stays untouched.
        let mut scaled = Scratch::new(0);
        if op.kind == RedKind::PremulSum {
            let k = premul_factor(op, dtype)?;
            scaled = Scratch::new(total * es);
            reduce::scale(dtype, scaled.ptr(), input, total, Scale::Mul(k))?;
            input = scaled.ptr();
        }
        let offset = counts[..me].iter().sum::<usize>() * es;
        if n == 1 || total == 0 {
            if mine > 0 && !std::ptr::eq(output, input.add(offset)) {
                copy(output, input.add(offset), mine * es);
            }
            return Ok(());
        }
        let in_bytes: Vec<usize> = counts.iter().map(|c| c * es).collect();
        let out_bytes = vec![mine * es; n];
        let mut received = Scratch::new(mine * es * n);
        let tag = self.next_tag();
        self.ctx()
            .alltoallv(input, &in_bytes, received.ptr(), &out_bytes, tag, d.left()?)
            .map_err(|e| self.fail("reduce_scatter", e))?;
        drop(scaled);
        if mine == 0 {
            return Ok(());
        }
        let is_sum = matches!(op.kind, RedKind::Sum | RedKind::Avg | RedKind::PremulSum);
        let divide = (op.kind == RedKind::Avg).then_some(n as u64);
        if is_sum && reduce::sum_half_blocks(dtype, output, received.ptr(), n, mine, divide) {
            return Ok(());
        }
        let block = mine * es;
        copy(output, received.ptr(), block);
        for r in 1..n {
            f(
                output as *mut c_void,
                output as *const c_void,
                received.ptr().add(r * block) as *const c_void,
                mine,
            );
        }
        if let Some(k) = divide {
            reduce::scale(dtype, output, output, mine, Scale::Div(k))?;
        }
        Ok(())
    }

    /// Reduce of float16/bfloat16 sums: a reduce-scatter (summing in f32,
    /// rounding once) into scratch, then a gather of the blocks to the root
    /// (padded to the largest block: Gloo's gather takes equal sizes).
    unsafe fn reduce_halves(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        root: i32,
        op: &ReduceOp,
        d: &Deadline,
    ) -> Result<()> {
        let n = self.size as usize;
        let es = dtype.size();
        let counts: Vec<usize> = (0..n)
            .map(|r| count / n + usize::from(r < count % n))
            .collect();
        let padded = counts[0] * es;
        let mut own = Scratch::new(padded);
        self.reduce_scatter_blocks(buf, own.ptr(), &counts, dtype, op, d)?;
        let is_root = self.rank == root;
        let mut all = Scratch::new(if is_root { padded * n } else { 0 });
        let tag = self.next_tag();
        self.ctx()
            .gather(own.ptr(), all.ptr(), padded, root, tag, d.left()?)
            .map_err(|e| self.fail("reduce", e))?;
        if is_root {
            let mut offset = 0;
            for (r, c) in counts.iter().enumerate() {
                copy(buf.add(offset), all.ptr().add(r * padded), c * es);
                offset += c * es;
            }
        }
        Ok(())
    }

    unsafe fn reduce(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        root: i32,
        op: &ReduceOp,
        d: &Deadline,
    ) -> Result<()> {
        let f = reduce::kernel(dtype, op.kind)?;
        let bytes = count * dtype.size();
        let is_root = self.rank == root;
        let mut scaled = Scratch::new(0);
        let mut input: *const u8 = buf;
        if op.kind == RedKind::PremulSum {
            let k = premul_factor(op, dtype)?;
            if is_root {
                reduce::scale(dtype, buf, buf, count, Scale::Mul(k))?;
            } else {
                scaled = Scratch::new(bytes);
                reduce::scale(dtype, scaled.ptr(), buf, count, Scale::Mul(k))?;
                input = scaled.ptr();
            }
        }
        if self.size > 1 && count > 0 {
            // Gloo's reduce writes partial results into the output on every
            // rank: give non-roots scratch so their buffer stays untouched.
            let mut out_tmp = Scratch::new(if is_root { 0 } else { bytes });
            let out = if is_root { buf } else { out_tmp.ptr() };
            let inp = if std::ptr::eq(input, out) {
                std::ptr::null()
            } else {
                input
            };
            let tag = self.next_tag();
            self.ctx()
                .reduce(inp, out, count, dtype.size(), root, f, tag, d.left()?)
                .map_err(|e| self.fail("reduce", e))?;
        }
        if is_root && op.kind == RedKind::Avg {
            reduce::scale(dtype, buf, buf, count, Scale::Div(self.size as u64))?;
        }
        drop(scaled);
        Ok(())
    }

    fn slot(kind: u64, seq: u64) -> u64 {
        (SLOT_PREFIX_P2P << 56) | (kind << 48) | (seq & 0xffff_ffff_ffff)
    }

    /// Point-to-point transfers issued together: first each transfer's
    /// (count, dtype) is exchanged with its peer, then the data of every
    /// transfer whose sides agree moves; disagreeing transfers fail on both
    /// sides without touching Gloo's data path.
    unsafe fn p2p(&self, ops: &[P2p], d: &Deadline) -> Result<()> {
        let me = self.rank;
        // Transfers to self pair up in order, like messages between ranks.
        let local_sends: Vec<&P2p> = ops.iter().filter(|o| o.peer == me && o.is_send).collect();
        let local_recvs: Vec<&P2p> = ops.iter().filter(|o| o.peer == me && !o.is_send).collect();
        let mut errors: Vec<String> = Vec::new();
        if local_sends.len() != local_recvs.len() {
            errors.push(format!(
                "{} sends to self but {} receives from self in one batch",
                local_sends.len(),
                local_recvs.len()
            ));
        } else {
            for (s, r) in local_sends.iter().zip(&local_recvs) {
                if s.count != r.count || s.dtype != r.dtype {
                    errors.push(format!(
                        "send of {} {} to self does not match the receive of {} {}",
                        s.count,
                        s.dtype.name(),
                        r.count,
                        r.dtype.name()
                    ));
                } else {
                    copy(r.buf.as_u8(), s.buf.as_u8(), s.count * s.dtype.size());
                }
            }
        }
        let remote: Vec<&P2p> = ops.iter().filter(|o| o.peer != me).collect();
        if remote.is_empty() {
            return if errors.is_empty() {
                Ok(())
            } else {
                Err(Error::invalid_usage(errors.join("; ")))
            };
        }
        self.check_not_broken()?;
        // Sequence numbers per peer and direction.
        let seqs: Vec<u64> = {
            let mut s = lock(&self.seqs);
            remote
                .iter()
                .map(|o| {
                    let v = if o.is_send { &mut s.send } else { &mut s.recv };
                    let q = v[o.peer as usize];
                    v[o.peer as usize] += 1;
                    q
                })
                .collect()
        };
        let mut my_desc: Vec<[u64; 2]> = remote
            .iter()
            .map(|o| [o.count as u64, o.dtype.to_c() as u64])
            .collect();
        let mut their_desc: Vec<[u64; 2]> = vec![[u64::MAX; 2]; remote.len()];
        let mut transfers = Vec::with_capacity(remote.len() * 2);
        for (i, o) in remote.iter().enumerate() {
            let (mine_kind, theirs_kind) = if o.is_send {
                (SLOT_KIND_SENDER_DESC, SLOT_KIND_RECEIVER_DESC)
            } else {
                (SLOT_KIND_RECEIVER_DESC, SLOT_KIND_SENDER_DESC)
            };
            transfers.push(shim::Transfer {
                peer: o.peer,
                is_send: 1,
                buf: my_desc[i].as_mut_ptr() as *mut c_void,
                nbytes: 16,
                slot: Self::slot(mine_kind, seqs[i]),
            });
            transfers.push(shim::Transfer {
                peer: o.peer,
                is_send: 0,
                buf: their_desc[i].as_mut_ptr() as *mut c_void,
                nbytes: 16,
                slot: Self::slot(theirs_kind, seqs[i]),
            });
        }
        self.ctx()
            .p2p(&transfers, d.left()?)
            .map_err(|e| self.fail("point-to-point size exchange", e))?;
        transfers.clear();
        for (i, o) in remote.iter().enumerate() {
            if my_desc[i] != their_desc[i] {
                let dt = |v: u64| DType::ALL.get(v as usize).map_or("?", |d| d.name());
                let (verb, their_verb) = if o.is_send {
                    ("send of", "receive of")
                } else {
                    ("receive of", "send of")
                };
                errors.push(format!(
                    "{verb} {} {} {} rank {} does not match that rank's {their_verb} {} {}",
                    my_desc[i][0],
                    dt(my_desc[i][1]),
                    if o.is_send { "to" } else { "from" },
                    o.peer,
                    their_desc[i][0],
                    dt(their_desc[i][1])
                ));
                continue;
            }
            let bytes = o.count * o.dtype.size();
            if bytes == 0 {
                continue;
            }
            transfers.push(shim::Transfer {
                peer: o.peer,
                is_send: o.is_send as c_int,
                buf: o.buf.0,
                nbytes: bytes,
                slot: Self::slot(SLOT_KIND_DATA, seqs[i]),
            });
        }
        if !transfers.is_empty() {
            self.ctx()
                .p2p(&transfers, d.left()?)
                .map_err(|e| self.fail("point-to-point transfer", e))?;
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid_usage(errors.join("; ")))
        }
    }
}

impl Backend for GlooBackend {
    fn check(&self, op: &Op) -> Result<()> {
        if let (Some(r), Some((Some(dtype), _, _))) = (op.reduce_op(), op.signature()) {
            reduce::kernel(dtype, r.kind)?;
        }
        Ok(())
    }

    fn run(&self, op: &Op, timeout: Duration) -> Result<()> {
        self.check_not_broken()?;
        let seq = self.ops_run.fetch_add(1, Ordering::Relaxed) + 1;
        let d = Deadline::after(timeout);
        self.execute(op, &d).map_err(|mut e| {
            if e.kind == ErrorKind::Timeout && lock(&self.broken).is_none() {
                // The deadline ran out between Gloo calls: the peers are
                // somewhere else in their sequence now, so the context is no
                // longer in step.
                self.mark_broken(&e);
            }
            let lost_peer = matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote);
            if lost_peer && self.size > 1 && !self.diagnosed.swap(true, Ordering::SeqCst) {
                let found = self.diagnose(op, seq, e.kind);
                e.message.push_str(&found);
                if let Some(b) = lock(&self.broken).as_mut() {
                    b.message.push_str(&found);
                }
            }
            if lost_peer && !self.check_collectives && self.size > 1 {
                // Ranks that called different collectives exchange nothing
                // (see `tag_salt`): they meet here, at the timeout (or
                // when the first rank that timed out closes its
                // connections).
                e.message.push_str(CHECK_HINT);
            }
            e
        })
    }

    fn abort(&self) {
        self.mark_broken(&Error::new(ErrorKind::Aborted, "the comm was aborted"));
    }

    fn finalize(&self) -> Result<()> {
        Ok(())
    }

    fn new_window(&self, timeout: Duration) -> Result<Box<dyn WindowBackend>> {
        window::create(self, timeout)
    }

    /// Host memory that the comm's same-host peers can map (see [`shm`]):
    /// windows registered on it take puts as memory copies.
    fn mem_alloc(&self, bytes: usize) -> Result<*mut c_void> {
        self.shared_memory
            .alloc(bytes, &format!("comm '{}'", self.name))
    }

    fn mem_free(&self, ptr: *mut c_void) -> Result<()> {
        self.shared_memory
            .free(ptr, &format!("gloo comm '{}'", self.name))
    }
}

// Raw pointers inside `Op` are only dereferenced on the progress thread.
unsafe impl Send for GlooBackend {}
unsafe impl Sync for GlooBackend {}
