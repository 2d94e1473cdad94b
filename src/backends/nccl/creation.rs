//! Creating an NCCL comm: the hints mapped onto ncclConfig, the unique id
//! exchanged through the comm's store, ncclCommInitRankConfig (watched by
//! [`InitGuard`] while it blocks), and the children of ncclCommSplit.

use super::checks::Staging;
use super::lifecycle::{Slot, LIVE};
use super::loader::{self, *};
use super::refusal::Refusals;
use super::work::Shared;
use super::{load, NcclBackend};
use crate::backends::BackendInit;
use crate::cuda::{self, Device as CudaDevice, DeviceBuffer, EventPool, Stream as CudaStream};
use crate::error::{Error, Result};
use crate::types::{Device, Hints};
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Store key (under the comm's scope) of the unique id published by rank 0.
const UNIQUE_ID_KEY: &str = "nccl/unique_id";

/// Watches a blocking comm creation from another thread: if it has not
/// returned within the comm's timeout (a rank never arrived), it aborts the
/// process with a message when abort-on-error is on, and otherwise warns
/// that the call cannot be interrupted (the hint `blocking=0` makes creation
/// fail at the timeout instead). Dropping the guard ends the watch.
struct InitGuard {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InitGuard {
    fn start(what: &str, timeout: Duration, abort_on_error: bool) -> InitGuard {
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let what = what.to_string();
        let thread = std::thread::Builder::new()
            .name("tc-nccl-init-guard".into())
            .spawn(move || {
                if finished.recv_timeout(timeout) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                    return;
                }
                let message = format!(
                    "{what} has not returned after the comm's timeout ({} ms): a rank did not arrive",
                    timeout.as_millis()
                );
                if abort_on_error {
                    crate::config::log(
                        crate::config::Level::Warn,
                        &format!("{message}; aborting the process (abort_on_error; TORCHCOMM_ABORT_ON_ERROR=0 to keep waiting)"),
                    );
                    std::process::abort();
                }
                crate::log_warn!("{message}; a blocking NCCL creation cannot be interrupted (the hint blocking=0 makes it fail at the timeout instead)");
                let _ = finished.recv();
            })
            .ok();
        InitGuard {
            done: Some(done),
            thread,
        }
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Hints understood by this backend (with or without a `nccl.` prefix).
pub(super) struct Settings {
    pub(super) config: Config,
    /// Keeps the strings `config` points to alive.
    _strings: Vec<CString>,
    pub(super) high_priority_stream: bool,
}

pub(super) fn parse_hints(hints: &Hints, version: i32, comm_name: &str) -> Result<Settings> {
    let mut config = Config::new(version);
    let mut strings = Vec::new();
    let mut high_priority_stream = false;
    let name = CString::new(comm_name)
        .map_err(|_| Error::invalid_argument("comm name contains a NUL byte"))?;
    config.comm_name = name.as_ptr();
    strings.push(name);
    for (key, value) in hints {
        let k = match key.strip_prefix("nccl.") {
            Some(k) => k,
            // Hints addressed to another backend ("gloo.iface") are not ours.
            None if key.contains('.') => continue,
            None => key.as_str(),
        };
        let int = |min: i32, max: i32| -> Result<c_int> {
            value
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|v| (min..=max).contains(v))
                .ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "hint {key}={value:?}: expected an integer in [{min}, {max}]"
                    ))
                })
        };
        match k {
            "blocking" => config.blocking = int(0, 1)?,
            "cga_cluster_size" => config.cga_cluster_size = int(0, 8)?,
            "min_ctas" => config.min_ctas = int(1, 64)?,
            "max_ctas" => config.max_ctas = int(1, 64)?,
            "split_share" => config.split_share = int(0, 1)?,
            "traffic_class" => config.traffic_class = int(0, i32::MAX)?,
            "collnet_enable" => config.collnet_enable = int(0, 1)?,
            "cta_policy" => config.cta_policy = int(0, 255)?,
            "shrink_share" => config.shrink_share = int(0, 1)?,
            "nvls_ctas" => config.nvls_ctas = int(1, 64)?,
            "n_channels_per_net_peer" => config.n_channels_per_net_peer = int(1, 64)?,
            "nvlink_centric_sched" => config.nvlink_centric_sched = int(0, 1)?,
            "net_name" => {
                let s = CString::new(value.as_str()).map_err(|_| {
                    Error::invalid_argument(format!("hint {key}: value contains a NUL byte"))
                })?;
                config.net_name = s.as_ptr();
                strings.push(s);
            }
            "high_priority_stream" => high_priority_stream = int(0, 1)? == 1,
            _ => crate::log_warn!("nccl backend: unknown hint {key:?} ignored"),
        }
    }
    Ok(Settings {
        config,
        _strings: strings,
        high_priority_stream,
    })
}

