//! Device-memory pieces shared by the composite operations that are built
//! from several collectives (`tc_broadcast_coalesced`, the reducer, sparse
//! all-reduce): telling device buffers from host ones, scratch memory from
//! the comm's allocator, small host-side exchanges on nccl comms (NCCL only
//! reads device memory), and one work that covers everything a call
//! enqueued on a stream.

use crate::comm::{Comm, Op, OpOptions, Ptr};
use crate::cuda::{self, MemoryType};
use crate::error::{Error, Result};
use crate::op::{for_each_buffer, Use};
use crate::types::Device;
use crate::util::lock;
use crate::work::{Work, WorkStatus};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether `ptr` is device (or managed) memory. False without a CUDA driver.
pub fn is_device(ptr: Ptr) -> Result<bool> {
    if ptr.is_null() || !cuda::may_hold_device_memory() {
        return Ok(false);
    }
    Ok(cuda::memory_type(ptr.0)? != MemoryType::Host)
}

/// The device that `ptr` (device memory) lives on, its context retained.
pub fn device_of(ptr: Ptr) -> Result<Arc<cuda::Device>> {
    let mut ordinal: i32 = 0;
    let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    // SAFETY: the attribute is an int; `ptr` is only inspected.
    cuda::check(
        unsafe {
            cuda::drv::cuPointerGetAttribute(
                &mut ordinal as *mut i32 as *mut c_void,
                attr as u32,
                ptr.0 as sys::CUdeviceptr,
            )
        },
        "cuPointerGetAttribute(DEVICE_ORDINAL)",
    )?;
    cuda::Device::open(ordinal)
}

/// The first device buffer among `ptrs` (non-empty ones only), and its
/// device; `None` when every buffer is host memory.
pub fn first_device(ptrs: impl Iterator<Item = (Ptr, usize)>) -> Result<Option<Arc<cuda::Device>>> {
    for (p, bytes) in ptrs {
        if bytes > 0 && is_device(p)? {
            return device_of(p).map(Some);
        }
    }
    Ok(None)
}

/// Refuses a capturing stream: these operations allocate, copy and
/// synchronize on the host, which a CUDA graph cannot replay.
pub fn refuse_capture(stream: *mut c_void, what: &str) -> Result<()> {
    if cuda::capture_status(stream as cuda::RawStream)? != cuda::Capture::None {
        return Err(Error::unsupported(format!(
            "{what} with device memory cannot be captured into a CUDA graph (the stream is capturing)"
        )));
    }
    Ok(())
}

/// Device memory from the comm's allocator (`tc_mem_alloc`), freed on drop.
pub struct CommScratch {
    comm: Arc<Comm>,
    ptr: *mut c_void,
    pub bytes: usize,
}

unsafe impl Send for CommScratch {}
unsafe impl Sync for CommScratch {}

impl CommScratch {
    pub fn new(comm: &Arc<Comm>, bytes: usize) -> Result<CommScratch> {
        let ptr = comm.alloc_memory(bytes.max(1))?;
        Ok(CommScratch {
            comm: comm.clone(),
            ptr,
            bytes,
        })
    }
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }
    pub fn at(&self, offset: usize) -> *mut c_void {
        // SAFETY: callers stay within `bytes`.
        unsafe { self.ptr.cast::<u8>().add(offset).cast() }
    }
}

impl Drop for CommScratch {
    fn drop(&mut self) {
        if let Err(e) = self.comm.free_memory(self.ptr) {
            crate::log_warn!("freeing a scratch buffer: {}", e.message);
        }
    }
}

