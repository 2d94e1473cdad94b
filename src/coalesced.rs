//! `broadcast_coalesced`: many buffers broadcast as a few large messages.
//!
//! Buffers are grouped by dtype, in list order, into buckets of at most
//! `buffer_bytes` (a larger buffer is a bucket of its own); each bucket is
//! packed into one staging buffer, broadcast as one message and unpacked.
//! A blocking call keeps at most two buckets staged and in flight. An
//! asynchronous call enqueues every bucket's broadcast before it returns, so
//! that the comm's order of operations is the order of the calls on every
//! rank; it therefore stages the whole list at once, and a helper thread
//! unpacks the buckets as they land.
//!
//! Device memory: on a device comm (nccl) every piece is enqueued on one
//! stream (the caller's with `async_op = 0`; with `async_op = 1` a stream of
//! the call's own that first waits for the caller's): the packing into a
//! staging buffer from the comm's allocator and the unpacking are device
//! copies, between them one broadcast per bucket (a bucket of one buffer is
//! broadcast in place); the work completes with the last copy. On a host
//! comm (gloo), CUDA buffers are packed into host staging by copies on the
//! caller's stream (synchronized before the broadcast) and unpacked the
//! same way.

use crate::comm::{Comm, Op, OpOptions, Ptr};
use crate::cuda;
use crate::device_ops::{self, CommScratch, StreamWork};
use crate::error::{Error, Result};
use crate::layout_check::{agree, Layout};
use crate::types::{DType, Device};
use crate::util::try_resize;
use crate::work::{DoneWork, HostWork, Work};
use std::collections::VecDeque;
use std::sync::Arc;

/// One buffer of the list.
#[derive(Debug, Clone, Copy)]
pub struct Buffer {
    pub ptr: Ptr,
    pub count: usize,
    pub dtype: DType,
}

impl Buffer {
    fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

/// One bucket: the indices of its buffers, all of one dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub members: Vec<usize>,
    pub dtype: DType,
    pub bytes: usize,
}

/// Groups the non-empty buffers by dtype, in list order, into buckets of at
/// most `limit` bytes. A bucket is emitted when the next buffer of its dtype
/// would overflow it; the buckets still open at the end follow in the order
/// their dtypes first appeared.
pub fn assign_buckets(bufs: &[(usize, DType)], limit: usize) -> Vec<Bucket> {
    let mut done = Vec::new();
    let mut open: Vec<Bucket> = Vec::new();
    for (i, &(count, dtype)) in bufs.iter().enumerate() {
        let bytes = count * dtype.size();
        if bytes == 0 {
            continue;
        }
        let slot = match open.iter().position(|b| b.dtype == dtype) {
            Some(s) => s,
            None => {
                open.push(Bucket {
                    members: Vec::new(),
                    dtype,
                    bytes: 0,
                });
                open.len() - 1
            }
        };
        let bucket = &mut open[slot];
        if !bucket.members.is_empty() && bucket.bytes + bytes > limit {
            done.push(std::mem::replace(
                bucket,
                Bucket {
                    members: Vec::new(),
                    dtype,
                    bytes: 0,
                },
            ));
        }
        bucket.members.push(i);
        bucket.bytes += bytes;
    }
    done.extend(open.into_iter().filter(|b| !b.members.is_empty()));
    done
}

/// Copies between CUDA buffers and host staging for a host comm, on the
/// caller's stream (the device's context made current on any thread).
#[derive(Clone)]
struct HostStaging {
    device: Arc<cuda::Device>,
    stream: Ptr,
}

// SAFETY: the stream handle is the caller's and only passed to the driver.
unsafe impl Send for HostStaging {}