impl NcclBackend {
    pub(super) fn create(init: BackendInit) -> Result<NcclBackend> {
        let lib = load()?;
        let count = cuda::device_count()?;
        if count < 1 {
            return Err(Error::unavailable(
                "the nccl backend found no CUDA device (cuDeviceGetCount = 0)",
            ));
        }
        let ordinal = match init.device {
            Device::Cuda(Some(i)) if (i as i32) < count => i as i32,
            Device::Cuda(Some(i)) => {
                return Err(Error::invalid_argument(format!("argument 'device.index': device {i} does not exist ({count} visible)")))
            }
            Device::Cuda(None) => init.local_rank.max(0) % count,
            Device::Cpu => {
                return Err(Error::invalid_argument(
                    "argument 'device': the nccl backend needs a CUDA device ({TC_DEVICE_CUDA, index}); use \"gloo\" for host memory",
                ))
            }
        };
        let device = CudaDevice::open(ordinal)?;
        let id = Self::exchange_unique_id(lib, &init)?;
        let (size, rank) = (init.size, init.rank);
        Self::build(
            lib,
            device,
            init,
            "ncclCommInitRankConfig",
            None,
            |config, what| {
                let mut comm: NcclComm = std::ptr::null_mut();
                // SAFETY: valid out-pointer and config (its strings outlive the
                // call). NCCL writes the handle before it returns, also for a
                // non-blocking comm (whose creation then goes on in NCCL).
                let r = unsafe { (lib.comm_init_rank_config)(&mut comm, size, id, rank, config) };
                let in_progress_ok = config.blocking == 0;
                if r == NCCL_SUCCESS || (in_progress_ok && r == NCCL_IN_PROGRESS) {
                    return Ok(comm);
                }
                let e = lib.error(r, what, comm);
                if !comm.is_null() {
                    // SAFETY: a comm handle NCCL returned despite the failure.
                    unsafe { (lib.comm_abort)(comm) };
                }
                Err(e)
            },
        )
    }

    /// Makes the backend around the NCCL comm that `make_comm` creates (by
    /// ncclCommInitRankConfig or ncclCommSplit) with the config from the
    /// comm's hints, on `device` (current during the call). `make_comm`
    /// returns the handle once NCCL gave it (a non-blocking comm may still be
    /// initializing: it is polled here). `split_of` is the parent's mode for
    /// a split: NCCL runs a split as a job of the parent, so the call blocks
    /// as the parent does, and the child inherits the parent's mode unless a
    /// hint sets `blocking`.
    pub(super) fn build(
        lib: &'static Nccl,
        device: Arc<CudaDevice>,
        init: BackendInit,
        call: &str,
        split_of: Option<bool>,
        make_comm: impl FnOnce(&mut loader::Config, &str) -> Result<NcclComm>,
    ) -> Result<NcclBackend> {
        let settings = parse_hints(&init.hints, lib.version, &init.name)?;
        let _ctx = device.scoped()?;
        let ordinal = device.ordinal;
        let priority = if settings.high_priority_stream {
            device.stream_priority_range()?.1
        } else {
            0
        };
        let stream = CudaStream::new(&device, priority)?;
        let events = EventPool::new(&device);
        let scratch = DeviceBuffer::zeroed(&device, 4)?;

        let mut config = settings.config;
        let (nonblocking, call_blocks) = blocking_mode(&mut config, split_of);
        let started = Instant::now();
        let what = format!(
            "{call} (comm '{}', rank {}/{}, device {ordinal}, NCCL {})",
            init.name,
            init.rank,
            init.size,
            lib.version_string()
        );
        // A blocking creation waits inside NCCL for every rank and cannot be
        // interrupted; the guard makes a missing rank visible (and, with
        // abort-on-error, ends the process) instead of a silent hang.
        let guard = call_blocks.then(|| InitGuard::start(&what, init.timeout, init.abort_on_error));
        let made = make_comm(&mut config, &what);
        drop(guard);
        let comm = made?;
        let backend = NcclBackend {
            lib,
            comm: AtomicPtr::new(comm),
            slot: Mutex::new(Slot { users: 0 }),
            idle: Condvar::new(),
            state: AtomicU8::new(LIVE),
            rank: init.rank,
            size: init.size,
            name: init.name.clone(),
            label: format!(
                "nccl comm '{}' (rank {}/{})",
                init.name, init.rank, init.size
            )
            .into(),
            timeout: init.timeout,
            nonblocking,
            device,
            stream,
            events,
            scratch,
            shared: Arc::new(Shared::with_refusals(Refusals::new(
                init.store.clone(),
                init.rank,
                init.size,
            ))),
            issue: Mutex::new(()),
            poll: Mutex::new(()),
            revoked: AtomicBool::new(false),
            revoking: Mutex::new(()),
            registrations: Mutex::new(HashMap::new()),
            allocations: Mutex::new(HashMap::new()),
            staging: Mutex::new(Staging::default()),
        };
        if nonblocking {
            backend.settle(NCCL_IN_PROGRESS, &what)?;
        }
        backend.log_ready(started, call);
        Ok(backend)
    }

