//! The communicator: its state, its watchdog thread, failure handling, the
//! flight recorder, finalize/abort and split. Every operation is validated
//! here (`Op::validate`, in [`crate::op`]) before its backend (src/backends)
//! receives it and returns its work; host backends run theirs through the
//! host executor ([`crate::backends::host_executor`]).

use crate::backends::{
    self, lacks, Backend, BackendInit, CommEvents, CommLink, MemoryAllocator, MemoryRegistration,
    Submission,
};
use crate::config::config;
use crate::error::{Error, ErrorKind, Result};
use crate::recorder::FlightRecorder;
use crate::store::StoreRef;
use crate::types::{Device, Hints};
use crate::util::lock;
use crate::work::Work;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Compatibility re-exports: the op vocabulary lives in [`crate::op`];
/// `crate::comm::Op` and friends keep resolving for existing callers.
pub use crate::op::{Op, OpOptions, P2p, Ptr};

mod agreement;
mod events;
pub mod hooks;
#[cfg(test)]
mod nccl_unavailable_tests;
mod persistent;
mod reconfigure;
mod settings;
mod shrink;
#[cfg(test)]
pub(crate) mod test_support;
mod watchdog;
mod windows;

pub use windows::WindowLanes;

pub use persistent::PersistentAllGather;
pub use reconfigure::{CommSlot, Reconfigurable};

/// Creation options, read from `tc_comm_options_t`.
#[derive(Clone, Default)]
pub struct CommOptions {
    pub name: Option<String>,
    pub timeout: Option<Duration>,
    pub abort_on_error: Option<bool>,
    pub rank: Option<i32>,
    pub world_size: Option<i32>,
    pub store: Option<StoreRef>,
    pub hints: Hints,
}

#[derive(Debug, Clone)]
enum State {
    Active,
    Finalized,
    Aborted(Error),
}

pub struct Comm {
    name: String,
    /// "comm 'name' (rank r/n)", shared by the messages of its operations.
    label: Arc<str>,
    rank: i32,
    size: i32,
    device: Device,
    backend_name: String,
    /// Rank among this host's processes; splits keep it (it picks the GPU).
    local_rank: i32,
    /// Default operation timeout in ms; `tc_comm_set_timeout` changes it.
    timeout_ms: AtomicU64,
    abort_on_error: AtomicBool,
    /// This comm's ranks in the root comm's numbering (see `settings`).
    root_ranks: Vec<i32>,
    /// The backend's version, as `tc_comm_get_backend_version` reports it.
    backend_version: std::ffi::CString,
    /// Unscoped store, from which splits derive their own scopes.
    base_store: StoreRef,
    backend: Box<dyn Backend>,
    state: Mutex<State>,
    /// Whether `state` is still Active: cleared, under the state's lock,
    /// when it leaves Active (it never returns), so that the check every
    /// call makes ([`Comm::check_active`]) takes no lock.
    active: AtomicBool,
    /// The watchdog's clock; stopped at shutdown.
    ticker: watchdog::Ticker,
    outstanding: Mutex<Vec<Arc<dyn Work>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// First failure of any operation, reported by finalize.
    first_failure: Mutex<Option<Error>>,
    /// The most recent operations, for hang diagnosis.
    recorder: FlightRecorder,
    /// Called once when the comm becomes aborted (see [`Comm::set_abort_hook`]).
    abort_hook: Mutex<Option<AbortHook>>,
    /// The lanes of this comm's windows (added by `Window::new`, pruned
    /// once dead): finalize waits for their asynchronous calls, an abort
    /// ends them. Copied out of the lock before any call into a window.
    windows: Mutex<Vec<Weak<dyn WindowLanes>>>,
    /// Operation hooks and the NaN check ([`crate::comm::hooks`]).
    hooks: hooks::Hooks,
    /// Store scope and count of its shrinks (see [`shrink`]).
    shrink: shrink::ShrinkState,
}

/// Works the watchdog's list holds before [`Comm::watch`] prunes it.
const OUTSTANDING_ROOM: usize = 64;

/// An application's function run when a comm is aborted.
pub type AbortHook = Box<dyn Fn(&Error) + Send + Sync>;