/// Copies the bucket's buffers into `stage` (`into_stage`) or back out.
/// CUDA buffers (with `staging`) are copied on its stream, which is then
/// synchronized.
fn copy_bucket(
    bufs: &[Buffer],
    bucket: &Bucket,
    stage: &mut [u8],
    into_stage: bool,
    staging: Option<&HostStaging>,
) -> Result<()> {
    let _current = staging.map(|s| s.device.scoped()).transpose()?;
    let mut at = 0;
    for &i in &bucket.members {
        let b = bufs[i];
        let len = b.bytes();
        // SAFETY: `stage` holds the bucket.
        let staged = unsafe { stage.as_mut_ptr().add(at) };
        if let Some(s) = staging.filter(|_| device_ops::is_device(b.ptr).unwrap_or(false)) {
            let stream = s.stream.0 as cuda::RawStream;
            if into_stage {
                cuda::memcpy_async(staged.cast(), b.ptr.0, len, stream)?;
            } else {
                cuda::memcpy_async(b.ptr.0, staged.cast(), len, stream)?;
            }
        } else {
            // SAFETY: the caller guarantees each buffer holds `count`
            // elements for the duration of the operation.
            unsafe {
                let user = b.ptr.as_u8();
                if into_stage {
                    std::ptr::copy_nonoverlapping(user, staged, len);
                } else {
                    std::ptr::copy_nonoverlapping(staged, user, len);
                }
            }
        }
        at += len;
    }
    match staging {
        Some(s) => cuda::stream_synchronize(s.stream.0 as cuda::RawStream),
        None => Ok(()),
    }
}

fn validate(comm: &Comm, bufs: &[Buffer], buffer_bytes: usize, root: i32) -> Result<()> {
    if root < 0 || root >= comm.size() {
        return Err(Error::invalid_argument(format!(
            "argument 'root': {root} is not a rank of a comm of size {}",
            comm.size()
        )));
    }
    if buffer_bytes == 0 {
        return Err(Error::invalid_argument("argument 'buffer_bytes' is 0"));
    }
    for (i, b) in bufs.iter().enumerate() {
        b.dtype.bytes(b.count, &format!("counts[{i}]"))?;
        if b.count > 0 && b.ptr.is_null() {
            return Err(Error::null_argument(&format!("bufs[{i}]")));
        }
    }
    Ok(())
}

struct Staged {
    bucket: usize,
    stage: Vec<u8>,
    work: Arc<dyn Work>,
}

/// What the host path needs to pack and unpack: the list, its buckets and,
/// for CUDA buffers, their staging copies' device and stream.
struct HostPlan {
    bufs: Vec<Buffer>,
    buckets: Vec<Bucket>,
    root: i32,
    is_root: bool,
    staging: Option<HostStaging>,
}

/// Enqueues bucket `index`'s broadcast from `stage` (packed first on root).
fn launch(
    comm: &Comm,
    plan: &HostPlan,
    index: usize,
    mut stage: Vec<u8>,
    opts: &OpOptions,
) -> Result<Staged> {
    let bucket = &plan.buckets[index];
    let what = format!(
        "argument 'counts': bucket {index} of {} bytes",
        bucket.bytes
    );
    try_resize(&mut stage, bucket.bytes, 0, &what)?;
    if plan.is_root {
        copy_bucket(&plan.bufs, bucket, &mut stage, true, plan.staging.as_ref())?;
    }
    let root = plan.root;
    let op = Op::broadcast(
        Ptr(stage.as_mut_ptr().cast()),
        bucket.bytes / bucket.dtype.size(),
        bucket.dtype,
        root,
    );
    let async_opts = OpOptions {
        async_op: true,
        ..opts.clone()
    };
    let work = comm.submit(op, &async_opts)?;
    Ok(Staged {
        bucket: index,
        stage,
        work,
    })
}

/// Waits for a staged bucket and unpacks it (not on root, whose buffers are
/// the source); gives the staging buffer back for reuse.
fn land(plan: &HostPlan, staged: Staged) -> (Vec<u8>, Result<()>) {
    let Staged {
        bucket,
        mut stage,
        work,
    } = staged;
    let mut result = work.wait_blocking();
    if result.is_ok() && !plan.is_root {
        let bucket = &plan.buckets[bucket];
        result = copy_bucket(&plan.bufs, bucket, &mut stage, false, plan.staging.as_ref());
    }
    (stage, result)
}

