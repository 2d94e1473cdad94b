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

use crate::comm::Ptr;
use crate::cuda::{self, DeviceBuffer, EventPool};
use crate::device_ops::StreamWork;
use crate::error::Result;
use std::ffi::c_void;
use std::sync::Arc;

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
