//! GPU backend over NCCL: every operation on CUDA device memory, ordered on
//! CUDA streams.
//!
//! - Loading: NCCL through [`loader`] (our own dlopen table), the CUDA driver
//!   through [`crate::cuda`]; a missing driver, device or library is
//!   `TC_ERR_UNAVAILABLE` saying what was looked for.
//! - Creation: rank 0 publishes NCCL's unique id in the comm's store, the
//!   others wait for it (comm timeout); `ncclCommInitRankConfig` with the comm
//!   name and the hints mapped onto ncclConfig fields.
//! - Streams: `async_op = 0` runs on the caller's stream; `async_op = 1`
//!   records an event there, makes the comm's internal non-blocking stream
//!   wait on it and runs on the internal stream. Either way a pooled start
//!   and end event bracket the operation ([`work::CudaWork`]).
//! - CUDA graphs: when the caller's stream is capturing, the operation is
//!   captured on that stream (also for `async_op = 1`, so the capture needs
//!   no join), and no event is queried for it.
//! - Operations NCCL has natively are called directly; the list forms, the
//!   v-variants, scatter/gather and all-to-all are grouped
//!   broadcasts/reduces/send/recv (ncclAlltoAll when the library has it).
//!   PREMUL_SUM goes through ncclRedOpCreatePreMulSum (host or device
//!   scalar) and is destroyed after the call; AVG is native; bool travels as
//!   uint8 (SUM/MAX = or, PRODUCT/MIN = and); BAND/BOR/BXOR are
//!   `TC_ERR_UNSUPPORTED`.

// Stream, event and comm handles are opaque: passed to the driver or NCCL,
// never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod checks;
mod color;
mod creation;
mod enqueue;
mod issue;
mod lifecycle;
mod mem;
mod red_op;
mod refusal;
mod shrink;
mod window;
mod window_rma;
pub mod work;

use super::{
    Abilities, Backend, BackendInit, BufferHome, MemoryAllocator, MemoryRegistration, Submission,
    WindowBackend, Windows,
};
use crate::cuda::{self, Device as CudaDevice, DeviceBuffer, EventPool, Stream as CudaStream};
use crate::error::{Error, ErrorKind, Result};
use crate::nccl_loader as loader;
use crate::op::{Op, PointToPoint};
use crate::util::lock;
use crate::work::Work;
use checks::Staging;
use lifecycle::Slot;
use loader::*;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use work::Shared;

pub fn create(init: BackendInit) -> Result<Box<dyn Backend>> {
    Ok(Box::new(NcclBackend::create(init)?))
}

/// Loads NCCL and the CUDA driver; when either is missing, one
/// `TC_ERR_UNAVAILABLE` error names everything that was missing.
pub fn load() -> Result<&'static Nccl> {
    let lib = loader::nccl();
    let drv = cuda::available();
    match (lib, drv) {
        (Ok(lib), Ok(())) => Ok(lib),
        (Err(a), Ok(())) => Err(a.context("the nccl backend is unavailable")),
        (Ok(lib), Err(b)) => Err(b.context(format!(
            "the nccl backend is unavailable (NCCL {} loaded from {})",
            lib.version_string(),
            lib.origin
        ))),
        (Err(a), Err(b)) => Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "the nccl backend is unavailable: {}; and {}",
                b.message, a.message
            ),
        )),
    }
}

