//! The one description of the buffers an operation reads or writes: each
//! buffer's address, its size in bytes and how the operation uses it, as
//! seen from one rank. Host staging of CUDA buffers and the nccl backend's
//! pointer checks walk it.

use super::{Op, Ptr};
use crate::error::Result;

/// How an operation uses one of its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Read only.
    In,
    /// Written only.
    Out,
    /// Read and written (in-place operations).
    InOut,
}

/// The visitor of [`for_each_buffer`].
type Visit<'a> = &'a mut dyn FnMut(&mut Ptr, usize, Use) -> Result<()>;

/// Calls `f(buffer, bytes, use)` for every buffer of `op` as seen by `rank`
/// of `size` (lists that are empty off the root are skipped). `op` must have
/// been validated, so the sizes cannot overflow.
pub fn for_each_buffer(op: &mut Op, rank: i32, size: i32, f: Visit<'_>) -> Result<()> {
    match op {
        Op::Send { .. }
        | Op::Recv { .. }
        | Op::Batch { .. }
        | Op::Broadcast { .. }
        | Op::Barrier
        | Op::Reduce { .. }
        | Op::AllReduce { .. } => p2p_and_in_place(op, f),
        Op::AllGather { .. }
        | Op::AllGatherSingle { .. }
        | Op::AllGatherV { .. }
        | Op::Gather { .. }
        | Op::GatherSingle { .. } => gather_buffers(op, rank, size, f),
        Op::ReduceScatter { .. }
        | Op::ReduceScatterSingle { .. }
        | Op::ReduceScatterV { .. }
        | Op::Scatter { .. } => scatter_buffers(op, rank, size, f),
        Op::AllToAll { .. } | Op::AllToAllSingle { .. } | Op::AllToAllVSingle { .. } => {
            all_to_all_buffers(op, size, f)
        }
    }
}

/// Point-to-point operations and the in-place collectives (one buffer,
/// read and written).
fn p2p_and_in_place(op: &mut Op, f: Visit<'_>) -> Result<()> {
    match op {
        Op::Send {
            buf, count, dtype, ..
        } => f(buf, *count * dtype.size(), Use::In),
        Op::Recv {
            buf, count, dtype, ..
        } => f(buf, *count * dtype.size(), Use::Out),
        Op::Batch { ops } => ops.iter_mut().try_for_each(|p| {
            let bytes = p.count * p.dtype.size();
            f(
                &mut p.buf,
                bytes,
                if p.is_send { Use::In } else { Use::Out },
            )
        }),
        Op::Broadcast {
            buf, count, dtype, ..
        }
        | Op::Reduce {
            buf, count, dtype, ..
        }
        | Op::AllReduce {
            buf, count, dtype, ..
        } => f(buf, *count * dtype.size(), Use::InOut),
        Op::Barrier => Ok(()),
        _ => unreachable!("for_each_buffer sends only its own operations here"),
    }
}

/// The all-gathers and gathers: an input block, an output of one block per
/// rank (on the root only, for the gathers).
fn gather_buffers(op: &mut Op, rank: i32, size: i32, f: Visit<'_>) -> Result<()> {
    let n = size as usize;
    let me = rank as usize;
    let sum = |c: &[usize]| c.iter().sum::<usize>();
    match op {
        Op::AllGather {
            outputs,
            input,
            count,
            dtype,
        } => {
            let b = *count * dtype.size();
            f(input, b, Use::In)?;
            outputs.iter_mut().try_for_each(|o| f(o, b, Use::Out))
        }
        Op::AllGatherSingle {
            output,
            input,
            count,
            dtype,
        } => {
            f(input, *count * dtype.size(), Use::In)?;
            f(output, *count * n * dtype.size(), Use::Out)
        }
        Op::AllGatherV {
            output,
            input,
            counts,
            dtype,
        } => {
            f(input, counts[me] * dtype.size(), Use::In)?;
            f(output, sum(counts) * dtype.size(), Use::Out)
        }
        Op::Gather {
            outputs,
            input,
            count,
            dtype,
            ..
        } => {
            let b = *count * dtype.size();
            f(input, b, Use::In)?;
            outputs.iter_mut().try_for_each(|o| f(o, b, Use::Out))
        }
        Op::GatherSingle {
            output,
            input,
            count,
            dtype,
            root,
        } => {
            f(input, *count * dtype.size(), Use::In)?;
            if *root != rank {
                return Ok(());
            }
            f(output, *count * n * dtype.size(), Use::Out)
        }
        _ => unreachable!("for_each_buffer sends only its own operations here"),
    }
}

/// The reduce-scatters and scatter: an input of one block per rank, an
/// output block.
fn scatter_buffers(op: &mut Op, rank: i32, size: i32, f: Visit<'_>) -> Result<()> {
    let n = size as usize;
    let me = rank as usize;
    let sum = |c: &[usize]| c.iter().sum::<usize>();
    match op {
        Op::ReduceScatter {
            output,
            inputs,
            count,
            dtype,
            ..
        } => {
            let b = *count * dtype.size();
            inputs.iter_mut().try_for_each(|i| f(i, b, Use::In))?;
            f(output, b, Use::Out)
        }
        Op::ReduceScatterSingle {
            output,
            input,
            count,
            dtype,
            ..
        } => {
            f(input, *count * n * dtype.size(), Use::In)?;
            f(output, *count * dtype.size(), Use::Out)
        }
        Op::ReduceScatterV {
            output,
            input,
            counts,
            dtype,
            ..
        } => {
            f(input, sum(counts) * dtype.size(), Use::In)?;
            f(output, counts[me] * dtype.size(), Use::Out)
        }
        Op::Scatter {
            output,
            inputs,
            count,
            dtype,
            ..
        } => {
            let b = *count * dtype.size();
            inputs.iter_mut().try_for_each(|i| f(i, b, Use::In))?;
            f(output, b, Use::Out)
        }
        _ => unreachable!("for_each_buffer sends only its own operations here"),
    }
}

/// The all-to-alls: an input and an output of one block per rank.
fn all_to_all_buffers(op: &mut Op, size: i32, f: Visit<'_>) -> Result<()> {
    let n = size as usize;
    let sum = |c: &[usize]| c.iter().sum::<usize>();
    match op {
        Op::AllToAll {
            outputs,
            inputs,
            count,
            dtype,
        } => {
            let b = *count * dtype.size();
            inputs.iter_mut().try_for_each(|i| f(i, b, Use::In))?;
            outputs.iter_mut().try_for_each(|o| f(o, b, Use::Out))
        }
        Op::AllToAllSingle {
            output,
            input,
            count,
            dtype,
        } => {
            f(input, *count * n * dtype.size(), Use::In)?;
            f(output, *count * n * dtype.size(), Use::Out)
        }
        Op::AllToAllVSingle {
            output,
            output_counts,
            input,
            input_counts,
            dtype,
        } => {
            f(input, sum(input_counts) * dtype.size(), Use::In)?;
            f(output, sum(output_counts) * dtype.size(), Use::Out)
        }
        _ => unreachable!("for_each_buffer sends only its own operations here"),
    }
}
