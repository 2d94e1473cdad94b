//! The reducer's copies when gradients or buckets are device memory.
//!
//! - nccl comm: the buckets are device memory from the comm's allocator;
//!   copies in and out are device copies on the reducer's stream (the one
//!   the gradients are produced on), the built-in hook's all-reduce waits
//!   for that stream, and `finalize` enqueues the copies out on it and
//!   returns a work that a stream can wait for.
//! - gloo comm with CUDA gradients: the buckets stay in host memory; the
//!   copies are made on the reducer's stream, which is synchronized before a
//!   hook runs and before finalize returns.
//!
//! On device buckets the compressing built-in hooks cast and divide with the
//! library's PTX kernels ([`DeviceCompress`]), and a hook's buffer of
//! another dtype is cast back into the bucket the same way, all on the
//! reducer's stream.

use super::hooks::tc_grad_bucket_t;
use crate::comm::{Comm, Ptr};
use crate::cuda::{self, DeviceBuffer, Elem, EventPool, Kernels};
use crate::device_ops::{self, CommScratch, StreamWork};
use crate::error::{Error, Result};
use crate::types::DType;
use std::ffi::c_void;
use std::sync::Arc;

/// The kernels' element type for a dtype (None: no kernel handles it).
fn elem(d: DType) -> Option<Elem> {
    match d {
        DType::F32 => Some(Elem::F32),
        DType::F16 => Some(Elem::F16),
        DType::BF16 => Some(Elem::Bf16),
        _ => None,
    }
}

/// Enqueues `count` elements of `src` (dtype `from`) into `dst` (dtype `to`)
/// on `stream`: a device copy for the same dtype, else a cast kernel.
fn cast_on_stream(
    kernels: &Kernels,
    src: *const c_void,
    from: DType,
    dst: *mut c_void,
    to: DType,
    count: usize,
    stream: cuda::RawStream,
) -> Result<()> {
    check_cast(from, to)?;
    if from == to {
        return cuda::memcpy_async(dst, src, count * from.size(), stream);
    }
    match (elem(from), elem(to)) {
        (Some(f), Some(t)) => kernels.cast(src, f, dst, t, count, stream),
        _ => Err(Error::internal("check_cast let an uncastable pair through")),
    }
}

/// Whether [`cast_on_stream`] converts `from` to `to`: the same dtype, or
/// between the dtypes the kernels cast.
pub fn check_cast(from: DType, to: DType) -> Result<()> {
    if from == to || (elem(from).is_some() && elem(to).is_some()) {
        return Ok(());
    }
    Err(Error::unsupported(format!(
        "casting {} to {} on the device is not supported (the kernels cast between float32, float16 and \
         bfloat16)",
        from.name(),
        to.name()
    )))
}

pub struct DeviceCopies {
    pub device: Arc<cuda::Device>,
    pub stream: Ptr,
    /// The buckets are host memory (a host comm): synchronize after copies.
    pub host_buckets: bool,
    events: Arc<EventPool>,
    /// Zeros for gradients never marked (device buckets), allocated at the
    /// first need with the largest gradient's size, so never replaced while
    /// a copy may still read it.
    zeros: Option<DeviceBuffer>,
    max_grad_bytes: usize,
    /// The cast kernels, loaded at the first hook buffer of another dtype.
    kernels: Option<Kernels>,
}

impl DeviceCopies {
    pub fn new(
        device: Arc<cuda::Device>,
        stream: *mut c_void,
        host_buckets: bool,
        max_grad_bytes: usize,
    ) -> Self {
        DeviceCopies {
            max_grad_bytes,
            events: EventPool::new(&device),
            device,
            stream: Ptr(stream),
            host_buckets,
            zeros: None,
            kernels: None,
        }
    }

    /// Enqueues the cast of a hook's buffer (`count` elements of `from`)
    /// back into a device bucket of dtype `to`.
    pub fn cast_back(
        &mut self,
        dst: *mut u8,
        to: DType,
        src: *const c_void,
        from: DType,
        count: usize,
    ) -> Result<()> {
        if self.kernels.is_none() && from != to {
            self.kernels = Some(Kernels::load(&self.device)?);
        }
        match &self.kernels {
            Some(k) => cast_on_stream(k, src, from, dst.cast(), to, count, self.raw()),
            None => self.copy(dst, src.cast(), count * to.size()),
        }
    }