/// Waits for every staged bucket (their staging buffers must outlive the
/// broadcasts), unpacking those that succeeded; returns the first error.
fn land_all(plan: &HostPlan, staged: VecDeque<Staged>) -> Result<()> {
    let mut first = Ok(());
    for s in staged {
        let (_, r) = land(plan, s);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Broadcasts root's `bufs` into every rank's. Collective: every rank passes
/// the same list (checked first; a difference fails every rank and writes
/// nothing). Returns one work for the whole call.
pub fn broadcast_coalesced(
    comm: &Arc<Comm>,
    bufs: Vec<Buffer>,
    buffer_bytes: usize,
    root: i32,
    opts: &OpOptions,
) -> Result<Arc<dyn Work>> {
    comm.check_active()?;
    let on_device = comm.device() != Device::Cpu;
    if on_device {
        device_ops::refuse_capture(opts.stream, "tc_broadcast_coalesced")?;
    }
    // A rank whose arguments are wrong still takes part in the agreement,
    // so that the others fail at once instead of waiting for it.
    let valid = validate(comm, &bufs, buffer_bytes, root);
    let entries: Vec<(usize, DType)> = bufs.iter().map(|b| (b.count, b.dtype)).collect();
    let scalars = [
        ("arguments valid (1: yes)", valid.is_ok() as u64),
        ("root", root as u64),
        ("buffer_bytes", buffer_bytes as u64),
    ];
    let layout = Layout {
        scalars: &scalars,
        entries,
    };
    let agreed = agree(comm, "tc_broadcast_coalesced", 0, &layout, opts.stream);
    valid?;
    agreed?;
    let buckets = assign_buckets(&layout.entries, buffer_bytes);
    if on_device {
        return run_on_device(comm, &bufs, &buckets, root, opts);
    }
    let staging =
        device_ops::first_device(bufs.iter().map(|b| (b.ptr, b.bytes())))?.map(|device| {
            HostStaging {
                device,
                stream: Ptr(opts.stream),
            }
        });
    let plan = HostPlan {
        bufs,
        buckets,
        root,
        is_root: comm.rank() == root,
        staging,
    };
    if !opts.async_op {
        run_pipelined(comm, &plan, opts)?;
        return Ok(Arc::new(DoneWork(Ok(()))));
    }
    let mut staged = VecDeque::new();
    for index in 0..plan.buckets.len() {
        match launch(comm, &plan, index, Vec::new(), opts) {
            Ok(s) => staged.push_back(s),
            Err(e) => {
                let _ = land_all(&plan, staged);
                return Err(e);
            }
        }
    }
    let work = HostWork::run_on_thread(
        "broadcast_coalesced",
        comm.label(),
        comm.timeout(),
        "tc-bcast-coalesced",
        move || land_all(&plan, staged),
    )?;
    Ok(work)
}

/// The blocking form: at most two buckets staged and in flight.
fn run_pipelined(comm: &Comm, plan: &HostPlan, opts: &OpOptions) -> Result<()> {
    let mut staged: VecDeque<Staged> = VecDeque::new();
    let mut spare = Vec::new();
    for index in 0..plan.buckets.len() {
        if staged.len() == 2 {
            let (stage, result) = land(plan, staged.pop_front().unwrap());
            if let Err(e) = result {
                let _ = land_all(plan, staged);
                return Err(e);
            }
            spare = stage;
        }
        match launch(comm, plan, index, std::mem::take(&mut spare), opts) {
            Ok(s) => staged.push_back(s),
            Err(e) => {
                let _ = land_all(plan, staged);
                return Err(e);
            }
        }
    }
    land_all(plan, staged)
}

/// Copies the members of `bucket` between their buffers and `stage` (device
/// memory) on `stream`.
fn device_copies(
    bufs: &[Buffer],
    bucket: &Bucket,
    stage: &CommScratch,
    into_stage: bool,
    stream: cuda::RawStream,
) -> Result<()> {
    let mut at = 0;
    for &i in &bucket.members {
        let b = bufs[i];
        let (dst, src) = if into_stage {
            (stage.at(at), b.ptr.0)
        } else {
            (b.ptr.0, stage.at(at))
        };
        cuda::memcpy_async(dst, src, b.bytes(), stream)?;
        at += b.bytes();
    }
    Ok(())
}

/// Enqueues every bucket on `stream`: packing (root), the broadcast,
/// unpacking (the others); a bucket of one buffer is broadcast in place.
fn enqueue_buckets(
    comm: &Arc<Comm>,
    bufs: &[Buffer],
    buckets: &[Bucket],
    root: i32,
    stage: Option<&CommScratch>,
    op_opts: &OpOptions,
) -> Result<()> {
    let stream = op_opts.stream as cuda::RawStream;
    let is_root = comm.rank() == root;
    for bucket in buckets {
        let packed = bucket.members.len() > 1;
        let buf = match (packed, stage) {
            (true, Some(stage)) => {
                if is_root {
                    device_copies(bufs, bucket, stage, true, stream)?;
                }
                Ptr(stage.ptr())
            }
            _ => bufs[bucket.members[0]].ptr,
        };
        let op = Op::broadcast(buf, bucket.bytes / bucket.dtype.size(), bucket.dtype, root);
        comm.submit(op, op_opts)?;
        if let (true, Some(stage), false) = (packed, stage, is_root) {
            device_copies(bufs, bucket, stage, false, stream)?;
        }
    }
    Ok(())
}

/// The device comm's path: everything on one stream, one work for the call.
fn run_on_device(
    comm: &Arc<Comm>,
    bufs: &[Buffer],
    buckets: &[Bucket],
    root: i32,
    opts: &OpOptions,
) -> Result<Arc<dyn Work>> {
    let Some(first) = buckets.first() else {
        return Ok(Arc::new(DoneWork(Ok(()))));
    };
    let device = device_ops::device_of(bufs[first.members[0]].ptr)?;
    let _current = device.scoped()?;
    let events = cuda::EventPool::new(&device);
    let user = opts.stream as cuda::RawStream;
    let own = if opts.async_op {
        let own = cuda::Stream::new(&device, 0)?;
        let start = events.get()?;
        start.record(user)?;
        cuda::stream_wait_event(own.raw(), &start)?;
        Some(own)
    } else {
        None
    };
    let stream = own.as_ref().map_or(user, |s| s.raw());
    let stage_bytes = buckets
        .iter()
        .filter(|b| b.members.len() > 1)
        .map(|b| b.bytes)
        .max();
    let stage = stage_bytes.map(|b| CommScratch::new(comm, b)).transpose()?;
    let op_opts = OpOptions {
        async_op: false,
        stream: stream as *mut std::ffi::c_void,
        ..opts.clone()
    };
    let enqueued = enqueue_buckets(comm, bufs, buckets, root, stage.as_ref(), &op_opts);
    let end = events.get()?;
    end.record(stream)?;
    let work = StreamWork::new("broadcast_coalesced", comm, end, Box::new((stage, own)));
    // On failure the work still keeps the staging buffer until the stream
    // is past what was enqueued.
    enqueued?;
    Ok(Arc::new(work))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(b: &[Bucket]) -> Vec<Vec<usize>> {
        b.iter().map(|b| b.members.clone()).collect()
    }

    #[test]
    fn buckets_group_by_dtype_in_list_order() {
        let bufs = [
            (4, DType::F32),   // 16 B
            (4, DType::F16),   // 8 B
            (3, DType::F32),   // 12 B: 28 > 24, closes [0]
            (0, DType::F32),   // empty: skipped
            (100, DType::F32), // 400 B: its own bucket
            (2, DType::F16),
        ];
        let b = assign_buckets(&bufs, 24);
        assert_eq!(members(&b), vec![vec![0], vec![2], vec![4], vec![1, 5]]);
        assert_eq!(b[2].bytes, 400);
        assert!(assign_buckets(&[(0, DType::F32)], 8).is_empty());
    }
}