static GENERATED_NAMES: AtomicU64 = AtomicU64::new(0);
/// Longest comm name: room for nested split scopes under the store's key
/// limit (8 KiB).
const MAX_NAME_LEN: usize = 256;

impl Comm {
    /// Creates a communicator: resolves rank, size and store (bootstrapping
    /// from the environment when not given), creates the backend, and starts
    /// the progress and watchdog threads.
    pub fn new(backend_name: &str, device: Device, opts: CommOptions) -> Result<Arc<Comm>> {
        backends::check_name(backend_name)?;
        let cfg = config();
        let timeout = opts.timeout.unwrap_or(cfg.timeout);
        let boot = crate::bootstrap::from_environment(
            opts.rank,
            opts.world_size,
            opts.store.clone(),
            timeout,
        )?;
        let name = opts
            .name
            .clone()
            .unwrap_or_else(|| format!("comm{}", GENERATED_NAMES.fetch_add(1, Ordering::Relaxed)));
        Comm::with_store(
            backend_name,
            device,
            name,
            boot.rank,
            boot.world_size,
            boot.local_rank,
            boot.store,
            timeout,
            &opts,
            None,
            |init| backends::create(backend_name, init),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn with_store(
        backend_name: &str,
        device: Device,
        name: String,
        rank: i32,
        size: i32,
        local_rank: i32,
        base_store: StoreRef,
        timeout: Duration,
        opts: &CommOptions,
        root_ranks: Option<Vec<i32>>,
        make_backend: impl FnOnce(BackendInit) -> Result<Box<dyn Backend>>,
    ) -> Result<Arc<Comm>> {
        check_comm_name(&name)?;
        if size < 1 || rank < 0 || rank >= size {
            return Err(Error::invalid_argument(format!(
                "rank {rank} is outside a world of size {size}"
            )));
        }
        let scope = incarnation_scope(&base_store, &name, size)?;
        let store: StoreRef = Arc::new(crate::store::prefix::PrefixStore::new(
            &scope,
            base_store.clone(),
        ));
        let init = BackendInit {
            rank,
            size,
            local_rank,
            name: name.clone(),
            device,
            store,
            timeout,
            abort_on_error: opts.abort_on_error.unwrap_or(config().abort_on_error),
            hints: opts.hints.clone(),
            link: CommLink::default(),
        };
        let link = init.link.clone();
        crate::config::set_log_rank(rank);
        let backend = make_backend(init)?;
        let comm = Arc::new(Comm {
            label: format!("comm '{name}' (rank {rank}/{size})").into(),
            name,
            rank,
            size,
            device,
            backend_name: backend_name.to_string(),
            local_rank,
            timeout_ms: AtomicU64::new(timeout.as_millis().min(u64::MAX as u128) as u64),
            abort_on_error: AtomicBool::new(opts.abort_on_error.unwrap_or(config().abort_on_error)),
            root_ranks: root_ranks.unwrap_or_else(|| (0..size).collect()),
            backend_version: settings::c_version(backend.abilities().version()),
            base_store,
            backend,
            state: Mutex::new(State::Active),
            active: AtomicBool::new(true),
            ticker: watchdog::Ticker::default(),
            // Room for many calls between the prunings that `watch` makes
            // when the list is full (each a pass over it).
            outstanding: Mutex::new(Vec::with_capacity(OUTSTANDING_ROOM)),
            threads: Mutex::new(Vec::new()),
            first_failure: Mutex::new(None),
            recorder: FlightRecorder::new(config().flight_recorder),
            abort_hook: Mutex::new(None),
            windows: Mutex::new(Vec::new()),
            hooks: hooks::Hooks::from_environment(),
            shrink: shrink::ShrinkState::new(scope),
        });
        link.connect(Arc::downgrade(&comm) as Weak<dyn CommEvents>);
        comm.start_watchdog()?;
        crate::log_info!(
            "comm '{}' created: backend {} rank {}/{} timeout {} ms",
            comm.name,
            comm.backend_name,
            rank,
            size,
            timeout.as_millis()
        );
        Ok(comm)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    /// "comm 'name' (rank r/n)", as works and messages name this comm.
    pub fn label(&self) -> Arc<str> {
        self.label.clone()
    }
    pub fn rank(&self) -> i32 {
        self.rank
    }
    pub fn size(&self) -> i32 {
        self.size
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn backend_name(&self) -> &str {
        &self.backend_name
    }
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// The comm's backend (for windows, which live beside the comm).
    pub(crate) fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Puts a work issued outside [`Comm::submit`] (a window call) under the
    /// watchdog: past its timeout it fails and the comm is aborted.
    pub(crate) fn watch(&self, work: Arc<dyn Work>) {
        let mut outstanding = lock(&self.outstanding);
        // The watchdog prunes finished works only every WATCHDOG_PERIOD (an
        // operation no longer wakes it): prune here too, when the list
        // would grow, so that it stays bounded at an amortized O(1) a call.
        if outstanding.len() == outstanding.capacity() {
            outstanding.retain(|w| !w.status().is_finished());
        }
        outstanding.push(work);
    }

    /// Fails once the comm was finalized or aborted.
    #[inline]
    pub fn check_active(&self) -> Result<()> {
        // Acquire: pairs with the Release store made when the state left
        // Active; a caller that sees true issues as it did before.
        if self.active.load(Ordering::Acquire) {
            return Ok(());
        }
        self.inactive()
    }

    /// [`Comm::check_active`]'s error, once the comm left Active.
    #[cold]
    fn inactive(&self) -> Result<()> {
        match &*lock(&self.state) {
            State::Active => Ok(()),
            State::Finalized => Err(Error::invalid_usage(format!(
                "comm '{}' was finalized",
                self.name
            ))),
            State::Aborted(e) => Err(Error::new(
                ErrorKind::Aborted,
                format!("comm '{}' was aborted: {}", self.name, e.message),
            )),
        }
    }

    /// The failure that aborted the comm, if any.
    pub fn async_error(&self) -> Option<Error> {
        match &*lock(&self.state) {
            State::Aborted(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// Validates and issues `op`. With `async_op` off, returns after the
    /// operation completed (host) or was enqueued on the stream (device).
    /// A collective refused here (validation, the backend's check) is
    /// issued as a refusal instead (see [`Comm::refuse`]).
    pub fn submit(&self, mut op: Op, opts: &OpOptions) -> Result<Arc<dyn Work>> {
        self.check_active()?;
        if let Err(e) = self.admit(&mut op) {
            let collective = op.signature().is_some();
            return Err(if collective {
                self.refuse(op.name(), e)
            } else {
                e
            });
        }
        if self.hooks.active() {
            return hooks::submit_hooked(self, op, opts);
        }
        self.issue(op, opts, None, true)
    }

    /// [`Comm::submit`] for an operation already validated and checked by
    /// the backend (a persistent operation's set-up did it once);
    /// `may_be_device` false (known at set-up) skips the look for CUDA
    /// buffers to stage. Hooks, when any, take the full path.
    pub(crate) fn submit_checked(
        &self,
        op: Op,
        opts: &OpOptions,
        may_be_device: bool,
    ) -> Result<Arc<dyn Work>> {
        if self.hooks.active() {
            return hooks::submit_hooked(self, op, opts);
        }
        self.issue(op, opts, None, may_be_device)
    }

    #[inline(always)]
    fn admit(&self, op: &mut Op) -> Result<()> {
        op.validate(self.rank, self.size)
            .map_err(|e| e.context(op.name()))?;
        self.backend
            .abilities()
            .check(op)
            .map_err(|e| e.context(op.name()))
    }

    /// Runs `body`, a call that issues at least one collective on every
    /// rank when it succeeds (a collective, a family built on them); if it
    /// fails before issuing any operation, issues the refusal of `call` in
    /// its place (see [`Comm::refuse`]). A failure after the call issued
    /// an operation is left as it is: the operation's own failure reached
    /// the other ranks, or the call's collectives ran on every rank.
    pub fn refusing<T>(&self, call: &'static str, body: impl FnOnce() -> Result<T>) -> Result<T> {
        let issued = self.recorder.issued();
        body().map_err(|e| match self.recorder.issued() == issued {
            true => self.refuse(call, e),
            false => e,
        })
    }

    /// Issues the refusal of collective `call` (this rank's `error`) in the
    /// call's place, so that it fails on every rank instead of shifting
    /// every later collective by one (see [`crate::op::Refusal`]); returns
    /// the error for this rank's caller. Nothing is issued on an inactive
    /// comm (every later call fails anyway) or a comm of one rank.
    #[cold]
    pub(crate) fn refuse(&self, call: &'static str, error: Error) -> Error {
        if self.size == 1 || self.check_active().is_err() {
            return error;
        }
        let refusal = Op::Refused(crate::op::Refusal {
            call,
            rank: self.rank,
            error: error.clone(),
        });
        match self.issue(refusal, &OpOptions::default(), None, false) {
            Ok(_) => error,
            Err(told) => Error::new(
                error.kind,
                format!(
                    "{}; telling the other ranks failed: {}",
                    error.message, told.message
                ),
            ),
        }
    }

    /// Issues a validated `op`; `post` (hooked operations) runs once with
    /// its outcome (see [`crate::comm::hooks`] for when).
    #[inline(always)]
    pub(crate) fn issue(
        &self,
        op: Op,
        opts: &OpOptions,
        post: Option<hooks::PostHooks>,
        may_be_device: bool,
    ) -> Result<Arc<dyn Work>> {
        let seq = post
            .as_ref()
            .map_or_else(|| self.recorder.reserve(), |p| p.seq());
        let sub = Submission {
            opts,
            timeout: opts.timeout.unwrap_or(self.timeout()),
            may_be_device,
            label: &self.label,
            comm: self,
            seq,
            post: post.map(|p| Box::new(move |r: &Result<()>, done| p.run(r, done)) as _),
        };
        self.backend.submit(op, sub)
    }

    /// Stops the threads; queued operations that never ran fail with `err`.
    fn shutdown(&self, err: Error) {
        self.backend.stop(&err);
        self.ticker.stop();
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
        for t in threads {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }

    /// Waits for the asynchronous calls of the comm's live windows and for
    /// every issued operation, stops the threads and releases the backend.
    /// Fails if the comm was aborted, else if an operation failed, else if
    /// an asynchronous call of a live window failed.
    pub fn finalize(&self) -> Result<()> {
        match &*lock(&self.state) {
            State::Finalized => {
                return Err(Error::invalid_usage(format!(
                    "comm '{}' was already finalized",
                    self.name
                )))
            }
            State::Aborted(_) | State::Active => {}
        }
        // Windows first (their lanes run by themselves and never call back
        // into the comm; none of its locks is held meanwhile). A window freed
        // earlier is not waited for: its free ended its calls.
        let mut window_failure = None;
        for w in self.live_windows() {
            let failed = w.drain();
            window_failure = window_failure.or(failed);
        }
        self.backend.wait_idle();
        for w in lock(&self.outstanding).drain(..).collect::<Vec<_>>() {
            let _ = w.wait_blocking();
        }
        // Watched works still in the flight recorder's ring are on no list.
        for w in self.recorder.works() {
            if !w.known_finished() {
                let _ = w.wait_blocking();
            }
        }
        let aborted = self.async_error();
        self.mark_finalized();
        self.shutdown(Error::invalid_usage(format!(
            "comm '{}' was finalized",
            self.name
        )));
        let backend_result = self.backend.abilities().finalize();
        if let Some(e) = aborted {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("comm '{}' was aborted: {}", self.name, e.message),
            ));
        }
        if let Some(e) = lock(&self.first_failure).take() {
            return Err(Error::new(
                e.kind,
                format!("an operation of comm '{}' failed: {}", self.name, e.message),
            ));
        }
        if let Some(e) = window_failure {
            return Err(Error::new(
                e.kind,
                format!(
                    "an asynchronous window call of comm '{}' failed: {}",
                    self.name, e.message
                ),
            ));
        }
        backend_result
    }

    /// The flight recorder's table of this comm's recent operations (see
    /// [`crate::recorder`]); works in every state, aborted included.
    pub fn dump_flight_recorder(&self) -> String {
        self.recorder.dump(&self.label)
    }

    /// Aborts the comm: the backend stops, pending and later operations fail
    /// with `TC_ERR_ABORTED`, and so do the outstanding calls of its windows
    /// (whose backends are closed).
    pub fn abort(&self) {
        self.stop("aborted by the application", true);
    }

    /// Stops a comm that a reconfigure replaced, as [`Comm::abort`] does
    /// but without the abort hook (which moved to the new comm), saying
    /// `why` ("reconfigured (uuid 3)") to the calls it fails.
    pub(crate) fn retire(&self, why: &str) {
        self.stop(why, false);
        self.hooks.clear();
    }

    fn stop(&self, why: &str, run_hook: bool) {
        let err = Error::new(ErrorKind::Aborted, why);
        if self.enter_aborted(&err) && run_hook {
            self.run_abort_hook(&err);
        }
        self.backend.abilities().abort();
        self.abort_windows(&Error::new(
            ErrorKind::Aborted,
            format!("comm '{}' was {why}", self.name),
        ));
        self.shutdown(Error::new(
            ErrorKind::Aborted,
            format!("comm '{}' was aborted", self.name),
        ));
    }

    /// Moves an active comm to aborted with `err`; false if it was not
    /// active (the transition, and so the hook, happens once).
    fn enter_aborted(&self, err: &Error) -> bool {
        let mut state = lock(&self.state);
        if !matches!(*state, State::Active) {
            return false;
        }
        *state = State::Aborted(err.clone());
        self.active.store(false, Ordering::Release);
        true
    }

    fn mark_finalized(&self) {
        let mut state = lock(&self.state);
        *state = State::Finalized;
        self.active.store(false, Ordering::Release);
    }

    /// Sets the function called once when the comm becomes aborted: by a
    /// failed or timed-out operation (before the process abort when
    /// abort-on-error is on) or by [`Comm::abort`]; not by the abort of a
    /// comm destroyed without finalize. It runs on the thread that found the
    /// failure, with no lock of the comm held. `None` removes it.
    pub fn set_abort_hook(&self, hook: Option<AbortHook>) {
        *lock(&self.abort_hook) = hook;
    }

    fn run_abort_hook(&self, err: &Error) {
        // Taken out, so that the hook runs without the lock (it may set
        // another hook) and at most once.
        let hook = lock(&self.abort_hook).take();
        if let Some(hook) = hook {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(err))).is_err() {
                crate::log_warn!("the abort hook of comm '{}' panicked", self.name);
            }
        }
    }

    /// Called when the C handle is destroyed: aborts a comm that was not
    /// finalized, with a warning, and breaks the thread/comm reference cycle.
    pub fn release(&self) {
        lock(&self.abort_hook).take();
        self.hooks.clear();
        if !matches!(*lock(&self.state), State::Finalized) {
            crate::log_warn!(
                "comm '{}' destroyed without tc_comm_finalize; aborting it",
                self.name
            );
            self.abort();
        }
    }

    /// The backend's answer, with the comm and backend named.
    fn backend_context(&self, e: Error) -> Error {
        e.context(format!(
            "comm '{}' ({} backend)",
            self.name, self.backend_name
        ))
    }

    /// Registers memory with the backend (`tc_comm_register`); the comm must
    /// be active.
    pub fn register_memory(
        &self,
        buf: *mut std::ffi::c_void,
        bytes: usize,
    ) -> Result<*mut std::ffi::c_void> {
        self.check_active()?;
        self.registration("tc_comm_register")
            .and_then(|r| r.register(buf, bytes))
            .map_err(|e| self.backend_context(e))
    }

    /// Releases a registration; also after finalize or abort.
    pub fn deregister_memory(&self, handle: *mut std::ffi::c_void) -> Result<()> {
        self.registration("tc_comm_deregister")
            .and_then(|r| r.deregister(handle))
            .map_err(|e| self.backend_context(e))
    }

    /// Allocates memory from the backend (`tc_mem_alloc`); the comm must be
    /// active.
    pub fn alloc_memory(&self, bytes: usize) -> Result<*mut std::ffi::c_void> {
        self.check_active()?;
        self.allocator("tc_mem_alloc")
            .and_then(|a| a.alloc(bytes))
            .map_err(|e| self.backend_context(e))
    }

    /// Frees memory from [`Comm::alloc_memory`]; also after finalize or abort.
    pub fn free_memory(&self, ptr: *mut std::ffi::c_void) -> Result<()> {
        self.allocator("tc_mem_free")
            .and_then(|a| a.free(ptr))
            .map_err(|e| self.backend_context(e))
    }

    fn registration(&self, call: &str) -> Result<&dyn MemoryRegistration> {
        self.backend
            .abilities()
            .registration()
            .ok_or_else(|| lacks(&format!("memory registration ({call})")))
    }

    fn allocator(&self, call: &str) -> Result<&dyn MemoryAllocator> {
        self.backend
            .abilities()
            .allocator()
            .ok_or_else(|| lacks(&format!("its own allocator ({call})")))
    }

    /// Collective over this comm: every rank calls it with the same `ranks`.
    /// Returns None for an empty list; the caller must be in a non-empty list.
    pub fn split(&self, ranks: &[i32], name: &str, opts: CommOptions) -> Result<Option<Arc<Comm>>> {
        self.check_active()?;
        let mut seen = std::collections::HashSet::new();
        for (i, r) in ranks.iter().enumerate() {
            if *r < 0 || *r >= self.size {
                return Err(Error::invalid_argument(format!(
                    "argument 'ranks[{i}]': rank {r} is outside [0, {})",
                    self.size
                )));
            }
            if !seen.insert(*r) {
                return Err(Error::invalid_argument(format!(
                    "argument 'ranks[{i}]': rank {r} appears twice"
                )));
            }
        }
        let native = self.backend.splits_natively();
        if ranks.is_empty() {
            // Opting out still takes part in a native (collective) split.
            return if native {
                self.backend.split(None).map(|_| None)
            } else {
                Ok(None)
            };
        }
        let Some(new_rank) = ranks.iter().position(|r| *r == self.rank) else {
            return Err(Error::invalid_argument(format!(
                "argument 'ranks': this rank ({}) is not in the list; pass an empty list to opt out",
                self.rank
            )));
        };
        let child_store: StoreRef = Arc::new(crate::store::prefix::PrefixStore::new(
            &format!("{}/split", self.name),
            self.base_store.clone(),
        ));
        let child_opts = CommOptions {
            timeout: opts.timeout.or(Some(self.timeout())),
            abort_on_error: opts
                .abort_on_error
                .or(Some(self.abort_on_error.load(Ordering::Relaxed))),
            ..opts
        };
        Comm::with_store(
            &self.backend_name,
            self.device,
            name.to_string(),
            new_rank as i32,
            ranks.len() as i32,
            self.local_rank,
            child_store,
            child_opts.timeout.unwrap_or(self.timeout()),
            &child_opts,
            Some(self.child_root_ranks(ranks)),
            |init| {
                if native {
                    let child = self.backend.split(Some((ranks, init)))?;
                    child
                        .ok_or_else(|| Error::internal("the backend's split gave a member no comm"))
                } else {
                    backends::create(&self.backend_name, init)
                }
            },
        )
        .map(Some)
    }
}

/// The store scope of this creation of comm `name`: each creation of a
/// name gets its own, so that a comm made again under the same name (after
/// a failure, say) never reads the keys of its predecessor. Creation is
/// collective, so every rank of incarnation k has counted before any rank
/// can count for k + 1.
fn incarnation_scope(base_store: &StoreRef, name: &str, size: i32) -> Result<String> {
    let count = base_store.add(&format!("{name}/incarnations/{size}"), 1)?;
    let incarnation = (count - 1) / size as i64;
    Ok(format!("{name}/{size}.{incarnation}"))
}

/// Rejects a name that cannot prefix the comm's store keys.
fn check_comm_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || name.len() > MAX_NAME_LEN {
        return Err(Error::invalid_argument(format!(
            "comm name {:?} must be non-empty, at most {MAX_NAME_LEN} bytes (it prefixes \
             the comm's store keys) and contain no '/'",
            name.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}
