//! The coalesced forms: many buffers at once, bucketed by data type up to a
//! byte limit; on the NCCL path each bucket is one NCCL group (NCCL fuses a
//! group's operations, so no packing copies are made).

use super::check::{bytes_of, disjoint, on_place, Span};
use super::{index_arg, LocalGroup, Streams};
use crate::error::Result;
use crate::types::DType;
use std::ffi::c_void;

/// Buckets of buffer indices: consecutive buffers of one data type in list
/// order, a bucket closed before it would exceed `limit` bytes (a buffer
/// larger than the limit gets a bucket of its own).
pub fn buckets(dtypes: &[DType], bytes: &[usize], limit: usize) -> Vec<Vec<usize>> {
    let mut open: Vec<(DType, usize, Vec<usize>)> = Vec::new();
    let mut done = Vec::new();
    for (i, (dt, b)) in dtypes.iter().zip(bytes).enumerate() {
        match open.iter_mut().find(|(d, _, _)| d == dt) {
            Some(slot) if slot.1 + b <= limit || slot.2.is_empty() => {
                slot.1 += b;
                slot.2.push(i);
            }
            Some(slot) => {
                done.push(std::mem::replace(&mut slot.2, vec![i]));
                slot.1 = *b;
            }
            None => open.push((*dt, *b, vec![i])),
        }
    }
    done.extend(open.into_iter().map(|(_, _, v)| v));
    done
}

impl LocalGroup {
    /// Broadcasts buffer t (`srcs[t]` on member 0, `counts[t]` elements of
    /// `dtypes[t]`) to `dsts[d * n + t]` on member d.
    pub fn broadcast_coalesced(
        &self,
        srcs: &[*const c_void],
        counts: &[usize],
        dtypes: &[DType],
        buffer_bytes: usize,
        dsts: &[*mut c_void],
        streams: Streams,
    ) -> Result<()> {
        let n = srcs.len();
        let mut sizes = Vec::with_capacity(n);
        let mut spans = Vec::new();
        for t in 0..n {
            let b = bytes_of(counts[t], dtypes[t], &format!("counts[{t}]"))?;
            sizes.push(b);
            on_place(srcs[t], b, self.places[0], &format!("srcs[{t}]"))?;
            spans.push(Span::new(srcs[t], b, format!("srcs[{t}]"), false));
            for d in 0..self.size() {
                let p = dsts[d * n + t];
                let name = format!("dsts[{}]", d * n + t);
                on_place(p, b, self.places[d], &name)?;
                if !(d == 0 && std::ptr::eq(p as *const c_void, srcs[t])) {
                    spans.push(Span::new(p, b, name, true));
                }
            }
        }
        disjoint(spans)?;
        for bucket in buckets(dtypes, &sizes, self.bucket(buffer_bytes)) {
            let items: Vec<_> = bucket
                .iter()
                .filter(|t| sizes[**t] > 0)
                .map(|&t| {
                    let row: Vec<*mut c_void> = (0..self.size()).map(|d| dsts[d * n + t]).collect();
                    (srcs[t], row, sizes[t])
                })
                .collect();
            if !items.is_empty() {
                self.broadcast_items(0, &items, streams, "tc_local_broadcast_coalesced")?;
            }
        }
        Ok(())
    }

    /// Sums buffer t over the members (`srcs[d * n + t]` on member d) into
    /// `dsts[t]` on member `root`.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_add_coalesced(
        &self,
        srcs: &[*const c_void],
        counts: &[usize],
        dtypes: &[DType],
        buffer_bytes: usize,
        dsts: &[*mut c_void],
        root: usize,
        streams: Streams,
    ) -> Result<()> {
        self.all_cuda("tc_local_reduce_add_coalesced")?;
        index_arg(root, self.size(), "dst_index")?;
        let n = dsts.len();
        let mut sizes = Vec::with_capacity(n);
        let mut spans = Vec::new();
        let mut columns = Vec::with_capacity(n);
        for t in 0..n {
            let b = bytes_of(counts[t], dtypes[t], &format!("counts[{t}]"))?;
            sizes.push(b);
            let col: Vec<*const c_void> = (0..self.size()).map(|d| srcs[d * n + t]).collect();
            let src_name = |d: usize| format!("srcs[{}]", d * n + t);
            let dst_name = format!("dsts[{t}]");
            self.check_sum(&col, dsts[t], root, b, (&src_name, &dst_name), &mut spans)?;
            columns.push(col);
        }
        disjoint(spans)?;
        for bucket in buckets(dtypes, &sizes, self.bucket(buffer_bytes)) {
            let items: Vec<_> = bucket
                .iter()
                .filter(|t| sizes[**t] > 0)
                .map(|&t| (columns[t].clone(), dsts[t], counts[t], dtypes[t]))
                .collect();
            if !items.is_empty() {
                self.reduce_items(root, &items, streams, "tc_local_reduce_add_coalesced")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_dtypes_apart_and_respect_the_limit() {
        let d = [DType::F32, DType::F32, DType::I64, DType::F32, DType::F32];
        let b = [4, 4, 8, 4, 20];
        assert_eq!(
            buckets(&d, &b, 8),
            vec![vec![0, 1], vec![3], vec![4], vec![2]]
        );
        assert_eq!(buckets(&d, &b, 1 << 20), vec![vec![0, 1, 3, 4], vec![2]]);
    }
}
