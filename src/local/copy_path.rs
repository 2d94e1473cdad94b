//! The copies path: device-to-device, host-to-device and device-to-host
//! copies (`cuMemcpyAsync` under unified addressing, so copies between
//! devices need no peer setup), ordered with the streams of both ends by
//! events, and the sum of `reduce_add` on pinned host staging in a host
//! function on the destination's stream (the library ships no device code).

use super::check::Place;
use super::DevCtx;
use crate::cuda::{self, Event, PinnedBuffer, RawStream};
use crate::error::{Error, Result};
use crate::kernels::reduce::{self, ReduceFn};
use crate::types::{DType, RedKind};
use crate::util::lock;
use std::ffi::c_void;
use std::sync::Mutex;

/// One end of a copy: a buffer, where it lives and, on a device, the stream
/// work on it is ordered with.
#[derive(Clone)]
pub struct End {
    pub ptr: *mut c_void,
    pub place: Place,
    pub stream: RawStream,
    pub ctx: Option<DevCtx>,
}

impl End {
    fn ctx(&self) -> &DevCtx {
        self.ctx.as_ref().expect("a device end carries its device")
    }

    /// An event recorded on this end's stream now.
    fn mark(&self) -> Result<Event> {
        let c = self.ctx();
        let _g = c.dev.scoped()?;
        let e = c.events.get()?;
        e.record(self.stream)?;
        Ok(e)
    }

    /// Makes this end's stream wait for `e`.
    fn wait(&self, e: &Event) -> Result<()> {
        let _g = self.ctx().dev.scoped()?;
        cuda::stream_wait_event(self.stream, e)
    }
}

/// Copies `bytes` from `src` to `dst`, ordered after the work enqueued so
/// far on both ends' streams and before what is enqueued on them later.
/// Host-to-device copies are asynchronous (a pageable source is staged
/// during the call); a copy into host memory returns once it is there.
pub fn copy(dst: &End, src: &End, bytes: usize) -> Result<()> {
    if bytes == 0 || std::ptr::eq(dst.ptr, src.ptr) {
        return Ok(());
    }
    match (src.place, dst.place) {
        (Place::Cpu, Place::Cpu) => {
            // SAFETY: checked host buffers of `bytes` bytes that do not
            // overlap (the operations refuse overlapping destinations).
            unsafe {
                std::ptr::copy_nonoverlapping(src.ptr as *const u8, dst.ptr as *mut u8, bytes)
            };
            Ok(())
        }
        (Place::Cpu, Place::Cuda(_)) => {
            let _g = dst.ctx().dev.scoped()?;
            cuda::memcpy_async(dst.ptr, src.ptr, bytes, dst.stream)
        }
        (Place::Cuda(_), Place::Cpu) => {
            let _g = src.ctx().dev.scoped()?;
            cuda::memcpy_async(dst.ptr, src.ptr, bytes, src.stream)?;
            cuda::stream_synchronize(src.stream)
        }
        (Place::Cuda(_), Place::Cuda(_)) => {
            if src.stream == dst.stream && src.place == dst.place {
                let _g = dst.ctx().dev.scoped()?;
                return cuda::memcpy_async(dst.ptr, src.ptr, bytes, dst.stream);
            }
            // The copy runs on the destination's stream once the source's
            // stream reached this point; the source's stream then waits for
            // it, so later writes to the source cannot overtake it.
            dst.wait(&src.mark()?)?;
            {
                let _g = dst.ctx().dev.scoped()?;
                cuda::memcpy_async(dst.ptr, src.ptr, bytes, dst.stream)?;
            }
            src.wait(&dst.mark()?)
        }
    }
}

/// Pinned staging buffers of the copies path's sums, reused: each is lent
/// to one call and back in the pool with the event recorded after its last
/// use; it is lent again once that event completed. Allocating and freeing
/// pinned memory per call would cost milliseconds, and freeing it
/// synchronizes the device (the call would block the host).
#[derive(Default)]
pub struct Staging {
    items: Mutex<Vec<(i32, Event, PinnedBuffer)>>,
}

