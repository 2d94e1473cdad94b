//! The host backend ("gloo"): every operation on host memory, run by the
//! comm's progress thread on the transport its table picks (see
//! [`routes`]): the hierarchy, shared memory, UCX or Gloo over TCP (see
//! [`tcp`]), each a type of its own behind the host transports' interface
//! ([`crate::backends::transport`]). The backend itself holds what is the
//! comm's, not a transport's: whether it broke, the failure reports that
//! name a rank at fault ([`failure`]), windows and shared host memory.

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

mod batch;
mod failure;
mod hier;
mod issue;
mod memory;
mod routes;
mod shared_memory;
mod shm;
mod signature;
pub mod tcp;
mod window;

pub use tcp::shim;

use super::host_executor::{HostBackend, HostExecutor, IdleWake};
use super::{Abilities, Backend, BackendInit, MemoryAllocator, WindowBackend, Windows};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::reduce;
use crate::op::{Op, PointToPoint};
use crate::util::Deadline;
use failure::{FailureReports, Unusable, DIAGNOSIS_WINDOW};
use signature::CHECK_HINT;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Creates the backend: connects the comm's transports (Gloo over TCP
/// first, through the comm's store) and agrees on settings with every peer.
pub fn create(init: BackendInit) -> Result<Box<dyn Backend>> {
    let backend = GlooBackend::connect(init.clone())?;
    Ok(Box::new(HostExecutor::start(backend, &init)?))
}

pub struct GlooBackend {
    rank: i32,
    size: i32,
    name: String,
    /// Set once the comm is unusable (peer failure, timeout, abort).
    broken: Unusable,
    /// Whether `broken` was set, read without its lock by the check every
    /// call makes (set after it, so a reader that sees it finds the error).
    broken_flag: AtomicBool,
    /// Failure reports through the comm's store (shared with Gloo over
    /// TCP, which tells refusals through them).
    reports: Arc<FailureReports>,
    /// Windows created so far (each rendezvouses under `window/<k>`).
    windows_made: AtomicU64,
    /// The comm's store (scoped by its name), for windows' rendezvous.
    store: crate::store::StoreRef,
    /// Memory from `tc_mem_alloc`, shared with same-host peers' windows.
    shared_memory: Arc<shm::SharedAllocations>,
    /// The comm's transports, and which serves what (see [`routes`]).
    routes: routes::Routes,
}

impl GlooBackend {
    fn connect(init: BackendInit) -> Result<GlooBackend> {
        let reports = Arc::new(FailureReports::new(&init));
        let routes = routes::Routes::connect(&init, reports.clone())?;
        Ok(GlooBackend {
            rank: init.rank,
            size: init.size,
            name: init.name.clone(),
            broken: Unusable::default(),
            broken_flag: AtomicBool::new(false),
            reports,
            windows_made: AtomicU64::new(0),
            store: init.store.clone(),
            shared_memory: Default::default(),
            routes,
        })
    }

    fn check_not_broken(&self) -> Result<()> {
        if !self.broken_flag.load(Ordering::Acquire) {
            return Ok(());
        }
        self.broken.check(&self.name)
    }

    /// Marks the comm unusable and aborts every transport, so that blocked
    /// peers fail now rather than at their timeout.
    fn mark_broken(&self, err: &Error) {
        let first = self.broken.record(err);
        self.broken_flag.store(true, Ordering::Release);
        if first {
            self.routes.abort(err);
        }
    }

    /// `f` on Gloo over TCP outside the transport table (which breaks the
    /// comm itself, see `routes::run_on`): a failure that closed its
    /// context breaks the comm.
    fn on_tcp<T>(&self, f: impl FnOnce(&tcp::GlooTcp) -> Result<T>) -> Result<T> {
        let tcp = self.routes.tcp();
        f(tcp).inspect_err(|e| {
            if !tcp.is_open() {
                self.mark_broken(e)
            }
        })
    }
}