/// Runs `op`, whose buffers are host memory, to completion. On a device
/// comm the buffers go through device scratch memory, copied in and out on
/// `stream`, which is synchronized (the collective is ordered after the
/// caller's earlier work on `stream`, as NCCL needs every rank to issue its
/// collectives in one order).
pub fn host_collective(comm: &Arc<Comm>, mut op: Op, stream: *mut c_void) -> Result<()> {
    let sync = OpOptions {
        stream,
        ..OpOptions::default()
    };
    if comm.device() == Device::Cpu {
        return comm.submit(op, &sync).map(|_| ());
    }
    let mut copies: Vec<(Ptr, CommScratch, Use)> = Vec::new();
    for_each_buffer(&mut op, comm.rank(), comm.size(), &mut |p, bytes, usage| {
        if bytes > 0 {
            let scratch = CommScratch::new(comm, bytes)?;
            copies.push((*p, scratch, usage));
            *p = Ptr(copies.last().unwrap().1.ptr());
        }
        Ok(())
    })?;
    let Some(first) = copies.first() else {
        return comm.submit(op, &sync).map(|_| ());
    };
    let device = device_of(Ptr(first.1.ptr()))?;
    let _current = device.scoped()?;
    let s = stream as cuda::RawStream;
    for (host, scratch, usage) in &copies {
        if *usage != Use::Out {
            cuda::memcpy_async(scratch.ptr(), host.0, scratch.bytes, s)?;
        }
    }
    let issued = comm.submit(op, &sync);
    let mut first_error = issued.err();
    if first_error.is_none() {
        for (host, scratch, usage) in &copies {
            if *usage != Use::In {
                if let Err(e) = cuda::memcpy_async(host.0, scratch.ptr(), scratch.bytes, s) {
                    first_error = Some(e);
                    break;
                }
            }
        }
    }
    // The scratch buffers are freed on return: the stream must be past them.
    let synced = cuda::stream_synchronize(s);
    match first_error {
        Some(e) => Err(e),
        None => synced,
    }
}

/// Keeps alive what a stream still uses (scratch buffers, a private stream)
/// until the work's end event completed.
pub type KeepAlive = Box<dyn Send + Sync>;

/// The work of a composite call enqueued on one stream: done when the event
/// recorded after its last piece completed. Dropping it before then hands
/// what the stream still uses to a thread that frees it afterwards.
pub struct StreamWork {
    name: &'static str,
    comm: Arc<Comm>,
    end: Arc<cuda::Event>,
    keep: Mutex<Option<KeepAlive>>,
}

impl StreamWork {
    /// `end` must have been recorded after every piece of the call.
    pub fn new(name: &'static str, comm: &Arc<Comm>, end: cuda::Event, keep: KeepAlive) -> Self {
        StreamWork {
            name,
            comm: comm.clone(),
            end: Arc::new(end),
            keep: Mutex::new(Some(keep)),
        }
    }

    fn done(end: &cuda::Event) -> Result<bool> {
        let _g = end.pool_device().scoped()?;
        end.query()
    }

    fn comm_failure(&self) -> Option<Error> {
        self.comm.async_error().map(|e| {
            Error::new(
                e.kind,
                format!(
                    "{} on comm '{}': {}",
                    self.name,
                    self.comm.name(),
                    e.message
                ),
            )
        })
    }
}

impl Work for StreamWork {
    fn status(&self) -> WorkStatus {
        match Self::done(&self.end) {
            Ok(true) => WorkStatus::Completed,
            Ok(false) if self.comm_failure().is_some() => WorkStatus::Error,
            Ok(false) => WorkStatus::InProgress,
            Err(_) => WorkStatus::Error,
        }
    }

    fn wait(&self, stream: *mut c_void) -> Result<()> {
        let _g = self.end.pool_device().scoped()?;
        cuda::stream_wait_event(stream as cuda::RawStream, &self.end)
    }

    fn wait_blocking(&self) -> Result<()> {
        let mut pause = Duration::from_micros(20);
        loop {
            if Self::done(&self.end)? {
                return Ok(());
            }
            if let Some(e) = self.comm_failure() {
                return Err(e);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    fn check_timeout(&self, _now: Instant) -> Option<Error> {
        // Each collective of the call has its own work, which the comm's
        // watchdog times out; this one only joins them.
        None
    }
}

impl Drop for StreamWork {
    fn drop(&mut self) {
        let keep = lock(&self.keep).take();
        let Some(keep) = keep else { return };
        if matches!(Self::done(&self.end), Ok(true) | Err(_)) {
            return;
        }
        let end = self.end.clone();
        let comm = self.comm.clone();
        let spawned = std::thread::Builder::new()
            .name("tc-stream-keep".into())
            .spawn(move || {
                while matches!(Self::done(&end), Ok(false)) && comm.async_error().is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(keep);
            });
        if let Err(e) = spawned {
            crate::log_warn!("starting a thread to free scratch memory later: {e}");
        }
    }
}
