//! float16/bfloat16 sums (and AVG, PREMUL_SUM) over UCX, accumulated in
//! f32 and rounded once, as the Gloo and shared-memory paths do: rank r
//! gets every rank's block r in one direct exchange and sums the blocks in
//! rank order with the shared kernel (`reduce::sum_half_blocks`), so its
//! results equal the Gloo path's bit for bit. A ring would round the
//! partial sum at every step.

use super::{
    blocks, copy, host_premul_factor, reduce, Ctx, DType, RedKind, ReduceOp, Scale, Scratch,
};
use crate::error::Result;

impl Ctx<'_> {
    /// Every rank's block r (`counts[r]` elements at element `offsets[r]`
    /// of `input`, already scaled for PREMUL_SUM) summed into rank r's
    /// `out` (divided by the rank count for AVG), in step `step`.
    unsafe fn sum_half_blocks_to_owners(
        &mut self,
        input: *const u8,
        (counts, offsets): (&[usize], &[usize]),
        dtype: DType,
        kind: RedKind,
        out: *mut u8,
        step: u64,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let es = dtype.size();
        let mine = counts[me] * es;
        let mut received = Scratch::new(mine * n);
        copy(
            received.ptr().add(me * mine),
            input.add(offsets[me] * es),
            mine,
        );
        let others = (0..n).filter(|r| *r != me);
        let sends: Vec<_> = others
            .clone()
            .map(|r| (r, input.add(offsets[r] * es), counts[r] * es))
            .collect();
        let recvs: Vec<_> = others
            .map(|r| (r, received.ptr().add(r * mine), mine))
            .collect();
        self.step(step, &sends, &recvs)?;
        let divide = (kind == RedKind::Avg).then_some(n as u64);
        reduce::sum_half_blocks(dtype, out, received.ptr(), n, counts[me], divide)?;
        Ok(())
    }

    /// PREMUL_SUM's scaling of `count` elements from `src` into `dst`
    /// (a copy for the other kinds).
    unsafe fn premultiply(
        &self,
        dst: *mut u8,
        src: *const u8,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
    ) -> Result<()> {
        match op.kind {
            RedKind::PremulSum => {
                let k = host_premul_factor(op, dtype)?;
                reduce::scale(dtype, dst, src, count, Scale::Mul(k))
            }
            _ => {
                copy(dst, src, count * dtype.size());
                Ok(())
            }
        }
    }

    /// All-reduce of a half-precision sum: the f32 sums of the blocks
    /// (see the module documentation), then a ring all-gather.
    pub(super) unsafe fn all_reduce_halves(
        &mut self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
    ) -> Result<()> {
        let n = self.w.size;
        let es = dtype.size();
        self.premultiply(buf, buf, count, dtype, op)?;
        let (counts, offsets) = blocks(count, n);
        let own = buf.add(offsets[self.w.rank] * es);
        // The sums are written after the exchange, in place: `buf` is the
        // output.
        self.sum_half_blocks_to_owners(buf, (&counts, &offsets), dtype, op.kind, own, 0)?;
        self.ring_all_gather_elements(buf, (&counts, &offsets), es, 1)
    }

    /// Reduce of a half-precision sum: the f32 sums of the blocks, then
    /// every block to `root` (other ranks' buffers stay as they were).
    pub(super) unsafe fn reduce_halves(
        &mut self,
        buf: *mut u8,
        count: usize,
        dtype: DType,
        op: &ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let es = dtype.size();
        let mut input = Scratch::new(count * es);
        self.premultiply(input.ptr(), buf, count, dtype, op)?;
        let (counts, offsets) = blocks(count, n);
        let mut own = Scratch::new(counts[me] * es);
        let at = (&counts[..], &offsets[..]);
        self.sum_half_blocks_to_owners(input.ptr(), at, dtype, op.kind, own.ptr(), 0)?;
        if me != root {
            return match counts[me] {
                0 => Ok(()),
                c => self.step(1, &[(root, own.ptr(), c * es)], &[]),
            };
        }
        let recvs: Vec<_> = (0..n)
            .filter(|r| *r != me && counts[*r] > 0)
            .map(|r| (r, buf.add(offsets[r] * es), counts[r] * es))
            .collect();
        self.step(1, &[], &recvs)?;
        copy(buf.add(offsets[me] * es), own.ptr(), counts[me] * es);
        Ok(())
    }

    /// Reduce-scatter of a half-precision sum over `all` (every rank's
    /// blocks, a copy of the input the caller made): rank r's block r
    /// into `output`.
    pub(super) unsafe fn reduce_scatter_halves(
        &mut self,
        all: *mut u8,
        (counts, offsets): (&[usize], &[usize]),
        output: *mut u8,
        dtype: DType,
        op: &ReduceOp,
    ) -> Result<()> {
        let total: usize = counts.iter().sum();
        self.premultiply(all, all, total, dtype, op)?;
        self.sum_half_blocks_to_owners(all, (counts, offsets), dtype, op.kind, output, 0)
    }
}