/// # Abort and concurrent users
///
/// The NCCL comm is freed by ncclCommAbort / ncclCommDestroy, and may be
/// aborted from any thread (watchdog, `tc_comm_abort`, destroy) while
/// another thread is issuing on it. Every use of the comm (an enqueue, a
/// registration, the watchdog's async-error poll) therefore goes through
/// [`NcclBackend::acquire`]: under the `slot` lock it checks that the comm
/// is LIVE and counts itself as a user; the guard uncounts it and wakes
/// `idle`. Abort and finalize first set CLOSING under the same lock (no new
/// user can start), then wait for `users == 0` and only then free the comm;
/// whoever swaps `comm` to NULL frees it, so it is freed exactly once, and a
/// straggler reading `comm` afterwards passes NULL, which NCCL rejects.
///
/// One case cannot wait: a blocking comm's call hung inside NCCL (e.g. a
/// connection to a dead peer). NCCL allows ncclCommAbort from another thread
/// precisely to unblock such a call, so after
/// [`ABORT_GRACE`](lifecycle::ABORT_GRACE) abort calls it with the user
/// still inside. The user must not touch the comm after that
/// call returns: each NCCL call on the comm checks `state` just before it is
/// made, error details are not fetched from a comm that is no longer LIVE,
/// and a non-blocking comm's polling loop stops at once. (The remaining
/// window, a user preempted for longer than the grace between its check and
/// its call, is the one NCCL's rule itself leaves open.)
pub struct NcclBackend {
    lib: &'static Nccl,
    comm: AtomicPtr<c_void>,
    slot: Mutex<Slot>,
    idle: Condvar,
    /// LIVE, CLOSING or RELEASED; written under `slot`, read without it as
    /// the last check before each NCCL call.
    state: AtomicU8,
    rank: i32,
    size: i32,
    name: String,
    /// "nccl comm 'NAME' (rank R/N)", for work descriptions.
    label: Arc<str>,
    timeout: Duration,
    nonblocking: bool,
    device: Arc<CudaDevice>,
    stream: CudaStream,
    events: Arc<EventPool>,
    /// One float for barriers.
    scratch: DeviceBuffer,
    shared: Arc<Shared>,
    /// NCCL comms are not thread-safe: issuing is serialized.
    issue: Mutex<()>,
    /// ncclCommGetAsyncError on a non-blocking comm completes and clears
    /// NCCL's group job without a lock: settle() and the watchdog poll one
    /// at a time.
    poll: Mutex<()>,
    /// Live handles of ncclCommRegister and how many registrations each
    /// stands for (NCCL hands out one handle per range; see [`mem`]).
    registrations: Mutex<HashMap<usize, u32>>,
    /// Live pointers of `tc_mem_alloc` and their allocator.
    allocations: Mutex<HashMap<usize, mem::Allocator>>,
    /// Copies of inputs that overlap their outputs where NCCL leaves the
    /// result undefined (see [`NcclBackend::stage_overlapping`]).
    staging: Mutex<Staging>,
    /// Set once ncclCommRevoke stopped the comm after a failure: it stays
    /// LIVE for a shrink, is never finalized, and is freed (ncclCommAbort)
    /// when the backend is dropped.
    revoked: AtomicBool,
    /// One revocation at a time (the watchdog's abort and a shrink).
    revoking: Mutex<()>,
}

// SAFETY: the raw comm is only used under the rules documented above.
unsafe impl Send for NcclBackend {}
unsafe impl Sync for NcclBackend {}

impl Backend for NcclBackend {
    fn buffer_home(&self) -> BufferHome {
        BufferHome::Device
    }

    fn abilities(&self) -> &dyn Abilities {
        self
    }

    fn submit(&self, op: Op, sub: Submission<'_>) -> Result<Arc<dyn Work>> {
        if let Op::Refused(refusal) = &op {
            // NCCL's peers cannot be told: their timeout names this rank.
            let published = self
                .shared
                .refusals
                .as_ref()
                .map(|r| r.publish(&refusal.told()));
            if let Some(Err(e)) = published {
                return Err(sub.refuse(&op, e));
            }
            let work: Arc<dyn Work> = Arc::new(crate::work::DoneWork(Ok(())));
            sub.done_at_once(&op, &work);
            return Ok(work);
        }
        match self.enqueue(&op, sub.opts, sub.timeout) {
            Ok(work) => {
                sub.enqueued(&op, &work);
                Ok(work)
            }
            Err(e) => Err(sub.refuse(&op, e)),
        }
    }

