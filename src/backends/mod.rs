//! Backends execute validated operations: the comm hands each one to
//! [`Backend::submit`] and gets its work back. Host backends (`gloo`) are
//! served by the host executor ([`host_executor`]: queue, progress thread,
//! CUDA staging), which runs them one at a time through
//! [`host_executor::HostBackend::run`]; device backends (`nccl`) enqueue
//! them on CUDA streams and return their own work.

pub mod gloo;
pub mod host_executor;
pub mod nccl;
mod submission;
mod transport;
pub(crate) mod ucx;

pub use submission::{CommEvents, CommLink, Issue, Submission};

use crate::error::{Error, Result};
use crate::op::Op;
use crate::store::StoreRef;
use crate::types::{Device, Hints};
use crate::work::Work;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

/// The watchdog's grace for backends that do not choose their own.
pub const DEFAULT_WATCHDOG_GRACE: Duration = Duration::from_millis(900);

/// Everything a backend needs to join its peers.
#[derive(Clone)]
pub struct BackendInit {
    pub rank: i32,
    pub size: i32,
    /// Rank among the processes of this host (picks the GPU for index -1).
    pub local_rank: i32,
    /// The comm's name, unique among live comms.
    pub name: String,
    pub device: Device,
    /// Store already scoped by the comm's name.
    pub store: StoreRef,
    /// The comm's default operation timeout.
    pub timeout: Duration,
    /// Whether failures abort the process (the comm's abort-on-error).
    pub abort_on_error: bool,
    pub hints: Hints,
    /// The way back to the comm (connected once the comm exists).
    pub link: CommLink,
}

impl BackendInit {
    /// The creator's hint `key`, if it gave one.
    pub fn hint(&self, key: &str) -> Option<&str> {
        self.hints
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The creator's hint `key`, else environment variable `var` (unset or
    /// empty: none): how a backend reads each of its switches.
    pub fn setting(&self, key: &str, var: &str) -> Option<String> {
        self.hint(key)
            .map(str::to_string)
            .or_else(|| std::env::var(var).ok().filter(|v| !v.is_empty()))
    }
}

/// Where a backend's operations touch their buffers. The comm asks this,
/// never the backend's name, when it runs collectives of its own (the NaN
/// check's verdicts, a persistent all-gather's agreement) or decides which
/// per-call checks an operation may skip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferHome {
    /// On the host, one operation at a time (CUDA buffers are staged through
    /// host copies by the host executor); `check` looks at no pointer, so a
    /// prepared operation may skip it.
    Host,
    /// On CUDA streams, in device memory: `check` refuses every buffer NCCL
    /// could not reach, so every call goes through it; the comm's own
    /// exchanges run in device memory on the operation's stream.
    Device,
}

/// What a backend answers besides issuing operations: the checks before an
/// operation, abort and finalize, its version, its asynchronous errors and
/// its optional capabilities. The same whether the backend issues its
/// operations itself ([`Backend`]) or the host executor runs them
/// ([`host_executor::HostBackend`]); the comm reaches it through
/// [`Backend::abilities`].
pub trait Abilities: Send + Sync {
    /// Rejects, before anything is issued, an operation this backend cannot
    /// run (e.g. a reduction it does not implement for the dtype), so that the
    /// caller gets the error and the comm stays usable.
    fn check(&self, _op: &Op) -> Result<()> {
        Ok(())
    }

    /// Unblocks any running operation and makes later ones fail. Called from
    /// any thread, possibly while an operation runs.
    fn abort(&self);

    /// Extra time the comm's watchdog grants beyond an operation's timeout,
    /// so that the backend's own timeout (with its better message) fires
    /// first.
    fn watchdog_grace(&self) -> Duration {
        DEFAULT_WATCHDOG_GRACE
    }

    /// The backend's version, as `tc_comm_get_backend_version` reports it.
    fn version(&self) -> String {
        default_version()
    }

    /// Releases resources after every operation finished.
    fn finalize(&self) -> Result<()> {
        Ok(())
    }

