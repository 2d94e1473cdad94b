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

pub mod loader;
pub mod work;

use super::{Backend, BackendInit};
use crate::comm::{Op, OpOptions, Ptr};
use crate::cuda::{self, Device as CudaDevice, DeviceBuffer, EventPool, Stream as CudaStream};
use crate::error::{Error, ErrorKind, Result};
use crate::types::{DType, Device, Hints, PremulFactor, RedKind, ReduceOp};
use crate::work::Work;
use loader::*;
use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use work::{CudaWork, Shared};

/// Store key (under the comm's scope) of the unique id published by rank 0.
const UNIQUE_ID_KEY: &str = "nccl/unique_id";

const LIVE: u8 = 0;
const ABORTED: u8 = 1;
const RELEASED: u8 = 2;

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
        (Ok(_), Err(b)) => Err(b.context("the nccl backend is unavailable")),
        (Err(a), Err(b)) => Err(Error::new(
            ErrorKind::Unavailable,
            format!("the nccl backend is unavailable: {}; and {}", b.message, a.message),
        )),
    }
}

/// Hints understood by this backend (with or without a `nccl.` prefix).
struct Settings {
    config: Config,
    /// Keeps the strings `config` points to alive.
    _strings: Vec<CString>,
    high_priority_stream: bool,
}

fn parse_hints(hints: &Hints, version: i32, comm_name: &str) -> Result<Settings> {
    let mut config = Config::new(version);
    let mut strings = Vec::new();
    let mut high_priority_stream = false;
    let name = CString::new(comm_name).map_err(|_| Error::invalid_argument("comm name contains a NUL byte"))?;
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
                .ok_or_else(|| Error::invalid_argument(format!("hint {key}={value:?}: expected an integer in [{min}, {max}]")))
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
                let s = CString::new(value.as_str())
                    .map_err(|_| Error::invalid_argument(format!("hint {key}: value contains a NUL byte")))?;
                config.net_name = s.as_ptr();
                strings.push(s);
            }
            "high_priority_stream" => high_priority_stream = int(0, 1)? == 1,
            _ => crate::log_warn!("nccl backend: unknown hint {key:?} ignored"),
        }
    }
    Ok(Settings { config, _strings: strings, high_priority_stream })
}

/// A reduction op for one call; a PreMulSum op is destroyed on drop.
struct RedOp<'a> {
    op: NcclRedOp,
    owned: Option<(&'a Nccl, NcclComm)>,
}

impl Drop for RedOp<'_> {
    fn drop(&mut self) {
        if let Some((lib, comm)) = self.owned {
            if let Some(destroy) = lib.red_op_destroy {
                // SAFETY: created on this comm by ncclRedOpCreatePreMulSum;
                // NCCL allows destroying it once the calls using it returned.
                let _ = unsafe { destroy(self.op, comm) };
            }
        }
    }
}

pub struct NcclBackend {
    lib: &'static Nccl,
    comm: AtomicPtr<c_void>,
    state: AtomicU8,
    rank: i32,
    size: i32,
    name: String,
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
}