impl Abilities for GlooBackend {
    fn check(&self, op: &Op) -> Result<()> {
        if let Op::Reduction(r) = op {
            reduce::kernel(r.dtype, r.op.kind)?;
        }
        Ok(())
    }

    fn abort(&self) {
        self.mark_broken(&Error::new(ErrorKind::Aborted, "the comm was aborted"));
    }

    /// Waits until the peers received every buffered send.
    fn finalize(&self) -> Result<()> {
        if let Some(u) = self.routes.ucx() {
            u.flush(&|| self.check_not_broken())?;
        }
        self.on_tcp(|tcp| tcp.flush_buffered_sends())
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
    /// other ranks, see [`FailureReports::diagnose`]), so that it is part of the
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

impl HostBackend for GlooBackend {
    /// A send or receive alone, to another rank, through the shared-memory
    /// rings.
    #[inline]
    fn may_run_at_once(&self, op: &Op) -> bool {
        self.ring_transfer(op).is_some()
    }

    /// The same (see [`batch`]).
    fn may_batch(&self, op: &Op) -> bool {
        self.ring_transfer(op).is_some()
    }

    fn independent(&self, earlier: &Op, later: &Op) -> bool {
        self.transfers_independent(earlier, later)
    }

    fn run_batch(&self, ops: &[&Op], timeout: Duration, done: &mut dyn FnMut(usize, Result<()>)) {
        self.run_transfers_together(ops, timeout, done)
    }

    /// See [`shared_memory::SharedMemory::transfer_at_once`]. A broken comm
    /// leaves the operation to [`HostBackend::run`], which reports it.
    fn run_at_once(&self, op: &Op) -> Option<Result<()>> {
        let Op::PointToPoint(PointToPoint::One(p)) = op else {
            return None;
        };
        if self.broken.is_set() {
            return None;
        }
        // SAFETY: the comm validated the buffer against its count, and the
        // caller keeps it alive until the work completes.
        let result = unsafe { self.routes.shared_memory_p2p()?.transfer_at_once(p)? };
        // Counted as every operation run, for the failure reports.
        self.reports.next_op();
        if let Err(e) = &result {
            // A corrupt ring (a mismatch keeps the pair in step).
            if e.kind != ErrorKind::InvalidUsage {
                self.mark_broken(e);
            }
        }
        Some(result)
    }

    fn idle(&self) -> Option<Duration> {
        self.routes.ucx().and_then(|t| t.progress_idle())
    }

    fn attach_idle_wake(&self, wake: IdleWake) {
        if let Some(t) = self.routes.ucx() {
            t.attach_idle_wake(wake);
        }
    }

    fn run(&self, op: &Op, d: &Deadline) -> Result<()> {
        self.check_not_broken()?;
        let seq = self.reports.next_op();
        self.execute(op, d).map_err(|e| self.failed(op, seq, e))
    }
}

impl GlooBackend {
    /// `e`, the failure of `op` (the `seq`th operation run), as the caller
    /// gets it: a timeout breaks the comm, and the first lost peer is
    /// diagnosed through the failure reports.
    fn failed(&self, op: &Op, seq: u64, mut e: Error) -> Error {
        if e.kind == ErrorKind::Timeout && !self.broken.is_set() {
            // The deadline ran out between Gloo calls: the peers are
            // somewhere else in their sequence now, so the context is no
            // longer in step.
            self.mark_broken(&e);
        }
        let lost_peer = matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote);
        if lost_peer && self.size > 1 && self.reports.first_failure() {
            let diagnosis = self.reports.diagnose(op, seq, e.kind);
            self.broken.append(&diagnosis.found);
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
        if lost_peer && !self.routes.tcp().checks_collectives() && self.size > 1 {
            // Ranks that called different collectives exchange nothing
            // (see `tag_salt`): they meet here, at the timeout (or
            // when the first rank that timed out closes its
            // connections).
            e.message.push_str(CHECK_HINT);
        }
        e
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