    /// A failure found asynchronously (e.g. NCCL's async error), polled by
    /// the comm's watchdog.
    fn async_error(&self) -> Option<crate::error::Error> {
        None
    }

    // Optional capabilities: None where the backend has no such thing (the
    // comm answers `TC_ERR_UNSUPPORTED`, naming the call and the backend).

    /// Registration of user memory with the transport (`tc_comm_register`).
    fn registration(&self) -> Option<&dyn MemoryRegistration> {
        None
    }

    /// Memory the backend allocates for its own transfers (`tc_mem_alloc`).
    fn allocator(&self) -> Option<&dyn MemoryAllocator> {
        None
    }

    /// One-sided windows (`tc_window_*`).
    fn windows(&self) -> Option<&dyn Windows> {
        None
    }
}

pub trait Backend: Send + Sync {
    /// Where this backend's operations read and write (see [`BufferHome`]).
    fn buffer_home(&self) -> BufferHome;

    /// What it answers besides issuing operations (see [`Abilities`]).
    fn abilities(&self) -> &dyn Abilities;

    /// Issues a validated `op` (checked by [`Abilities::check`]) and returns
    /// its work; tells the comm what became of it through `sub` (exactly
    /// once, before the operation can run). With `async_op` off, returns
    /// after the operation completed (host) or was enqueued on the stream
    /// (device).
    fn submit(&self, op: Op, sub: Submission<'_>) -> Result<Arc<dyn Work>>;

    /// Waits until no issued operation is queued or running in the
    /// backend's own threads (the comm's finalize).
    fn wait_idle(&self) {}

    /// Stops the backend's own threads; operations issued but never started
    /// fail with `err`. Called once, at finalize or abort.
    fn stop(&self, _err: &Error) {}

    /// Whether [`Backend::split`] makes child comms (NCCL's ncclCommSplit);
    /// otherwise the comm creates the child's backend afresh over the store,
    /// among the child's ranks only.
    fn splits_natively(&self) -> bool {
        false
    }

    /// Makes the backend of a child comm, collectively over every rank of
    /// this one: ranks passing the same `ranks` (the child's members in this
    /// comm's numbering, in their new order) form one child; a rank passing
    /// `None` opts out (it still takes part) and gets `Ok(None)`. `init`
    /// describes the child as the caller expects it (rank, size, name,
    /// store); the backend fails when the split it got differs (ranks
    /// passed different lists).
    fn split(&self, _member: Option<(&[i32], BackendInit)>) -> Result<Option<Box<dyn Backend>>> {
        Err(Error::unsupported("this backend has no native split"))
    }

    /// Makes the backend of the comm that remains without the `excluded`
    /// ranks (sorted parent ranks), collectively over the other ranks of
    /// this one, which may have failed (`tc_comm_shrink`). Called only when
    /// [`Backend::splits_natively`]; the others are made afresh over the
    /// store.
    fn shrink(&self, _excluded: &[i32], _init: BackendInit) -> Result<Box<dyn Backend>> {
        Err(Error::unsupported("this backend has no native shrink"))
    }
}

/// A backend's side of a one-sided window (`tc_window_*`). The comm-level
/// `Window` has already checked its arguments (ranks in range, offsets and
/// sizes without overflow, a buffer registered where one is needed) and
/// serializes calls; every call completes before it returns and fails
/// within `timeout`.
///
/// Ordering: a `signal(peer)` reaches `peer` after every earlier `put` from
/// this rank to `peer`, and when `wait_signal(src)` returns on `peer`, the
/// data of every put `src` issued before that signal is in `peer`'s buffer.
/// Each signal satisfies one wait.
pub trait WindowBackend: Send + Sync {
    /// Collective: every rank registers its buffer (sizes may differ); puts
    /// are bounds-checked against the target's size.
    fn register(&self, buf: *mut c_void, bytes: usize, timeout: Duration) -> Result<()>;
    /// Collective: after it, no put can land in the buffer any more.
    fn deregister(&self, timeout: Duration) -> Result<()>;
    /// Size of `rank`'s registered buffer.
    fn remote_size(&self, rank: i32) -> usize;
    /// Writes `bytes` from `src` at `dst_offset` in `dst_rank`'s buffer.
    fn put(
        &self,
        src: *const c_void,
        bytes: usize,
        dst_rank: i32,
        dst_offset: usize,
        timeout: Duration,
    ) -> Result<()>;
    /// Reads `bytes` at `src_offset` of `src_rank`'s buffer into `dst`,
    /// after this rank's earlier puts to `src_rank` landed.
    fn get(
        &self,
        dst: *mut c_void,
        bytes: usize,
        src_rank: i32,
        src_offset: usize,
        timeout: Duration,
    ) -> Result<()>;
    /// Notifies `peer` (after this rank's earlier puts to it).
    fn signal(&self, peer: i32, timeout: Duration) -> Result<()>;
    /// Waits for (and consumes) one signal from `peer`.
    fn wait_signal(&self, peer: i32, timeout: Duration) -> Result<()>;
    /// A local pointer to `rank`'s buffer where the memory is reachable
    /// (always this rank's own); `TC_ERR_UNSUPPORTED` otherwise.
    fn map_remote(&self, rank: i32) -> Result<*mut c_void>;
    /// Ends the window's service (called once, by free or comm shutdown).
    fn close(&self);
}

/// Registration of user memory with a backend's transport. Arguments are
/// validated by the caller (non-NULL, non-zero sizes); the comm adds its
/// name and backend to errors.
pub trait MemoryRegistration: Send + Sync {
    /// Registers `bytes` at `buf`; returns its handle.
    fn register(&self, buf: *mut c_void, bytes: usize) -> Result<*mut c_void>;
    /// Releases a handle returned by [`MemoryRegistration::register`]. Also
    /// called after finalize or abort.
    fn deregister(&self, handle: *mut c_void) -> Result<()>;
}

/// Memory suited to a backend's transfers, allocated by it.
pub trait MemoryAllocator: Send + Sync {
    /// Allocates `bytes` (non-zero, checked by the caller).
    fn alloc(&self, bytes: usize) -> Result<*mut c_void>;
    /// Frees memory from [`MemoryAllocator::alloc`]. Also called after
    /// finalize or abort.
    fn free(&self, ptr: *mut c_void) -> Result<()>;
}

/// One-sided windows over a comm.
pub trait Windows: Send + Sync {
    /// Creates a window, collectively over every rank (see
    /// [`WindowBackend`]).
    fn new_window(&self, timeout: Duration) -> Result<Box<dyn WindowBackend>>;
}

/// The answer for a capability a backend lacks: which call, and that this
/// backend does not offer it.
pub fn lacks(what: &str) -> Error {
    Error::unsupported(format!("this backend has no {what}"))
}

/// The version a backend reports when it names none of its own.
fn default_version() -> String {
    format!("torchcomm {}", env!("CARGO_PKG_VERSION"))
}

/// Names accepted by `tc_comm_new`.
pub const BACKEND_NAMES: [&str; 2] = ["gloo", "nccl"];

/// Rejects an unknown backend name before any rendezvous work is done.
pub fn check_name(name: &str) -> Result<()> {
    if BACKEND_NAMES.contains(&name) {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "argument 'backend': unknown backend {name:?} (known: {})",
        BACKEND_NAMES.join(", ")
    )))
}

/// Ok when backend `name` can run in this process: gloo's module
/// (`libtorchcomm-gloo.so`) loads; nccl's NCCL and CUDA driver load.
/// Otherwise the `TC_ERR_UNAVAILABLE` error saying what is missing (an
/// unknown name: `TC_ERR_INVALID_ARGUMENT`).
pub fn available(name: &str) -> Result<()> {
    check_name(name)?;
    match name {
        "gloo" => gloo::shim::module().map(|_| ()),
        _ => nccl::load().map(|_| ()),
    }
}

pub fn create(name: &str, init: BackendInit) -> Result<Box<dyn Backend>> {
    check_name(name)?;
    match name {
        "gloo" => gloo::create(init),
        _ => nccl::create(init),
    }
}
