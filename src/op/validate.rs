//! `Op::validate`: ranks, counts, buffers and list lengths checked against
//! the comm before any backend sees the operation.

use super::{
    AllToAll, AllToAllKind, Gather, GatherKind, Op, P2p, PointToPoint, Ptr, Reduction,
    ReductionKind, Scatter, ScatterKind,
};
use crate::error::{Error, Result};
use crate::types::DType;

impl Op {
    /// Checks ranks, counts, buffers and list lengths against a comm of
    /// `size` ranks seen from `rank`.
    #[inline]
    pub fn validate(&self, rank: i32, size: i32) -> Result<()> {
        match self {
            // Nothing to check: spared the call and the families' frame.
            Op::Barrier | Op::Refused(_) => Ok(()),
            // The commonest small call, checked here without that frame.
            Op::PointToPoint(PointToPoint::One(p)) => validate_one(p, size),
            _ => self.validate_families(rank, size),
        }
    }

    fn validate_families(&self, rank: i32, size: i32) -> Result<()> {
        let c = Checks {
            rank,
            size,
            n: size as usize,
        };
        match self {
            Op::PointToPoint(p) => validate_point_to_point(p, &c),
            Op::Reduction(r) => validate_reduction(r, &c),
            Op::Gather(g) => validate_gather(g, &c),
            Op::Scatter(s) => validate_scatter(s, &c),
            Op::AllToAll(a) => validate_all_to_all(a, &c),
            Op::Barrier | Op::Refused(_) => Ok(()),
        }
    }
}

/// A send or receive alone, on a comm of `size` ranks: its peer (a
/// receive from any source: other ranks to take from) and buffer.
#[inline(always)]
fn validate_one(p: &P2p, size: i32) -> Result<()> {
    if p.is_any_source() {
        // Never from self (as a receive naming its own rank, it would
        // need a send issued after it): from the other ranks only.
        if size < 2 {
            return Err(Error::invalid_usage(
                "argument 'peer': TC_ANY_SOURCE on a comm of one rank: a receive from any \
                 source takes messages from the other ranks only, and there are none",
            ));
        }
    } else if p.peer < 0 || p.peer >= size {
        return Err(outside(p.peer, size, "peer"));
    }
    buf_ok(p.buf, p.count, p.dtype, "buf")
}

/// Send, receive and batch: peers and buffers.
#[inline(always)]
fn validate_point_to_point(p: &PointToPoint, c: &Checks) -> Result<()> {
    match p {
        PointToPoint::One(p) => validate_one(p, c.size),
        PointToPoint::Batch(ops) => {
            for (i, p) in ops.iter().enumerate() {
                if p.is_any_source() {
                    // Its match would depend on which of the batch's
                    // other receives took their messages first.
                    return Err(Error::unsupported(format!(
                        "argument 'batch[{i}].peer': TC_ANY_SOURCE: a receive from any source \
                         cannot be a batch member (issue it alone with tc_recv)"
                    )));
                }
                c.peer(p.peer, &format!("batch[{i}].peer"))?;
                buf_ok(p.buf, p.count, p.dtype, &format!("batch[{i}].buf"))?;
            }
            Ok(())
        }
    }
}

/// The reductions: the reduce op on the dtype first, then the buffers.
#[inline(always)]
fn validate_reduction(r: &Reduction, c: &Checks) -> Result<()> {
    let dtype = r.dtype;
    r.op.check_dtype(dtype)?;
    match &r.kind {
        ReductionKind::AllReduce { buf, count } => buf_ok(*buf, *count, dtype, "buf"),
        ReductionKind::Reduce { buf, count, root } => {
            c.peer(*root, "root")?;
            buf_ok(*buf, *count, dtype, "buf")
        }
        ReductionKind::ReduceScatter {
            output,
            inputs,
            count,
        } => {
            buf_ok(*output, *count, dtype, "output")?;
            c.list(inputs, *count, dtype, "inputs")
        }
        ReductionKind::ReduceScatterSingle {
            output,
            input,
            count,
        } => {
            buf_ok(*output, *count, dtype, "output")?;
            buf_ok(*input, c.times_n(*count, "count")?, dtype, "input")
        }
        ReductionKind::ReduceScatterV {
            output,
            input,
            counts,
        } => {
            let total = c.counts(counts, dtype, "counts")?;
            buf_ok(*output, counts[c.rank as usize], dtype, "output")?;
            buf_ok(*input, total, dtype, "input")
        }
    }
}

