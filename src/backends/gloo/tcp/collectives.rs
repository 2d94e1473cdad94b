//! The Gloo calls behind the collectives, with their local forms for one
//! rank: all-gather, all-reduce, all-to-all(v), reduce-scatter and reduce,
//! including the float16/bfloat16 sums accumulated in f32.

use super::GlooTcp;
use crate::backends::gloo::memory::{copy, Scratch};
use crate::error::{Error, Result};
use crate::kernels::reduce::{self, Scale};
use crate::types::{DType, RedKind, ReduceOp};
use crate::util::Deadline;
use std::ffi::c_void;

impl GlooTcp {
    pub(super) unsafe fn g_allreduce(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        f: reduce::ReduceFn,
        d: &Deadline,
    ) -> Result<()> {
        if self.size == 1 || count == 0 {
            return Ok(());
        }
        let tag = self.next_tag();
        self.ctx()
            .allreduce(
                std::ptr::null(),
                buf,
                count,
                dtype.size(),
                f,
                tag,
                d.left()?,
            )
            .map_err(|e| self.fail("all_reduce", e))
    }

    // ---- checks -----------------------------------------------------------------

    /// All-gather of `bytes` per rank into `out`; `input` NULL means the
    /// caller's block is already in place.
    pub(super) unsafe fn all_gather_into(
        &self,
        input: *const u8,
        out: *mut u8,
        bytes: usize,
        d: &Deadline,
    ) -> Result<()> {
        let me = self.rank as usize;
        if self.size == 1 || bytes == 0 {
            if !input.is_null() {
                copy(out.add(me * bytes), input, bytes);
            }
            return Ok(());
        }
        let tag = self.next_tag();
        self.ctx()
            .allgather(input, out, bytes, tag, d.left()?)
            .map_err(|e| self.fail("all_gather", e))
    }

    pub(super) unsafe fn all_to_all(
        &self,
        input: *const u8,
        out: *mut u8,
        bytes: usize,
        d: &Deadline,
    ) -> Result<()> {
        if self.size == 1 {
            copy(out, input, bytes);
            return Ok(());
        }
        if bytes == 0 {
            return Ok(());
        }
        let tag = self.next_tag();
        self.ctx()
            .alltoall(input, out, bytes, tag, d.left()?)
            .map_err(|e| self.fail("all_to_all", e))
    }

