//! The v-variants over UCX: per-rank counts, the same algorithms as their
//! even forms (ring all-gather and ring reduce-scatter over blocks of the
//! given sizes, half-precision sums as `half_sums.rs`, direct all-to-all).
//! The counts are not agreed first (the Gloo path agrees them over its own
//! context): every receive must get exactly the bytes its count says, so
//! ranks whose counts disagree fail at the first step where a size differs
//! (`TC_ERR_INVALID_USAGE` there), and the failure notice fails every other
//! rank at once.

use super::{copy, host_premul_factor, reduce, Ctx, DType, RedKind, ReduceOp, Scale, Scratch};
use crate::error::{Error, Result};

/// Element offsets of consecutive blocks of `counts` elements.
fn offsets(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |at, c| {
            let o = *at;
            *at += c;
            Some(o)
        })
        .collect()
}

/// Whether `[a, a + an)` and `[b, b + bn)` share a byte.
fn overlap(a: *const u8, an: usize, b: *const u8, bn: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    an > 0 && bn > 0 && a < b + bn && b < a + an
}

impl Ctx<'_> {
    /// Rank r's `counts[r]` elements at `input` into block r of every
    /// rank's `output` (blocks in rank order).
    pub(super) unsafe fn all_gather_v(
        &mut self,
        output: *mut u8,
        input: *const u8,
        counts: &[usize],
        es: usize,
    ) -> Result<()> {
        let me = self.w.rank;
        let offs = offsets(counts);
        let sizes: Vec<usize> = counts.iter().map(|c| c * es).collect();
        let byte_offsets: Vec<usize> = offs.iter().map(|o| o * es).collect();
        let own = output.add(byte_offsets[me]);
        copy(own, input, sizes[me]);
        self.ring_all_gather_blocks(output, (&sizes, &byte_offsets), 0)
    }

    /// Block r (`counts[r]` elements) of the reduction of every rank's
    /// `input` into rank r's `output`, over a copy of the input.
    pub(super) unsafe fn reduce_scatter_v(
        &mut self,
        output: *mut u8,
        input: *const u8,
        counts: &[usize],
        dtype: DType,
        op: &ReduceOp,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let f = reduce::kernel(dtype, op.kind)?;
        let es = dtype.size();
        let total: usize = counts.iter().sum();
        let mut all = Scratch::new(total * es);
        copy(all.ptr(), input, total * es);
        let offs = offsets(counts);
        if n > 1 && op.kind.sums_halves(dtype) {
            return self.reduce_scatter_halves(all.ptr(), (counts, &offs), output, dtype, op);
        }
        if op.kind == RedKind::PremulSum {
            let k = host_premul_factor(op, dtype)?;
            reduce::scale(dtype, all.ptr(), all.ptr(), total, Scale::Mul(k))?;
        }
        if n > 1 && total > 0 {
            self.ring_reduce_scatter(all.ptr(), (counts, &offs), es, f)?;
        }
        copy(output, all.ptr().add(offs[me] * es), counts[me] * es);
        if op.kind == RedKind::Avg {
            reduce::scale(dtype, output, output, counts[me], Scale::Div(n as u64))?;
        }
        Ok(())
    }

    /// `input_counts[r]` elements of `input` (blocks in rank order) to rank
    /// r, `output_counts[r]` elements from rank r into `output`'s block r;
    /// an input overlapping the output is read from a copy.
    pub(super) unsafe fn all_to_all_v(
        &mut self,
        (output, output_counts): (*mut u8, &[usize]),
        (input, input_counts): (*const u8, &[usize]),
        es: usize,
    ) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let in_bytes: usize = input_counts.iter().sum::<usize>() * es;
        let out_bytes: usize = output_counts.iter().sum::<usize>() * es;
        let mut copied = Scratch::new(0);
        let mut src = input;
        if overlap(input, in_bytes, output, out_bytes) {
            copied = Scratch::new(in_bytes);
            copy(copied.ptr(), input, in_bytes);
            src = copied.ptr();
        }
        let ins = offsets(input_counts);
        let outs = offsets(output_counts);
        if n > 1 {
            let others = (0..n).filter(|r| *r != me);
            let sends: Vec<_> = others
                .clone()
                .map(|r| (r, src.add(ins[r] * es), input_counts[r] * es))
                .collect();
            let recvs: Vec<_> = others
                .map(|r| (r, output.add(outs[r] * es), output_counts[r] * es))
                .collect();
            self.step(0, &sends, &recvs)?;
        }
        // After the exchange, which the other ranks need either way.
        if output_counts[me] != input_counts[me] {
            return Err(Error::invalid_argument(format!(
                "all_to_all_v_single on rank {me}: input_counts[{me}] is {} but output_counts[{me}] \
                 is {} (what a rank sends itself)",
                input_counts[me], output_counts[me]
            )));
        }
        copy(
            output.add(outs[me] * es),
            src.add(ins[me] * es),
            input_counts[me] * es,
        );
        drop(copied);
        Ok(())
    }
}