    /// Logs the comm ready, with the time its creation took.
    fn log_ready(&self, started: Instant, call: &str) {
        crate::log_info!(
            "nccl comm '{}' rank {}/{} on device {} ready in {} ms ({}, {}, NCCL {})",
            self.name,
            self.rank,
            self.size,
            self.device.ordinal,
            started.elapsed().as_millis(),
            call,
            self.lib.origin,
            self.lib.version_string()
        );
    }

    /// The size and rank NCCL gave the comm.
    pub(super) fn count_and_rank(&self) -> Result<(i32, i32)> {
        let (mut count, mut rank) = (0, 0);
        // SAFETY: a live comm (the caller holds a use); valid out-pointers.
        self.call("ncclCommCount", |c| unsafe {
            (self.lib.comm_count)(c, &mut count)
        })?;
        self.call("ncclCommUserRank", |c| unsafe {
            (self.lib.comm_user_rank)(c, &mut rank)
        })?;
        Ok((count, rank))
    }

    pub(super) fn exchange_unique_id(lib: &Nccl, init: &BackendInit) -> Result<UniqueId> {
        let mut id = UniqueId { internal: [0; 128] };
        if init.rank == 0 {
            // SAFETY: valid out-pointer.
            lib.check(
                unsafe { (lib.get_unique_id)(&mut id) },
                "ncclGetUniqueId",
                std::ptr::null_mut(),
            )?;
            init.store.set(UNIQUE_ID_KEY, &id.internal)?;
        } else {
            init.store
                .wait(&[UNIQUE_ID_KEY], Some(init.timeout))
                .map_err(|e| {
                    e.context(format!(
                        "rank {} waiting for rank 0's NCCL unique id of comm '{}'",
                        init.rank, init.name
                    ))
                })?;
            let v = init.store.get(UNIQUE_ID_KEY)?;
            if v.len() != id.internal.len() {
                return Err(Error::internal(format!(
                    "the NCCL unique id in the store has {} bytes, not 128",
                    v.len()
                )));
            }
            id.internal.copy_from_slice(&v);
        }
        Ok(id)
    }

    /// ncclCommSplit (or ncclCommShrink, through `make`) over this comm
    /// (the caller holds a use and the issue lock); returns the child handle
    /// (NULL for NOCOLOR) once NCCL reports the job done. NCCL writes the
    /// handle only then, from its own thread when this comm is non-blocking
    /// (the call itself returns with the handle still NULL), so the slot
    /// lives on the heap and is freed only once NCCL is done with it; when
    /// the wait stops early (timeout, abort) it is left to NCCL, one
    /// pointer's worth. `make(comm, slot)` makes the NCCL call; a NULL
    /// config inherits this comm's, a config must outlive the call.
    pub(super) fn split_child(
        &self,
        what: &str,
        make: impl FnOnce(NcclComm, *mut NcclComm) -> NcclResult,
    ) -> Result<NcclComm> {
        if !self.is_live() {
            return Err(self.closed_error().context(what));
        }
        let slot: *mut AtomicPtr<c_void> =
            Box::into_raw(Box::new(AtomicPtr::new(std::ptr::null_mut())));
        // The slot stays valid until NCCL reported the job done (AtomicPtr
        // has the layout of a pointer).
        let r = make(self.comm(), slot.cast());
        // On a non-blocking comm NCCL (2.28, 2.29) answers ncclSuccess while
        // the job still runs (its group's in-progress is not passed on):
        // only this comm's state says when it ended and the slot is written.
        let r = match r {
            NCCL_SUCCESS if self.nonblocking => NCCL_IN_PROGRESS,
            r => r,
        };
        let r = self.settled(r, what)?;
        // SAFETY: NCCL reported the split done: nothing writes the slot now.
        let child = unsafe { Box::from_raw(slot) }.load(Ordering::Acquire);
        if r != NCCL_SUCCESS {
            let e = self.lib.error(r, what, self.detail_comm());
            if !child.is_null() {
                // SAFETY: a comm handle NCCL returned despite the failure.
                unsafe { (self.lib.comm_abort)(child) };
            }
            return Err(e);
        }
        Ok(child)
    }
}

/// Settles a comm's mode: a split inherits its parent's unless a hint set
/// `blocking`. Returns whether the comm is non-blocking and whether its
/// creation call blocks (a split blocks as its parent does).
fn blocking_mode(config: &mut loader::Config, split_of: Option<bool>) -> (bool, bool) {
    if let (Some(parent_nonblocking), NCCL_CONFIG_UNDEF_INT) = (split_of, config.blocking) {
        config.blocking = if parent_nonblocking { 0 } else { 1 };
    }
    let nonblocking = config.blocking == 0;
    let call_blocks = !split_of.unwrap_or(nonblocking);
    (nonblocking, call_blocks)
}
