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
//!   differ: each point-to-point send through Gloo carries a descriptor
//!   (count, dtype, bytes) that its receive takes first (the shared-memory
//!   path checks on the receiver too), and the per-rank counts of the v-variants are all-gathered and
//!   compared first; with `TORCHCOMM_CHECK_COLLECTIVES=1` every collective
//!   first all-gathers (op, dtype, count, root, reduce op) and fails on all
//!   ranks, naming the rank that differs;
//! - without that check, ranks that call different collectives would send
//!   messages of the wrong size, which makes Gloo's network thread throw
//!   (uncatchable: the process terminates), or of the right size with the
//!   wrong meaning (silently wrong results): every Gloo tag of a collective
//!   carries a hash of its signature, so such ranks exchange nothing and
//!   fail at the timeout, told to enable the check (the shared-memory path
//!   checks every collective always, see [`shared_memory`]);
//! - after a timeout or a vanished peer the context is closed (Gloo closes it
//!   on timeouts anyway), which makes the peers fail fast too; later
//!   operations fail at once;
//! - Gloo has no gatherv and no reduce-scatter: reduce-scatter is one
//!   all-to-all (block r to rank r) followed by a local reduction of the
//!   received blocks in rank order; the list forms go through contiguous
//!   scratch buffers.

/// `?` inside the functions that answer `Option<Result<_>>` (`None`: the
/// path has no form of the op): an error answers `Some(Err(..))`.
macro_rules! some_try {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Some(Err(e)),
        }
    };
}

mod buffered_sends;
mod collectives;
mod connect;
mod failure;
mod hier;
mod issue;
mod over_gloo;
mod p2p;
mod routes;
mod shared_memory;
pub mod shim;
mod shm;
mod signature;
mod store_bridge;
mod tcp_transport;
mod window;

use super::host_executor::{HostBackend, HostExecutor};
use super::{Backend, BackendInit, MemoryAllocator, WindowBackend, Windows};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::reduce;
use crate::op::{Op, P2p, Refusal};
use crate::store::StoreRef;
use crate::types::{DType, RedKind, ReduceOp};
use crate::util::{lock, Deadline};
use reduce::Scale;
use signature::{describe_sig, signature_words, CHECK_HINT, TAG_COUNTER_BITS};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};
use store_bridge::{store_get, store_set, store_wait};

/// Creates the backend: loads the Gloo module, connects the full mesh
/// through the comm's store and agrees on settings with every peer.
pub fn create(init: BackendInit) -> Result<Box<dyn Backend>> {
    let backend = GlooBackend::connect(init.clone())?;
    Ok(Box::new(HostExecutor::start(backend, &init)?))
}

const SLOT_PREFIX_P2P: u64 = 0x40;
/// A send's descriptor (count, dtype, bytes), see `buffered_sends`.
const SLOT_KIND_DESC: u64 = 1;
const SLOT_KIND_DATA: u64 = 3;
/// Added to a slot kind for transfers with a non-zero tag (see
/// `GlooBackend::slot`).
const SLOT_KIND_TAGGED: u64 = 3;
const HELLO_MAGIC: u64 = 0x7463_676c_6f6f_0001; // "tcgloo" v1
/// How long a rank whose operation timed out or lost a peer waits for the
/// other ranks' failure reports (see `GlooBackend::diagnose`). Together with
/// the thread start and store round trips it stays within the watchdog
/// grace this backend asks for (`HostBackend::watchdog_grace`), so the diagnosis
/// is part of the first error message.
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
    /// The same for tagged transfers: (is_send, peer, tag) -> next number.
    tagged: std::collections::HashMap<(bool, i32, u32), u64>,
}

pub struct GlooBackend {
    rank: i32,
    size: i32,
    name: String,
    /// Sends whose Gloo posts were not waited for yet: declared before
    /// `ctx`, so dropped before it.
    buffered: buffered_sends::BufferedSends,
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
    /// Refusals run over Gloo (see [`GlooBackend::refuse_through_store`]).
    refusals: AtomicU64,
    /// Windows created so far (each rendezvouses under `window/<k>`).
    windows_made: AtomicU64,
    /// The address selection of the comm's context, reused by windows.
    hostname: Option<String>,
    iface: Option<String>,
    /// Memory from `tc_mem_alloc`, shared with same-host peers' windows.
    shared_memory: std::sync::Arc<shm::SharedAllocations>,
    /// The transports that serve this comm before Gloo over TCP, and
    /// which serves what (see [`routes`]).
    routes: routes::Routes,
}

// ---- helpers ----------------------------------------------------------------

/// 8-byte aligned scratch memory.
struct Scratch(Vec<u64>);