// SAFETY: the raw comm is only used under the rules documented above.
unsafe impl Send for NcclBackend {}
unsafe impl Sync for NcclBackend {}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl NcclBackend {
    fn create(init: BackendInit) -> Result<NcclBackend> {
        let lib = load()?;
        let count = cuda::device_count()?;
        if count < 1 {
            return Err(Error::unavailable("the nccl backend found no CUDA device (cuDeviceGetCount = 0)"));
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
        let settings = parse_hints(&init.hints, lib.version, &init.name)?;
        let device = CudaDevice::open(ordinal)?;
        let _ctx = device.scoped()?;
        let priority = if settings.high_priority_stream { device.stream_priority_range()?.1 } else { 0 };
        let stream = CudaStream::new(&device, priority)?;
        let events = EventPool::new(&device);
        let scratch = DeviceBuffer::zeroed(&device, 4)?;

        let id = Self::exchange_unique_id(lib, &init)?;
        let mut config = settings.config;
        let nonblocking = config.blocking == 0;
        let mut comm: NcclComm = std::ptr::null_mut();
        let started = Instant::now();
        // SAFETY: valid out-pointer and config (its strings live in
        // `settings`); the device's context is current.
        let r = unsafe { (lib.comm_init_rank_config)(&mut comm, init.size, id, init.rank, &mut config) };
        let what = format!("ncclCommInitRankConfig (comm '{}', rank {}/{}, device {ordinal}, NCCL {})", init.name, init.rank, init.size, lib.version_string());
        if r != NCCL_SUCCESS && !(nonblocking && r == NCCL_IN_PROGRESS) {
            let e = lib.error(r, &what, comm);
            if !comm.is_null() {
                // SAFETY: a comm handle NCCL returned despite the failure.
                unsafe { (lib.comm_abort)(comm) };
            }
            return Err(e);
        }
        let backend = NcclBackend {
            lib,
            comm: AtomicPtr::new(comm),
            state: AtomicU8::new(LIVE),
            rank: init.rank,
            size: init.size,
            name: init.name.clone(),
            timeout: init.timeout,
            nonblocking,
            device,
            stream,
            events,
            scratch,
            shared: Arc::new(Shared::default()),
            issue: Mutex::new(()),
        };
        if nonblocking {
            backend.settle(NCCL_IN_PROGRESS, &what)?;
        }
        crate::log_info!(
            "nccl comm '{}' rank {}/{} on device {} ready in {} ms ({}, NCCL {})",
            backend.name,
            backend.rank,
            backend.size,
            ordinal,
            started.elapsed().as_millis(),
            lib.origin,
            lib.version_string()
        );
        Ok(backend)
    }

    fn exchange_unique_id(lib: &Nccl, init: &BackendInit) -> Result<UniqueId> {
        let mut id = UniqueId { internal: [0; 128] };
        if init.rank == 0 {
            // SAFETY: valid out-pointer.
            lib.check(unsafe { (lib.get_unique_id)(&mut id) }, "ncclGetUniqueId", std::ptr::null_mut())?;
            init.store.set(UNIQUE_ID_KEY, &id.internal)?;
        } else {
            init.store
                .wait(&[UNIQUE_ID_KEY], Some(init.timeout))
                .map_err(|e| e.context(format!("rank {} waiting for rank 0's NCCL unique id of comm '{}'", init.rank, init.name)))?;
            let v = init.store.get(UNIQUE_ID_KEY)?;
            if v.len() != id.internal.len() {
                return Err(Error::internal(format!("the NCCL unique id in the store has {} bytes, not 128", v.len())));
            }
            id.internal.copy_from_slice(&v);
        }
        Ok(id)
    }

    fn comm(&self) -> NcclComm {
        self.comm.load(Ordering::Acquire)
    }

    fn check_live(&self) -> Result<()> {
        match self.state.load(Ordering::Acquire) {
            LIVE => Ok(()),
            _ => Err(self
                .shared
                .failure()
                .unwrap_or_else(|| Error::new(ErrorKind::Aborted, format!("nccl comm '{}' was aborted or finalized", self.name)))),
        }
    }

    /// Result of an NCCL call; on a non-blocking comm, waits (up to the
    /// comm's timeout) until an in-progress call settled.
    fn settle(&self, r: NcclResult, what: &str) -> Result<()> {
        if r != NCCL_IN_PROGRESS || !self.nonblocking {
            return self.lib.check(r, what, self.comm());
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            let mut state = NCCL_SUCCESS;
            // SAFETY: a live comm; valid out-pointer.
            let r2 = unsafe { (self.lib.comm_get_async_error)(self.comm(), &mut state) };
            self.lib.check(r2, "ncclCommGetAsyncError", self.comm())?;
            match state {
                NCCL_IN_PROGRESS if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(50)),
                NCCL_IN_PROGRESS => return Err(Error::timeout(format!("{what} still in progress after {} ms", self.timeout.as_millis()))),
                s => return self.lib.check(s, what, self.comm()),
            }
        }
    }