    fn splits_natively(&self) -> bool {
        self.lib.comm_split.is_some()
    }

    /// ncclCommSplit over this comm: NCCL_SPLIT_NOCOLOR for a rank that opts
    /// out; the child shares this comm's device and gets its own stream,
    /// events and watchdog. NCCL runs the split as a job of this comm: it
    /// blocks when this comm does, and on a non-blocking comm it is polled
    /// through this comm until done (see [`NcclBackend::split_child`]). The
    /// child is non-blocking when this comm is, unless a hint sets
    /// `blocking`; a split without hints passes NULL as its config, so the
    /// child inherits this comm's whole config. A child whose size or rank differs from what
    /// this rank's list says (ranks passed different lists) is aborted and
    /// the call fails.
    fn split(&self, member: Option<(&[i32], BackendInit)>) -> Result<Option<Box<dyn Backend>>> {
        let split = self.lib.comm_split.ok_or_else(|| {
            Error::unsupported(format!(
                "ncclCommSplit is missing from the loaded NCCL {}",
                self.lib.version_string()
            ))
        })?;
        let _use = self.acquire()?;
        let _issuing = lock(&self.issue);
        let Some((ranks, init)) = member else {
            let _ctx = self.device.scoped()?;
            let what = "ncclCommSplit (opting out)";
            // SAFETY: a live comm (held by `_use`), NULL config.
            let none = self.split_child(what, |c, slot| unsafe {
                split(c, NCCL_SPLIT_NOCOLOR, self.rank, slot, std::ptr::null_mut())
            })?;
            if !none.is_null() {
                // SAFETY: a comm NCCL made although this rank opted out.
                unsafe { (self.lib.comm_abort)(none) };
                return Err(Error::internal(format!(
                    "{what}: NCCL returned a comm for NCCL_SPLIT_NOCOLOR"
                )));
            }
            return Ok(None);
        };
        let (want_size, want_rank) = (init.size, init.rank);
        // The child's ranks are ordered by their place in the list.
        let (color, key) = (color::split_color(ranks), init.rank);
        // Without hints the child inherits this comm's whole config (NULL),
        // as NCCL documents; with hints it gets a config of its own.
        let inherit = init.hints.is_empty();
        let child = Self::build(
            self.lib,
            self.device.clone(),
            init,
            "ncclCommSplit",
            Some(self.nonblocking),
            |config, what| {
                let config: *mut loader::Config = if inherit {
                    std::ptr::null_mut()
                } else {
                    config
                };
                // SAFETY: a live comm (held by `_use`); the config outlives
                // the call.
                self.split_child(what, |c, slot| unsafe {
                    split(c, color, key, slot, config)
                })
            },
        )?;
        let (size, rank) = {
            let _child_use = child.acquire()?;
            child.count_and_rank()?
        };
        if (size, rank) != (want_size, want_rank) {
            return Err(Error::invalid_usage(format!(
                "split of nccl comm '{}': this rank's list makes it rank {want_rank} of {want_size}, but NCCL formed a comm in which \
                 it is rank {rank} of {size}: every rank of the new comm must pass the same list",
                self.name
            )));
        }
        Ok(Some(Box::new(child)))
    }

    /// ncclCommShrink over this comm (see [`shrink`]).
    fn shrink(&self, excluded: &[i32], init: BackendInit) -> Result<Box<dyn Backend>> {
        self.shrink_backend(excluded, init)
    }
}

impl Abilities for NcclBackend {
    fn version(&self) -> String {
        format!("nccl {}", self.lib.version_string())
    }