impl Scratch {
    /// `bytes` of zeroed scratch; its size comes from the caller's counts,
    /// so a failed allocation is `TC_ERR_OUT_OF_MEMORY`, not an abort.
    fn new(bytes: usize) -> Result<Scratch> {
        let what = "scratch memory sized by the operation's counts";
        crate::util::try_zeroed(bytes.div_ceil(8), what).map(Scratch)
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }

    /// The per-rank buffers of a list-form op, `bytes` each, packed in rank
    /// order into one contiguous scratch buffer (as the single forms take it).
    ///
    /// # Safety
    /// Every pointer in `buffers` must be valid for reads of `bytes`.
    unsafe fn packed(buffers: &[crate::op::Ptr], bytes: usize) -> Result<Scratch> {
        let mut s = Scratch::new(bytes * buffers.len())?;
        for (r, p) in buffers.iter().enumerate() {
            copy(s.ptr().add(r * bytes), p.as_u8(), bytes);
        }
        Ok(s)
    }
}

/// `bytes` at `input`, or a private copy of them when `needed` (the copy
/// must be kept alive while the returned pointer is used).
unsafe fn private_input(
    input: *const u8,
    bytes: usize,
    needed: bool,
) -> Result<(Option<Scratch>, *const u8)> {
    if !needed {
        return Ok((None, input));
    }
    let mut c = Scratch::new(bytes)?;
    copy(c.ptr(), input, bytes);
    let p = c.ptr() as *const u8;
    Ok((Some(c), p))
}

/// memmove of `n` bytes (no-op when equal or empty).
unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 && !std::ptr::eq(dst, src) {
        std::ptr::copy(src, dst, n);
    }
}

impl GlooBackend {
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

    fn ctx(&self) -> &shim::Context {
        self.ctx.as_ref().expect("gloo context exists for size > 1")
    }

    /// This comm's transport among all ranks between hosts.
    fn flat_transport(&self) -> &'static str {
        match self.routes.ucx() {
            Some(_) => "UCX",
            None => "Gloo (TCP)",
        }
    }
}

impl HostBackend for GlooBackend {
    fn check(&self, op: &Op) -> Result<()> {
        if let Op::Reduction(r) = op {
            reduce::kernel(r.dtype, r.op.kind)?;
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
                let diagnosis = self.diagnose(op, seq, e.kind);
                if let Some(b) = lock(&self.broken).as_mut() {
                    b.message.push_str(&diagnosis.found);
                }
                if let Some(told) = diagnosis.refusal {
                    // A caller's error, not a lost peer: fail the call
                    // (the comm stays broken) without aborting.
                    return Error::invalid_usage(format!(
                        "{} on rank {}: {told}; the refusing rank closed the connections ({})",
                        op.name(),
                        self.rank,
                        e.message
                    ));
                }
                e.message.push_str(&diagnosis.found);
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

    /// Waits until the peers received every buffered send.
    fn finalize(&self) -> Result<()> {
        if let Some(u) = self.routes.ucx() {
            u.flush(&|| self.check_not_broken())?;
        }
        self.flush_buffered_sends()
    }

    fn version(&self) -> String {
        let gloo = shim::module()
            .ok()
            .and_then(|m| m.gloo_version())
            .unwrap_or_else(|| "unknown".into());
        let ucx = self
            .routes
            .ucx()
            .map(|u| format!(", {} between hosts", u.version()))
            .unwrap_or_default();
        format!("gloo {gloo}{ucx} (torchcomm {})", env!("CARGO_PKG_VERSION"))
    }

    /// Room for the diagnosis after a timeout (the failure reports of the
    /// other ranks, see [`GlooBackend::diagnose`]), so that it is part of the
    /// first error message rather than the watchdog's.
    fn watchdog_grace(&self) -> Duration {
        DIAGNOSIS_WINDOW + Duration::from_millis(500)
    }

    fn allocator(&self) -> Option<&dyn MemoryAllocator> {
        Some(self)
    }

    fn windows(&self) -> Option<&dyn Windows> {
        Some(self)
    }
}

impl Windows for GlooBackend {
    fn new_window(&self, timeout: Duration) -> Result<Box<dyn WindowBackend>> {
        window::create(self, timeout)
    }
}

impl MemoryAllocator for GlooBackend {
    /// Host memory that the comm's same-host peers can map (see [`shm`]):
    /// windows registered on it take puts as memory copies.
    fn alloc(&self, bytes: usize) -> Result<*mut c_void> {
        self.shared_memory
            .alloc(bytes, &format!("comm '{}'", self.name))
    }

    fn free(&self, ptr: *mut c_void) -> Result<()> {
        self.shared_memory
            .free(ptr, &format!("gloo comm '{}'", self.name))
    }
}

// Raw pointers inside `Op` are only dereferenced on the progress thread.
unsafe impl Send for GlooBackend {}
unsafe impl Sync for GlooBackend {}