    fn dtype(&self, d: DType) -> Result<NcclDataType> {
        Ok(match d {
            DType::F32 => NCCL_FLOAT32,
            DType::F64 => NCCL_FLOAT64,
            DType::F16 => NCCL_FLOAT16,
            DType::BF16 => NCCL_BFLOAT16,
            DType::I8 => NCCL_INT8,
            DType::U8 | DType::Bool => NCCL_UINT8,
            DType::I32 => NCCL_INT32,
            DType::I64 => NCCL_INT64,
            DType::U32 => NCCL_UINT32,
            DType::U64 => NCCL_UINT64,
            DType::F8E4M3 | DType::F8E5M2 if !self.lib.has_fp8() => {
                return Err(Error::unsupported(format!(
                    "dtype {} needs NCCL 2.24 or newer; the loaded NCCL is {}",
                    d.name(),
                    self.lib.version_string()
                )))
            }
            DType::F8E4M3 => NCCL_FLOAT8_E4M3,
            DType::F8E5M2 => NCCL_FLOAT8_E5M2,
        })
    }

    /// The built-in NCCL op for `op` on `dtype`, or None for PREMUL_SUM;
    /// errors for what NCCL cannot do.
    fn builtin_op(&self, op: &ReduceOp, dtype: DType) -> Result<Option<NcclRedOp>> {
        let unsupported = |why: &str| Err(Error::unsupported(format!("reduce op {} on {}: {why}", op.kind.name(), dtype.name())));
        Ok(Some(match (op.kind, dtype) {
            (RedKind::BAnd | RedKind::BOr | RedKind::BXor, _) => return unsupported("NCCL has no bitwise reductions"),
            (RedKind::Sum | RedKind::Max, DType::Bool) => NCCL_MAX,
            (RedKind::Product | RedKind::Min, DType::Bool) => NCCL_MIN,
            (RedKind::Avg | RedKind::PremulSum, DType::Bool) => return unsupported("not defined on bool"),
            (RedKind::Sum, _) => NCCL_SUM,
            (RedKind::Product, _) => NCCL_PROD,
            (RedKind::Min, _) => NCCL_MIN,
            (RedKind::Max, _) => NCCL_MAX,
            (RedKind::Avg, _) => NCCL_AVG,
            (RedKind::PremulSum, DType::F16 | DType::BF16 | DType::F32 | DType::F64) => {
                if self.lib.red_op_create_pre_mul_sum.is_none() {
                    return unsupported("the loaded NCCL lacks ncclRedOpCreatePreMulSum");
                }
                return Ok(None);
            }
            (RedKind::PremulSum, _) => return unsupported("NCCL pre-multiplies float16, bfloat16, float32 and float64 only"),
        }))
    }