    fn check(&self, op: &Op) -> Result<()> {
        self.check_buffers(op)?;
        if let Op::PointToPoint(p) = op {
            if let Some(arg) = p.any_source() {
                return Err(Error::unsupported(format!(
                    "argument '{arg}': TC_ANY_SOURCE: NCCL receives name their peer; a \
                     receive from any source is supported on host (gloo) comms only"
                )));
            }
        }
        if let Some((arg, tag)) = op.nonzero_tag() {
            // Ignoring it would let a receive take the data of a send meant
            // for another tag; tag 0 is NCCL's own matching.
            return Err(Error::unsupported(format!(
                "argument '{arg}': tag {tag}: NCCL matches sends and receives by peer and \
                 issue order only and has no tags; use tag 0 on the nccl backend"
            )));
        }
        let dtype = match op {
            Op::PointToPoint(PointToPoint::One(p)) => Some(p.dtype),
            Op::PointToPoint(PointToPoint::Batch(ops)) => {
                for p in ops {
                    self.dtype(p.dtype)?;
                }
                None
            }
            _ => op.dtype(),
        };
        if let Some(d) = dtype {
            self.dtype(d)?;
            if let Some(r) = op.reduce_op() {
                self.builtin_op(r, d)?;
            }
        }
        Ok(())
    }

    fn abort(&self) {
        // A failure NCCL reported: revoke (where NCCL can), keeping the comm
        // for the survivors' shrink; any other abort frees it.
        let failed = self.shared.failure().is_some();
        self.shared.fail(Error::new(
            ErrorKind::Aborted,
            format!("nccl comm '{}' was aborted", self.name),
        ));
        if failed && self.revoke_comm() {
            return;
        }
        if let Err(e) = self.abort_comm() {
            crate::log_warn!("{}", e.message);
        }
    }

    fn finalize(&self) -> Result<()> {
        self.finalize_comm()
    }

    fn registration(&self) -> Option<&dyn MemoryRegistration> {
        Some(self)
    }

    fn allocator(&self) -> Option<&dyn MemoryAllocator> {
        Some(self)
    }

    fn windows(&self) -> Option<&dyn Windows> {
        Some(self)
    }

    fn async_error(&self) -> Option<Error> {
        let _use = self.acquire().ok()?;
        let mut st = NCCL_SUCCESS;
        let r = {
            let _polling = lock(&self.poll);
            // SAFETY: query on the comm, held by `_use`.
            unsafe { (self.lib.comm_get_async_error)(self.comm(), &mut st) }
        };
        let code = if r != NCCL_SUCCESS { r } else { st };
        if code == NCCL_SUCCESS || code == NCCL_IN_PROGRESS {
            return None;
        }
        let mut e = self.lib.error(
            code,
            &format!(
                "nccl comm '{}' (rank {}/{})",
                self.name, self.rank, self.size
            ),
            self.comm(),
        );
        if matches!(e.kind, ErrorKind::InvalidArgument | ErrorKind::InvalidUsage) {
            // An asynchronous failure breaks the comm whatever its code.
            e.kind = ErrorKind::Nccl;
        }
        self.shared.fail(e.clone());
        Some(e)
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        // A comm neither finalized nor aborted: abort it (no users can be
        // left: this is the last reference).
        if let Err(e) = self.abort_comm() {
            crate::log_warn!("{}", e.message);
        }
        self.free_leftovers();
    }
}

#[cfg(test)]
mod tests;

impl MemoryRegistration for NcclBackend {
    fn register(&self, buf: *mut c_void, bytes: usize) -> Result<*mut c_void> {
        self.register_memory(buf, bytes)
    }

    fn deregister(&self, handle: *mut c_void) -> Result<()> {
        self.deregister_memory(handle)
    }
}

impl MemoryAllocator for NcclBackend {
    fn alloc(&self, bytes: usize) -> Result<*mut c_void> {
        self.alloc_memory(bytes)
    }

    fn free(&self, ptr: *mut c_void) -> Result<()> {
        self.free_memory(ptr)
    }
}

impl Windows for NcclBackend {
    /// Windows through NCCL's host RMA API (see [`window`]).
    fn new_window(&self, _timeout: Duration) -> Result<Box<dyn WindowBackend>> {
        window::create(self)
    }
}
