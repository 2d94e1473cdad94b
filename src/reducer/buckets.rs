//! Building a reducer's buckets: their layout from DDP's assignment, their
//! storage and hook views, and each gradient's place in them.

use super::hooks::tc_grad_bucket_t;
use super::{layout, Bucket, Grad, ReducerOptions};
use crate::coalesced::Buffer;
use crate::comm::Ptr;
use crate::error::{Error, Result};
use crate::types::DType;
use crate::util::try_filled;

/// The buckets of a gradient list (count, dtype per gradient), in launch
/// order, with zeroed host storage and their hook views.
pub(super) fn build_buckets(
    grads: &[(usize, DType)],
    opts: &ReducerOptions,
) -> Result<Vec<Bucket>> {
    let assignment = layout::assign(grads, opts.first_bucket_bytes, opts.bucket_cap_bytes);
    let num_buckets = assignment.len();
    let mut buckets: Vec<Bucket> = assignment
        .into_iter()
        .enumerate()
        .map(|(index, members)| {
            let dtype = grads[members[0]].1;
            let lengths: Vec<usize> = members.iter().map(|&g| grads[g].0).collect();
            let offsets = lengths
                .iter()
                .scan(0, |at, &l| {
                    *at += l;
                    Some(*at - l)
                })
                .collect();
            // Each gradient's bytes were checked; their sum may still
            // overflow, which no memory can hold either.
            let count = lengths.iter().map(|&l| l as u128).sum::<u128>();
            let (what, bytes) = (
                format!(
                    "argument 'counts': bucket {index} of {count} {} elements",
                    dtype.name()
                ),
                count * dtype.size() as u128,
            );
            let words = usize::try_from(bytes.div_ceil(8))
                .map_err(|_| Error::out_of_memory(&what, bytes))?;
            let count = count as usize;
            Ok(Bucket {
                dtype,
                pending: members.len(),
                storage: try_filled(0u64, words, &what)?,
                scratch: None,
                members,
                offsets,
                lengths,
                count,
                view: tc_grad_bucket_t {
                    index,
                    num_buckets,
                    is_last: (index + 1 == num_buckets) as i32,
                    buffer: std::ptr::null_mut(),
                    count,
                    dtype: dtype.to_c(),
                    num_grads: 0,
                    grad_indices: std::ptr::null(),
                    offsets: std::ptr::null(),
                    lengths: std::ptr::null(),
                },
                works: Vec::new(),
                ready_members: 0,
                launched: 0,
            })
        })
        .collect::<Result<_>>()?;
    for b in &mut buckets {
        b.view.num_grads = b.members.len();
        b.view.grad_indices = b.members.as_ptr();
        b.view.offsets = b.offsets.as_ptr();
        b.view.lengths = b.lengths.as_ptr();
    }
    Ok(buckets)
}

/// Each gradient's place in its bucket; with `as_view` its pointer becomes
/// that place (NULL for an empty gradient).
pub(super) fn place_grads(grads: &[Buffer], buckets: &mut [Bucket], as_view: bool) -> Vec<Grad> {
    let mut grads: Vec<Grad> = grads
        .iter()
        .map(|g| Grad {
            ptr: g.ptr,
            dtype: g.dtype,
            slot: None,
        })
        .collect();
    for (b, bucket) in buckets.iter_mut().enumerate() {
        for (k, &g) in bucket.members.iter().enumerate() {
            grads[g].slot = Some((b, bucket.offsets[k]));
        }
        bucket.view.buffer = bucket.storage_ptr().cast();
    }
    if as_view {
        for g in &mut grads {
            g.ptr = match g.slot {
                // SAFETY: the bucket holds the gradient at `off`.
                Some((b, off)) => {
                    Ptr(unsafe { buckets[b].storage_ptr().add(off * g.dtype.size()).cast() })
                }
                None => Ptr(std::ptr::null_mut()),
            };
        }
    }
    grads
}