    /// The op for one call (creating a PreMulSum op when needed).
    fn red_op(&self, op: &ReduceOp, dtype: DType) -> Result<RedOp<'_>> {
        if let Some(b) = self.builtin_op(op, dtype)? {
            return Ok(RedOp { op: b, owned: None });
        }
        let create = self.lib.red_op_create_pre_mul_sum.ok_or_else(|| Error::unsupported("ncclRedOpCreatePreMulSum missing"))?;
        let dt = self.dtype(dtype)?;
        let mut host = [0u8; 8];
        let host_value = |f: f64, host: &mut [u8; 8]| match dtype {
            DType::F64 => host.copy_from_slice(&f.to_ne_bytes()),
            DType::F32 => host[..4].copy_from_slice(&(f as f32).to_ne_bytes()),
            DType::F16 => host[..2].copy_from_slice(&crate::backends::gloo::reduce::f32_to_f16(f as f32).to_ne_bytes()),
            _ => host[..2].copy_from_slice(&crate::backends::gloo::reduce::f32_to_bf16(f as f32).to_ne_bytes()),
        };
        let (scalar, residence) = match op.factor {
            PremulFactor::Host(f) => {
                host_value(f, &mut host);
                (host.as_mut_ptr() as *mut c_void, NCCL_SCALAR_HOST_IMMEDIATE)
            }
            PremulFactor::Pointer(p) => match cuda::memory_type(p)? {
                cuda::MemoryType::Host => {
                    // SAFETY: the caller passes one element of `dtype` at `p`.
                    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, host.as_mut_ptr(), dtype.size()) };
                    (host.as_mut_ptr() as *mut c_void, NCCL_SCALAR_HOST_IMMEDIATE)
                }
                _ => (p as *mut c_void, NCCL_SCALAR_DEVICE),
            },
        };
        let mut handle: NcclRedOp = 0;
        // SAFETY: `scalar` is read now (host) or by the kernel (device, the
        // caller keeps it alive); valid out-pointer.
        let r = unsafe { create(&mut handle, scalar, dt, residence, self.comm()) };
        self.lib.check(r, "ncclRedOpCreatePreMulSum", self.comm())?;
        Ok(RedOp { op: handle, owned: Some((self.lib, self.comm())) })
    }

    /// Runs `body` between ncclGroupStart and ncclGroupEnd (always ended).
    fn group(&self, body: impl FnOnce() -> Result<()>) -> Result<()> {
        // SAFETY: group calls take no arguments.
        self.lib.check(unsafe { (self.lib.group_start)() }, "ncclGroupStart", self.comm())?;
        let r = body();
        let end = unsafe { (self.lib.group_end)() };
        r?;
        self.settle(end, "ncclGroupEnd")
    }

    /// Issues `op` on stream `s`. The device's context is current.
    fn issue(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let (l, c, n, me) = (self.lib, self.comm(), self.size as usize, self.rank);
        let ck = |r: NcclResult, what: &str| self.settle(r, what);
        let at = |p: Ptr, elems: usize, d: DType| -> *mut c_void { unsafe { p.as_u8().add(elems * d.size()) as *mut c_void } };
        let offsets = |counts: &[usize]| -> Vec<usize> {
            let mut acc = 0;
            counts
                .iter()
                .map(|c| {
                    let o = acc;
                    acc += c;
                    o
                })
                .collect()
        };
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is a live comm.
        unsafe {
            match op {
                Op::Send { buf, count, dtype, peer } => ck((l.send)(buf.0, *count, self.dtype(*dtype)?, *peer, c, s), "ncclSend"),
                Op::Recv { buf, count, dtype, peer } => ck((l.recv)(buf.0, *count, self.dtype(*dtype)?, *peer, c, s), "ncclRecv"),
                Op::Batch { ops } => self.group(|| {
                    for p in ops {
                        let dt = self.dtype(p.dtype)?;
                        if p.is_send {
                            ck((l.send)(p.buf.0, p.count, dt, p.peer, c, s), "ncclSend")?;
                        } else {
                            ck((l.recv)(p.buf.0, p.count, dt, p.peer, c, s), "ncclRecv")?;
                        }
                    }
                    Ok(())
                }),
                Op::Broadcast { buf, count, dtype, root } => {
                    ck((l.broadcast)(buf.0, buf.0, *count, self.dtype(*dtype)?, *root, c, s), "ncclBroadcast")
                }
                Op::Reduce { buf, count, dtype, root, op } => {
                    let rop = self.red_op(op, *dtype)?;
                    ck((l.reduce)(buf.0, buf.0, *count, self.dtype(*dtype)?, rop.op, *root, c, s), "ncclReduce")
                }
                Op::AllReduce { buf, count, dtype, op } => {
                    let rop = self.red_op(op, *dtype)?;
                    ck((l.all_reduce)(buf.0, buf.0, *count, self.dtype(*dtype)?, rop.op, c, s), "ncclAllReduce")
                }
                Op::AllGather { outputs, input, count, dtype } => {
                    let dt = self.dtype(*dtype)?;
                    self.group(|| {
                        for (q, out) in outputs.iter().enumerate() {
                            let src = if q as i32 == me { input.0 } else { out.0 };
                            ck((l.broadcast)(src, out.0, *count, dt, q as c_int, c, s), "ncclBroadcast")?;
                        }
                        Ok(())
                    })
                }
                Op::AllGatherSingle { output, input, count, dtype } => {
                    ck((l.all_gather)(input.0, output.0, *count, self.dtype(*dtype)?, c, s), "ncclAllGather")
                }
                Op::AllGatherV { output, input, counts, dtype } => {
                    let dt = self.dtype(*dtype)?;
                    let offs = offsets(counts);
                    self.group(|| {
                        for q in 0..n {
                            if counts[q] == 0 {
                                continue;
                            }
                            let dst = at(*output, offs[q], *dtype);
                            let src = if q as i32 == me { input.0 } else { dst };
                            ck((l.broadcast)(src, dst, counts[q], dt, q as c_int, c, s), "ncclBroadcast")?;
                        }
                        Ok(())
                    })
                }
                Op::ReduceScatter { output, inputs, count, dtype, op } => {
                    let dt = self.dtype(*dtype)?;
                    let rop = self.red_op(op, *dtype)?;
                    self.group(|| {
                        for (q, inp) in inputs.iter().enumerate() {
                            let dst = if q as i32 == me { output.0 } else { std::ptr::null_mut() };
                            ck((l.reduce)(inp.0, dst, *count, dt, rop.op, q as c_int, c, s), "ncclReduce")?;
                        }
                        Ok(())
                    })
                }
                Op::ReduceScatterSingle { output, input, count, dtype, op } => {
                    let rop = self.red_op(op, *dtype)?;
                    ck((l.reduce_scatter)(input.0, output.0, *count, self.dtype(*dtype)?, rop.op, c, s), "ncclReduceScatter")
                }
                Op::ReduceScatterV { output, input, counts, dtype, op } => {
                    let dt = self.dtype(*dtype)?;
                    let rop = self.red_op(op, *dtype)?;
                    let offs = offsets(counts);
                    self.group(|| {
                        for q in 0..n {
                            if counts[q] == 0 {
                                continue;
                            }
                            let dst = if q as i32 == me { output.0 } else { std::ptr::null_mut() };
                            ck((l.reduce)(at(*input, offs[q], *dtype), dst, counts[q], dt, rop.op, q as c_int, c, s), "ncclReduce")?;
                        }
                        Ok(())
                    })
                }
                Op::AllToAll { outputs, inputs, count, dtype } => {
                    let dt = self.dtype(*dtype)?;
                    self.group(|| {
                        for q in 0..n {
                            ck((l.send)(inputs[q].0, *count, dt, q as c_int, c, s), "ncclSend")?;
                            ck((l.recv)(outputs[q].0, *count, dt, q as c_int, c, s), "ncclRecv")?;
                        }
                        Ok(())
                    })
                }
                Op::AllToAllSingle { output, input, count, dtype } => {
                    let dt = self.dtype(*dtype)?;
                    if let Some(a2a) = l.all_to_all {
                        return ck(a2a(input.0, output.0, *count, dt, c, s), "ncclAlltoAll");
                    }
                    self.group(|| {
                        for q in 0..n {
                            ck((l.send)(at(*input, q * count, *dtype), *count, dt, q as c_int, c, s), "ncclSend")?;
                            ck((l.recv)(at(*output, q * count, *dtype), *count, dt, q as c_int, c, s), "ncclRecv")?;
                        }
                        Ok(())
                    })
                }
                Op::AllToAllVSingle { output, output_counts, input, input_counts, dtype } => {
                    let dt = self.dtype(*dtype)?;
                    let (oo, io) = (offsets(output_counts), offsets(input_counts));
                    self.group(|| {
                        for q in 0..n {
                            if input_counts[q] > 0 {
                                ck((l.send)(at(*input, io[q], *dtype), input_counts[q], dt, q as c_int, c, s), "ncclSend")?;
                            }
                            if output_counts[q] > 0 {
                                ck((l.recv)(at(*output, oo[q], *dtype), output_counts[q], dt, q as c_int, c, s), "ncclRecv")?;
                            }
                        }
                        Ok(())
                    })
                }
                Op::Barrier => {
                    let p = self.scratch.ptr();
                    ck((l.all_reduce)(p, p, 1, NCCL_FLOAT32, NCCL_SUM, c, s), "ncclAllReduce (barrier)")
                }
                Op::Scatter { output, inputs, count, dtype, root } => {
                    let dt = self.dtype(*dtype)?;
                    self.group(|| {
                        if me == *root {
                            for (q, inp) in inputs.iter().enumerate() {
                                if q as i32 != me {
                                    ck((l.send)(inp.0, *count, dt, q as c_int, c, s), "ncclSend")?;
                                }
                            }
                        } else {
                            ck((l.recv)(output.0, *count, dt, *root, c, s), "ncclRecv")?;
                        }
                        Ok(())
                    })?;
                    if me == *root {
                        cuda::memcpy_async(output.0, inputs[me as usize].0, count * dtype.size(), s as cuda::RawStream)?;
                    }
                    Ok(())
                }
                Op::Gather { outputs, input, count, dtype, root } => {
                    let dt = self.dtype(*dtype)?;
                    self.group(|| {
                        if me == *root {
                            for (q, out) in outputs.iter().enumerate() {
                                if q as i32 != me {
                                    ck((l.recv)(out.0, *count, dt, q as c_int, c, s), "ncclRecv")?;
                                }
                            }
                        } else {
                            ck((l.send)(input.0, *count, dt, *root, c, s), "ncclSend")?;
                        }
                        Ok(())
                    })?;
                    if me == *root {
                        cuda::memcpy_async(outputs[me as usize].0, input.0, count * dtype.size(), s as cuda::RawStream)?;
                    }
                    Ok(())
                }
            }
        }
    }

    /// Releases the NCCL comm once: abort (not waiting for peers) or
    /// finalize + destroy.
    fn release(&self, abort: bool) -> Result<()> {
        let from = self.state.swap(RELEASED, Ordering::AcqRel);
        if from == RELEASED {
            return Ok(());
        }
        let c = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if c.is_null() {
            return Ok(());
        }
        let _ctx = self.device.scoped();
        // SAFETY: `c` is the live comm, released exactly once (the swap above).
        unsafe {
            if abort || from == ABORTED {
                return self.lib.check((self.lib.comm_abort)(c), "ncclCommAbort", std::ptr::null_mut());
            }
            let r = (self.lib.comm_finalize)(c);
            let fin = if r == NCCL_IN_PROGRESS || r == NCCL_SUCCESS {
                // Non-blocking comms finish finalizing asynchronously.
                let deadline = Instant::now() + self.timeout;
                loop {
                    let mut st = NCCL_SUCCESS;
                    let r2 = (self.lib.comm_get_async_error)(c, &mut st);
                    if r2 != NCCL_SUCCESS || st != NCCL_IN_PROGRESS || Instant::now() > deadline {
                        break if r2 != NCCL_SUCCESS { r2 } else { st };
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            } else {
                r
            };
            if fin != NCCL_SUCCESS {
                let e = self.lib.error(fin, "ncclCommFinalize", c);
                (self.lib.comm_abort)(c);
                return Err(e);
            }
            self.lib.check((self.lib.comm_destroy)(c), "ncclCommDestroy", std::ptr::null_mut())
        }
    }
}

impl Backend for NcclBackend {
    fn check(&self, op: &Op) -> Result<()> {
        let dtype = match op.signature() {
            Some((Some(d), _, _)) => Some(d),
            _ => match op {
                Op::Send { dtype, .. } | Op::Recv { dtype, .. } => Some(*dtype),
                Op::Batch { ops } => {
                    for p in ops {
                        self.dtype(p.dtype)?;
                    }
                    None
                }
                _ => None,
            },
        };
        if let Some(d) = dtype {
            self.dtype(d)?;
            if let Some(r) = op.reduce_op() {
                self.builtin_op(r, d)?;
            }
        }
        Ok(())
    }

    fn enqueue(&self, op: &Op, opts: &OpOptions, timeout: Duration) -> Result<Option<Arc<dyn Work>>> {
        let _serial = lock(&self.issue);
        self.check_live()?;
        let _ctx = self.device.scoped()?;
        let user = opts.stream as cuda::RawStream;
        let captured = match cuda::capture_status(user)? {
            cuda::Capture::None => false,
            cuda::Capture::Active => true,
            cuda::Capture::Invalidated => {
                return Err(Error::invalid_usage("the stream's graph capture was invalidated by an earlier error"))
            }
        };
        let end = self.events.get()?;
        let (stream, start) = if captured {
            (user, None)
        } else {
            let start = self.events.get()?;
            let stream = if opts.async_op {
                start.record(user)?;
                cuda::stream_wait_event(self.stream.raw(), &start)?;
                self.stream.raw()
            } else {
                user
            };
            // On the internal stream this re-records the event the stream
            // just waited for: the wait keeps the earlier record.
            start.record(stream)?;
            (stream, Some(start))
        };
        self.issue(op, stream as *mut c_void)?;
        end.record(stream)?;
        let description = format!("{} on nccl comm '{}' (rank {}/{})", op.name(), self.name, self.rank, self.size);
        Ok(Some(Arc::new(CudaWork::new(description, timeout, captured, start, end, self.shared.clone()))))
    }

    fn run(&self, op: &Op, _timeout: Duration) -> Result<()> {
        Err(Error::internal(format!("{} reached the host path of the nccl backend", op.name())))
    }

    fn abort(&self) {
        self.shared.fail(Error::new(ErrorKind::Aborted, format!("nccl comm '{}' was aborted", self.name)));
        let _ = self.state.compare_exchange(LIVE, ABORTED, Ordering::AcqRel, Ordering::Acquire);
        if let Err(e) = self.release(true) {
            crate::log_warn!("{}", e.message);
        }
    }

    fn finalize(&self) -> Result<()> {
        self.release(false)
    }

    fn async_error(&self) -> Option<Error> {
        if self.state.load(Ordering::Acquire) != LIVE {
            return None;
        }
        let mut st = NCCL_SUCCESS;
        // SAFETY: read-only query on the live comm.
        let r = unsafe { (self.lib.comm_get_async_error)(self.comm(), &mut st) };
        let code = if r != NCCL_SUCCESS { r } else { st };
        if code == NCCL_SUCCESS || code == NCCL_IN_PROGRESS {
            return None;
        }
        let mut e = self.lib.error(code, &format!("nccl comm '{}' (rank {}/{})", self.name, self.rank, self.size), self.comm());
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
        // A comm neither finalized nor aborted: abort it (never block here).
        if let Err(e) = self.release(true) {
            crate::log_warn!("{}", e.message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_map_onto_config_fields() {
        let hints: Hints = vec![
            ("blocking".into(), "0".into()),
            ("nccl.max_ctas".into(), "8".into()),
            ("net_name".into(), "Socket".into()),
            ("gloo.iface".into(), "lo".into()),
            ("mystery".into(), "1".into()),
        ];
        let s = parse_hints(&hints, version_code(2, 28, 9), "c0").unwrap();
        assert_eq!(s.config.blocking, 0);
        assert_eq!(s.config.max_ctas, 8);
        assert_eq!(s.config.min_ctas, NCCL_CONFIG_UNDEF_INT);
        let net = unsafe { std::ffi::CStr::from_ptr(s.config.net_name) };
        assert_eq!(net.to_str().unwrap(), "Socket");
        let name = unsafe { std::ffi::CStr::from_ptr(s.config.comm_name) };
        assert_eq!(name.to_str().unwrap(), "c0");
    }

    #[test]
    fn malformed_hint_is_an_invalid_argument() {
        for (k, v) in [("blocking", "yes"), ("min_ctas", "0"), ("nccl.split_share", "2"), ("high_priority_stream", "")] {
            let e = parse_hints(&vec![(k.to_string(), v.to_string())], 22809, "c").err().expect("must fail");
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{k}={v}");
            assert!(e.message.contains(k), "{}", e.message);
        }
    }
}