impl Staging {
    /// A buffer of at least `bytes` bytes for device `ctx`, free for use now.
    fn take(&self, ctx: &DevCtx, bytes: usize) -> Result<PinnedBuffer> {
        let mut items = lock(&self.items);
        let ready = items.iter().position(|(ord, e, b)| {
            *ord == ctx.dev.ordinal && b.bytes >= bytes && matches!(e.query(), Ok(true))
        });
        match ready {
            Some(i) => Ok(items.swap_remove(i).2),
            None => {
                drop(items);
                PinnedBuffer::new(&ctx.dev, bytes)
            }
        }
    }

    /// Returns `buf`, in use until `done` completes.
    fn give(&self, ctx: &DevCtx, done: Event, buf: PinnedBuffer) {
        let mut items = lock(&self.items);
        items.push((ctx.dev.ordinal, done, buf));
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let items = std::mem::take(self.items.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (_, e, buf) in items {
            let _ = e.synchronize();
            drop(buf);
        }
    }
}

/// The sum a host function runs: `blocks` blocks of `count` elements at
/// `base`, added into the first block in order.
struct SumJob {
    base: *mut u8,
    blocks: usize,
    count: usize,
    block_bytes: usize,
    add: ReduceFn,
}

unsafe extern "C" fn run_sum(p: *mut c_void) {
    // SAFETY: `p` is the job boxed by `reduce_add`, run once.
    let job = unsafe { Box::from_raw(p as *mut SumJob) };
    let _ = std::panic::catch_unwind(|| {
        for i in 1..job.blocks {
            // SAFETY: pinned staging of `blocks * block_bytes` bytes, filled
            // by the copies enqueued before this host function.
            unsafe {
                let b = job.base.add(i * job.block_bytes);
                (job.add)(job.base.cast(), job.base.cast(), b.cast(), job.count);
            }
        }
    });
}

/// The summing kernel of `dtype`, or TC_ERR_UNSUPPORTED (float8) before
/// anything is enqueued.
pub fn sum_kernel(dtype: DType) -> Result<ReduceFn> {
    if matches!(dtype, DType::F8E4M3 | DType::F8E5M2) {
        return Err(Error::unsupported(format!(
            "the copies path does not sum {} (the NCCL path does, with NCCL 2.24 or newer)",
            dtype.name()
        )));
    }
    reduce::kernel(dtype, RedKind::Sum)
}

/// `dst = sum of srcs` on the destination's stream: each source is copied
/// into pinned staging (ordered with its own stream), a host function adds
/// the blocks, and the sum is copied to `dst`. Host-asynchronous.
pub fn reduce_add(
    srcs: &[End],
    dst: &End,
    count: usize,
    dtype: DType,
    staging: &Staging,
) -> Result<()> {
    let add = sum_kernel(dtype)?;
    let block = count * dtype.size();
    let ctx = dst.ctx();
    let stage = staging.take(ctx, block * srcs.len())?;
    for (i, s) in srcs.iter().enumerate() {
        // Staging counts as the destination device's (its stream orders it).
        let to = End {
            // SAFETY: inside the staging allocation.
            ptr: unsafe { stage.ptr().cast::<u8>().add(i * block) }.cast(),
            ..dst.clone()
        };
        copy(&to, s, block)?;
    }
    let job = Box::into_raw(Box::new(SumJob {
        base: stage.ptr().cast(),
        blocks: srcs.len(),
        count,
        block_bytes: block,
        add,
    }));
    let _g = ctx.dev.scoped()?;
    if let Err(e) = cuda::launch_host_func(dst.stream, run_sum, job.cast()) {
        // SAFETY: not enqueued, so never run: freed here instead.
        drop(unsafe { Box::from_raw(job) });
        return Err(e);
    }
    cuda::memcpy_async(dst.ptr, stage.ptr(), block, dst.stream)?;
    let done = ctx.events.get()?;
    done.record(dst.stream)?;
    staging.give(ctx, done, stage);
    Ok(())
}