/// The all-gathers and gathers.
#[inline(always)]
fn validate_gather(g: &Gather, c: &Checks) -> Result<()> {
    let (dtype, input) = (g.dtype, g.input);
    match &g.kind {
        GatherKind::AllGather { outputs, count } => {
            buf_ok(input, *count, dtype, "input")?;
            c.list(outputs, *count, dtype, "outputs")
        }
        GatherKind::AllGatherSingle { output, count } => {
            buf_ok(input, *count, dtype, "input")?;
            buf_ok(*output, c.times_n(*count, "count")?, dtype, "output")
        }
        GatherKind::AllGatherV { output, counts } => {
            let total = c.counts(counts, dtype, "counts")?;
            buf_ok(input, counts[c.rank as usize], dtype, "input")?;
            buf_ok(*output, total, dtype, "output")
        }
        GatherKind::Gather {
            outputs,
            count,
            root,
        } => {
            c.peer(*root, "root")?;
            buf_ok(input, *count, dtype, "input")?;
            if c.rank == *root {
                c.list(outputs, *count, dtype, "outputs")?;
            }
            Ok(())
        }
        GatherKind::GatherSingle {
            output,
            count,
            root,
        } => {
            c.peer(*root, "root")?;
            buf_ok(input, *count, dtype, "input")?;
            if c.rank == *root {
                buf_ok(*output, c.times_n(*count, "count")?, dtype, "output")?;
            }
            Ok(())
        }
    }
}

/// Broadcast and scatter: the root, then the buffers.
#[inline(always)]
fn validate_scatter(s: &Scatter, c: &Checks) -> Result<()> {
    let (dtype, count, root) = (s.dtype, s.count, s.root);
    c.peer(root, "root")?;
    match &s.kind {
        ScatterKind::Broadcast { buf } => buf_ok(*buf, count, dtype, "buf"),
        ScatterKind::Scatter { output, inputs } => {
            buf_ok(*output, count, dtype, "output")?;
            if c.rank == root {
                c.list(inputs, count, dtype, "inputs")?;
            }
            Ok(())
        }
    }
}

/// The all-to-alls.
#[inline(always)]
fn validate_all_to_all(a: &AllToAll, c: &Checks) -> Result<()> {
    let dtype = a.dtype;
    match &a.kind {
        AllToAllKind::Lists {
            outputs,
            inputs,
            count,
        } => {
            c.list(outputs, *count, dtype, "outputs")?;
            c.list(inputs, *count, dtype, "inputs")
        }
        AllToAllKind::Single {
            output,
            input,
            count,
        } => {
            let total = c.times_n(*count, "count")?;
            buf_ok(*output, total, dtype, "output")?;
            buf_ok(*input, total, dtype, "input")
        }
        AllToAllKind::VSingle {
            output,
            output_counts,
            input,
            input_counts,
        } => {
            let out_total = c.counts(output_counts, dtype, "output_counts")?;
            let in_total = c.counts(input_counts, dtype, "input_counts")?;
            buf_ok(*output, out_total, dtype, "output")?;
            buf_ok(*input, in_total, dtype, "input")
        }
    }
}

/// A comm's shape, and the checks every operation's arguments go through.
struct Checks {
    rank: i32,
    size: i32,
    n: usize,
}

impl Checks {
    fn peer(&self, p: i32, arg: &str) -> Result<()> {
        if p < 0 || p >= self.size {
            return Err(outside(p, self.size, arg));
        }
        Ok(())
    }

    fn list(&self, l: &[Ptr], count: usize, dtype: DType, arg: &str) -> Result<()> {
        let n = self.n;
        if l.len() != n {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': {} buffers for {n} ranks",
                l.len()
            )));
        }
        for (i, p) in l.iter().enumerate() {
            buf_ok(*p, count, dtype, &format!("{arg}[{i}]"))?;
        }
        Ok(())
    }

    fn counts(&self, c: &[usize], dtype: DType, arg: &str) -> Result<usize> {
        let n = self.n;
        if c.len() != n {
            return Err(Error::invalid_argument(format!(
                "argument '{arg}': {} counts for {n} ranks",
                c.len()
            )));
        }
        let total = c.iter().try_fold(0usize, |a, b| a.checked_add(*b));
        let total = total
            .ok_or_else(|| Error::invalid_argument(format!("argument '{arg}': counts overflow")))?;
        dtype.bytes(total, arg)?;
        Ok(total)
    }

    fn times_n(&self, count: usize, arg: &str) -> Result<usize> {
        let n = self.n;
        count.checked_mul(n).ok_or_else(|| {
            Error::invalid_argument(format!(
                "argument '{arg}': count {count} x {n} ranks overflows"
            ))
        })
    }
}

/// The error of rank `p`, argument `arg`, outside a comm of `size` ranks.
#[cold]
fn outside(p: i32, size: i32, arg: &str) -> Error {
    Error::invalid_argument(format!("argument '{arg}': rank {p} is outside [0, {size})"))
}

#[inline(always)]
fn buf_ok(p: Ptr, count: usize, dtype: DType, arg: &str) -> Result<()> {
    dtype.bytes(count, arg)?;
    if count > 0 && p.is_null() {
        return Err(Error::null_argument(arg));
    }
    Ok(())
}