    /// all_to_all_v_single of `input` (`in_counts[r]` elements to rank r)
    /// into `out` (`out_counts[r]` from rank r); `clash`: the input
    /// overlaps the output (see [`crate::op::Layout`]) and is read from a
    /// copy.
    pub(super) unsafe fn all_to_all_v(
        &self,
        (out, out_counts): (*mut u8, &[usize]),
        (input, in_counts): (*const u8, &[usize]),
        dtype: DType,
        clash: bool,
        d: &Deadline,
    ) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        // Every rank learns every rank's splits, so all find any mismatch.
        let mut mine: Vec<u64> = in_counts.iter().map(|c| *c as u64).collect();
        mine.extend(out_counts.iter().map(|c| *c as u64));
        let all = self.all_gather_words(&mine, d, "all_to_all_v_single split exchange")?;
        let row = |r: usize| &all[r * 2 * n..(r + 1) * 2 * n];
        for src in 0..n {
            for dst in 0..n {
                let sent = row(src)[dst];
                let expected = row(dst)[n + src];
                if sent != expected {
                    return Err(Error::invalid_usage(format!(
                        "all_to_all_v_single: rank {src} sends {sent} elements to rank {dst}, which expects {expected} from it \
                         (seen from rank {me})"
                    )));
                }
            }
        }
        let es = dtype.size();
        let in_bytes: Vec<usize> = in_counts.iter().map(|c| c * es).collect();
        let out_bytes: Vec<usize> = out_counts.iter().map(|c| c * es).collect();
        let in_total: usize = in_bytes.iter().sum();
        if n == 1 {
            copy(out, input, in_total);
            return Ok(());
        }
        let grand_total: u64 = all.chunks(2 * n).map(|r| r[..n].iter().sum::<u64>()).sum();
        if grand_total == 0 {
            return Ok(());
        }
        let mut tin = Scratch::new(0)?;
        let mut input = input;
        if clash {
            tin = Scratch::new(in_total)?;
            copy(tin.ptr(), input, in_total);
            input = tin.ptr();
        }
        let tag = self.next_tag();
        let r = self
            .ctx()
            .alltoallv(input, &in_bytes, out, &out_bytes, tag, d.left()?)
            .map_err(|e| self.fail("all_to_all_v_single", e));
        drop(tin);
        r
    }

    /// Reduce-scatter of `input` (blocks of `counts[r]` elements in rank
    /// order) into this rank's block at `output`: every rank sends block `r`
    /// straight to rank `r` in one all-to-all, and each rank reduces the
    /// blocks it received in rank order. Each rank sends (n-1)/n of its input
    /// once, half of what an all-reduce moves. float16/bfloat16 sums
    /// accumulate in f32 and round once. `output` may lie inside `input` (in
    /// place): it is written only after the exchange.
    pub(super) unsafe fn reduce_scatter_blocks(
        &self,
        input: *const u8,
        output: *mut u8,
        counts: &[usize],
        dtype: DType,
        op: &ReduceOp,
        d: &Deadline,
    ) -> Result<()> {
        let (n, me) = (self.size as usize, self.rank as usize);
        let es = dtype.size();
        let f = reduce::kernel(dtype, op.kind)?;
        let total: usize = counts.iter().sum();
        let mine = counts[me];
        let mut input = input;
        // PREMUL_SUM scales each rank's own contribution before the sum; the
        // caller's input stays untouched.
        let mut scaled = Scratch::new(0)?;
        if op.kind == RedKind::PremulSum {
            let k = reduce::host_premul_factor(op, dtype)?;
            scaled = Scratch::new(total * es)?;
            reduce::scale(dtype, scaled.ptr(), input, total, Scale::Mul(k))?;
            input = scaled.ptr();
        }
        let offset = counts[..me].iter().sum::<usize>() * es;
        if n == 1 || total == 0 {
            if mine > 0 && !std::ptr::eq(output, input.add(offset)) {
                copy(output, input.add(offset), mine * es);
            }
            return Ok(());
        }
        let in_bytes: Vec<usize> = counts.iter().map(|c| c * es).collect();
        let out_bytes = vec![mine * es; n];
        let mut received = Scratch::new(mine * es * n)?;
        let tag = self.next_tag();
        self.ctx()
            .alltoallv(input, &in_bytes, received.ptr(), &out_bytes, tag, d.left()?)
            .map_err(|e| self.fail("reduce_scatter", e))?;
        drop(scaled);
        if mine == 0 {
            return Ok(());
        }
        let is_sum = matches!(op.kind, RedKind::Sum | RedKind::Avg | RedKind::PremulSum);
        let divide = (op.kind == RedKind::Avg).then_some(n as u64);
        if is_sum && reduce::sum_half_blocks(dtype, output, received.ptr(), n, mine, divide)? {
            return Ok(());
        }
        let block = mine * es;
        copy(output, received.ptr(), block);
        for r in 1..n {
            f(
                output as *mut c_void,
                output as *const c_void,
                received.ptr().add(r * block) as *const c_void,
                mine,
            );
        }
        if let Some(k) = divide {
            reduce::scale(dtype, output, output, mine, Scale::Div(k))?;
        }
        Ok(())
    }

    /// Reduce of float16/bfloat16 sums: a reduce-scatter (summing in f32,
    /// rounding once) into scratch, then a gather of the blocks to the root
    /// (padded to the largest block: Gloo's gather takes equal sizes).
    pub(super) unsafe fn reduce_halves(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        root: i32,
        op: &ReduceOp,
        d: &Deadline,
    ) -> Result<()> {
        let n = self.size as usize;
        let es = dtype.size();
        let counts: Vec<usize> = (0..n)
            .map(|r| count / n + usize::from(r < count % n))
            .collect();
        let padded = counts[0] * es;
        let mut own = Scratch::new(padded)?;
        self.reduce_scatter_blocks(buf, own.ptr(), &counts, dtype, op, d)?;
        let is_root = self.rank == root;
        let mut all = Scratch::new(if is_root { padded * n } else { 0 })?;
        let tag = self.next_tag();
        self.ctx()
            .gather(own.ptr(), all.ptr(), padded, root, tag, d.left()?)
            .map_err(|e| self.fail("reduce", e))?;
        if is_root {
            let mut offset = 0;
            for (r, c) in counts.iter().enumerate() {
                copy(buf.add(offset), all.ptr().add(r * padded), c * es);
                offset += c * es;
            }
        }
        Ok(())
    }

    pub(super) unsafe fn reduce(
        &self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        root: i32,
        op: &ReduceOp,
        d: &Deadline,
    ) -> Result<()> {
        let f = reduce::kernel(dtype, op.kind)?;
        let bytes = count * dtype.size();
        let is_root = self.rank == root;
        let mut scaled = Scratch::new(0)?;
        let mut input: *const u8 = buf;
        if op.kind == RedKind::PremulSum {
            let k = reduce::host_premul_factor(op, dtype)?;
            if is_root {
                reduce::scale(dtype, buf, buf, count, Scale::Mul(k))?;
            } else {
                scaled = Scratch::new(bytes)?;
                reduce::scale(dtype, scaled.ptr(), buf, count, Scale::Mul(k))?;
                input = scaled.ptr();
            }
        }
        if self.size > 1 && count > 0 {
            // Gloo's reduce writes partial results into the output on every
            // rank: give non-roots scratch so their buffer stays untouched.
            let mut out_tmp = Scratch::new(if is_root { 0 } else { bytes })?;
            let out = if is_root { buf } else { out_tmp.ptr() };
            let inp = if std::ptr::eq(input, out) {
                std::ptr::null()
            } else {
                input
            };
            let tag = self.next_tag();
            self.ctx()
                .reduce(inp, out, count, dtype.size(), root, f, tag, d.left()?)
                .map_err(|e| self.fail("reduce", e))?;
        }
        if is_root && op.kind == RedKind::Avg {
            reduce::scale(dtype, buf, buf, count, Scale::Div(self.size as u64))?;
        }
        drop(scaled);
        Ok(())
    }
}
