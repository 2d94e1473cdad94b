//! Launching a bucket in parts. With a hook whose exchange works element by
//! element in place (the built-in all-reduce) on host buckets, each piece of
//! a bucket goes out as soon as every gradient under it is ready and every
//! earlier piece went out, instead of when the whole bucket is ready. The
//! pieces are the ones the hook cuts a whole bucket into, issued in the same
//! order, so every rank issues the same operations and the results are the
//! same bits; only when they start changes: the exchange of a large bucket
//! overlaps the backward pass that is still filling it.

use super::{hooks, Reducer};
use crate::error::Result;

impl Reducer {
    /// Launches every piece whose gradients are all marked, in bucket and
    /// piece order. A hook failure is returned here and again by `finalize`.
    pub(super) fn launch_ready_parts(&mut self) -> Result<()> {
        let mut first_error = Ok(());
        while self.next_launch < self.buckets.len() {
            let b = self.next_launch;
            let ready = self.take_marked_front(b);
            let complete = ready == self.buckets[b].count;
            let r = self.launch_parts(b, ready, complete);
            if first_error.is_ok() {
                first_error = r;
            }
            if !complete {
                break;
            }
            self.next_launch += 1;
        }
        first_error
    }

    /// Takes the marked gradients at the front of bucket `b` (in bucket
    /// order) that are not yet taken, copying them in; returns how many
    /// elements from the bucket's start are ready.
    fn take_marked_front(&mut self, b: usize) -> usize {
        loop {
            let k = self.buckets[b].ready_members;
            match self.buckets[b].members.get(k) {
                Some(&g) if self.marked[g] => {}
                _ => break,
            }
            if !self.as_view {
                self.copy_member(b, k);
            }
            self.buckets[b].ready_members += 1;
        }
        let bucket = &self.buckets[b];
        bucket
            .offsets
            .get(bucket.ready_members)
            .copied()
            .unwrap_or(bucket.count)
    }

    /// `finalize`'s launch of what is left of bucket `b`: gradients never
    /// marked count as zeros.
    pub(super) fn launch_rest(&mut self, b: usize) -> Result<()> {
        for k in self.buckets[b].ready_members..self.buckets[b].members.len() {
            let g = self.buckets[b].members[k];
            if !self.marked[g] {
                self.zero_member(b, k);
            } else if !self.as_view {
                self.copy_member(b, k);
            }
        }
        let bucket = &mut self.buckets[b];
        bucket.ready_members = bucket.members.len();
        let count = bucket.count;
        self.launch_parts(b, count, true)
    }

    /// Launches the pieces of bucket `b` not yet launched that lie within
    /// its first `ready` elements (all of them when `complete`).
    fn launch_parts(&mut self, b: usize, ready: usize, complete: bool) -> Result<()> {
        let bucket = &mut self.buckets[b];
        let piece = hooks::piece_elements(bucket.dtype);
        let end = if complete {
            bucket.count
        } else {
            ready / piece * piece
        };
        let es = bucket.dtype.size();
        let base = bucket.storage_ptr();
        let mut first_error = Ok(());
        while bucket.launched < end {
            let count = piece.min(bucket.count - bucket.launched);
            // SAFETY: the piece lies within the bucket's `count` elements.
            let buf = unsafe { base.add(bucket.launched * es) }.cast();
            match self.hook.run_part(&self.comm, buf, count, bucket.dtype) {
                Ok(work) => bucket.works.push(work),
                Err(e) => {
                    let e = e.context(format!("communication hook on bucket {b}"));
                    self.hook_error.get_or_insert_with(|| e.clone());
                    if first_error.is_ok() {
                        first_error = Err(e);
                    }
                }
            }
            bucket.launched += count;
        }
        first_error
    }

    /// Copies member `k` of host bucket `b` in from its gradient.
    fn copy_member(&mut self, b: usize, k: usize) {
        let bucket = &mut self.buckets[b];
        let es = bucket.dtype.size();
        let src = self.grads[bucket.members[k]].ptr.as_u8();
        // SAFETY: host memory: the bucket holds the gradient at its offset
        // and the caller's gradient holds its length.
        unsafe {
            let dst = bucket.storage_ptr().add(bucket.offsets[k] * es);
            std::ptr::copy_nonoverlapping(src, dst, bucket.lengths[k] * es)
        }
    }

    /// Zeroes member `k`'s place in host bucket `b` (never marked).
    fn zero_member(&mut self, b: usize, k: usize) {
        let bucket = &mut self.buckets[b];
        let es = bucket.dtype.size();
        // SAFETY: the bucket holds the gradient at its offset.
        unsafe {
            let dst = bucket.storage_ptr().add(bucket.offsets[k] * es);
            std::ptr::write_bytes(dst, 0, bucket.lengths[k] * es)
        }
    }
}