    fn raw(&self) -> cuda::RawStream {
        self.stream.0 as cuda::RawStream
    }

    /// `len` bytes from `src` to `dst` on the stream (either side may be
    /// device or host memory).
    pub fn copy(&self, dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
        cuda::memcpy_async(dst.cast(), src.cast(), len, self.raw())
    }

    /// Zeros `len` bytes of a bucket at `dst`.
    pub fn zero(&mut self, dst: *mut u8, len: usize) -> Result<()> {
        if self.host_buckets {
            // SAFETY: the bucket (host memory) holds `len` bytes at `dst`.
            unsafe { std::ptr::write_bytes(dst, 0, len) };
            return Ok(());
        }
        if self.zeros.is_none() {
            self.zeros = Some(DeviceBuffer::zeroed(&self.device, self.max_grad_bytes)?);
        }
        let zeros = self
            .zeros
            .as_ref()
            .map_or(std::ptr::null_mut(), |z| z.ptr());
        self.copy(dst, zeros.cast(), len.min(self.max_grad_bytes))
    }

    /// After a round of copies: host buckets must hold the data now.
    pub fn settle(&self) -> Result<()> {
        if self.host_buckets {
            cuda::stream_synchronize(self.raw())?;
        }
        Ok(())
    }

    /// A work done when the stream is past everything enqueued so far.
    pub fn end_work(&self, comm: &Arc<crate::comm::Comm>) -> Result<StreamWork> {
        let end = self.events.get()?;
        end.record(self.raw())?;
        Ok(StreamWork::new("reducer_finalize", comm, end, Box::new(())))
    }

    /// Blocks until the stream is past everything enqueued so far.
    pub fn synchronize(&self) -> Result<()> {
        cuda::stream_synchronize(self.raw())
    }
}

/// The device side of the compressing built-in hooks: the kernels and one
/// compressed copy per bucket (device memory from the comm's allocator).
/// Its buffers are read by the cast back that `finalize` enqueues: the
/// reducer synchronizes its stream before it drops a hook.
#[derive(Default)]
pub struct DeviceCompress {
    kernels: Option<Kernels>,
    buffers: Vec<Option<CommScratch>>,
}

impl DeviceCompress {
    /// Enqueues on `stream`, as `fp16_compress_hook` / `bf16_compress_hook`
    /// do on the host: the bucket cast to `half` into the bucket's
    /// compressed copy, then divided there by `world` in `half` precision;
    /// points the bucket at the copy.
    pub fn compress(
        &mut self,
        comm: &Arc<Comm>,
        bucket: &mut tc_grad_bucket_t,
        half: DType,
        world: f32,
        stream: *mut c_void,
    ) -> Result<()> {
        let from = DType::from_c(bucket.dtype, "bucket.dtype")?;
        if elem(from).is_none() {
            return Err(Error::unsupported(format!(
                "casting {} gradients to 16 bits is not supported",
                from.name()
            )));
        }
        if self.kernels.is_none() {
            let device = device_ops::device_of(Ptr(bucket.buffer))?;
            self.kernels = Some(Kernels::load(&device)?);
        }
        let kernels = self.kernels.as_ref().expect("loaded above");
        if self.buffers.len() <= bucket.index {
            self.buffers.resize_with(bucket.index + 1, || None);
        }
        let bytes = bucket.count * half.size();
        let slot = &mut self.buffers[bucket.index];
        if !matches!(slot, Some(b) if b.bytes >= bytes) {
            *slot = Some(CommScratch::new(comm, bytes)?);
        }
        let copy = slot.as_ref().expect("allocated above").ptr();
        let stream = stream as cuda::RawStream;
        cast_on_stream(
            kernels,
            bucket.buffer,
            from,
            copy,
            half,
            bucket.count,
            stream,
        )?;
        let half_elem = elem(half).expect("a 16-bit dtype");
        kernels.divide(copy, half_elem, bucket.count, world, stream)?;
        bucket.buffer = copy;
        bucket.dtype = half.to_c();
        Ok(())
    }
}
