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

use crate::comm::{Comm, Op, OpOptions, Ptr};
use crate::error::{Error, Result};
use crate::layout_check::{agree, Layout};
use crate::types::{DType, Device};
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

/// Copies the bucket's buffers into `stage` (`into_stage`) or back out.
fn copy_bucket(bufs: &[Buffer], bucket: &Bucket, stage: &mut [u8], into_stage: bool) {
    let mut at = 0;
    for &i in &bucket.members {
        let b = bufs[i];
        let len = b.bytes();
        // SAFETY: the caller guarantees each buffer holds `count` elements
        // for the duration of the operation; `stage` holds the bucket.
        unsafe {
            let user = b.ptr.as_u8();
            if into_stage {
                std::ptr::copy_nonoverlapping(user, stage.as_mut_ptr().add(at), len);
            } else {
                std::ptr::copy_nonoverlapping(stage.as_ptr().add(at), user, len);
            }
        }
        at += len;
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

/// Enqueues bucket `index`'s broadcast from `stage` (packed first on root).
fn launch(
    comm: &Comm,
    bufs: &[Buffer],
    buckets: &[Bucket],
    index: usize,
    mut stage: Vec<u8>,
    root: i32,
    opts: &OpOptions,
) -> Result<Staged> {
    let bucket = &buckets[index];
    stage.resize(bucket.bytes, 0);
    if comm.rank() == root {
        copy_bucket(bufs, bucket, &mut stage, true);
    }
    let op = Op::Broadcast {
        buf: Ptr(stage.as_mut_ptr().cast()),
        count: bucket.bytes / bucket.dtype.size(),
        dtype: bucket.dtype,
        root,
    };
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
fn land(
    bufs: &[Buffer],
    buckets: &[Bucket],
    staged: Staged,
    is_root: bool,
) -> (Vec<u8>, Result<()>) {
    let Staged {
        bucket,
        mut stage,
        work,
    } = staged;
    let result = work.wait_blocking();
    if result.is_ok() && !is_root {
        copy_bucket(bufs, &buckets[bucket], &mut stage, false);
    }
    (stage, result)
}

/// Waits for every staged bucket (their staging buffers must outlive the
/// broadcasts), unpacking those that succeeded; returns the first error.
fn land_all(
    bufs: &[Buffer],
    buckets: &[Bucket],
    staged: VecDeque<Staged>,
    is_root: bool,
) -> Result<()> {
    let mut first = Ok(());
    for s in staged {
        let (_, r) = land(bufs, buckets, s, is_root);
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
    if comm.device() != Device::Cpu {
        return Err(Error::unsupported(
            "tc_broadcast_coalesced runs on host memory (gloo comms on the CPU device) only; \
             CUDA buffers are not supported yet",
        ));
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
    let agreed = agree(comm, "tc_broadcast_coalesced", 0, &layout);
    valid?;
    agreed?;
    let buckets = assign_buckets(&layout.entries, buffer_bytes);
    let is_root = comm.rank() == root;
    if !opts.async_op {
        run_pipelined(comm, &bufs, &buckets, root, opts)?;
        return Ok(Arc::new(DoneWork(Ok(()))));
    }
    let mut staged = VecDeque::new();
    for index in 0..buckets.len() {
        match launch(comm, &bufs, &buckets, index, Vec::new(), root, opts) {
            Ok(s) => staged.push_back(s),
            Err(e) => {
                let _ = land_all(&bufs, &buckets, staged, is_root);
                return Err(e);
            }
        }
    }
    let label: Arc<str> = format!(
        "comm '{}' (rank {}/{})",
        comm.name(),
        comm.rank(),
        comm.size()
    )
    .into();
    let work = Arc::new(HostWork::new("broadcast_coalesced", label, comm.timeout()));
    work.start();
    let done = work.clone();
    std::thread::Builder::new()
        .name("tc-bcast-coalesced".into())
        .spawn(move || done.complete(land_all(&bufs, &buckets, staged, is_root)))
        .map_err(|e| Error::system("starting the broadcast_coalesced thread", e))?;
    Ok(work)
}

/// The blocking form: at most two buckets staged and in flight.
fn run_pipelined(
    comm: &Comm,
    bufs: &[Buffer],
    buckets: &[Bucket],
    root: i32,
    opts: &OpOptions,
) -> Result<()> {
    let is_root = comm.rank() == root;
    let mut staged: VecDeque<Staged> = VecDeque::new();
    let mut spare = Vec::new();
    for index in 0..buckets.len() {
        if staged.len() == 2 {
            let (stage, result) = land(bufs, buckets, staged.pop_front().unwrap(), is_root);
            if let Err(e) = result {
                let _ = land_all(bufs, buckets, staged, is_root);
                return Err(e);
            }
            spare = stage;
        }
        match launch(
            comm,
            bufs,
            buckets,
            index,
            std::mem::take(&mut spare),
            root,
            opts,
        ) {
            Ok(s) => staged.push_back(s),
            Err(e) => {
                let _ = land_all(bufs, buckets, staged, is_root);
                return Err(e);
            }
        }
    }
    land_all(bufs, buckets, staged, is_root)
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
