//! The walk over every buffer an operation reads or writes, as seen from
//! one rank, with a way to rewrite each address: host staging of CUDA
//! buffers, the nccl backend's pointer checks and the NaN check use it.
//! Sizes and uses come from the operation's [`Layout`](super::Layout).

use super::{AllToAllKind, Gather, GatherKind, Layout, Op, Ptr, ReductionKind, ScatterKind};
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
/// of `size`, inputs before outputs, in the order of [`Layout::each`]
/// (lists that are empty off the root, and a gather_single's output off the
/// root, are skipped). `f` may rewrite the address. `op` must have been
/// validated, so the sizes cannot overflow.
pub fn for_each_buffer(op: &mut Op, rank: i32, size: i32, f: Visit<'_>) -> Result<()> {
    // Per side, (bytes, use) of each buffer the layout has; then the
    // addresses, side by side, for `f` to rewrite.
    let mut shape: [Vec<(usize, Use)>; 2] = Default::default();
    match op.layout(rank, size) {
        Layout::Apart { input, output } => {
            shape[0] = input.buffers().map(|s| (s.bytes, Use::In)).collect();
            shape[1] = output.buffers().map(|s| (s.bytes, Use::Out)).collect();
        }
        l => l.each(|s, u| shape[0].push((s.bytes, u))),
    }
    for (side, ptrs) in shape.iter().zip(pointers_mut(op)) {
        // An absent side (a gather_single's output off the root) has an
        // address the operation ignores.
        if side.is_empty() {
            continue;
        }
        debug_assert_eq!(
            side.len(),
            ptrs.len(),
            "the layout's buffers and the op's fields"
        );
        for ((bytes, usage), p) in side.iter().zip(ptrs) {
            f(p, *bytes, *usage)?;
        }
    }
    Ok(())
}

/// Every address field of `op`: [inputs, outputs] for the collectives that
/// are not in place, in the order of [`Layout::each`]; the one buffer, or a
/// batch's members, first otherwise.
fn pointers_mut(op: &mut Op) -> [Vec<&mut Ptr>; 2] {
    match op {
        Op::Barrier | Op::Refused(_) => Default::default(),
        Op::PointToPoint(p) => [
            p.transfers_mut().iter_mut().map(|p| &mut p.buf).collect(),
            Vec::new(),
        ],
        Op::Reduction(r) => match &mut r.kind {
            ReductionKind::AllReduce { buf, .. } | ReductionKind::Reduce { buf, .. } => {
                [vec![buf], Vec::new()]
            }
            ReductionKind::ReduceScatter { output, inputs, .. } => {
                [inputs.iter_mut().collect(), vec![output]]
            }
            ReductionKind::ReduceScatterSingle { output, input, .. }
            | ReductionKind::ReduceScatterV { output, input, .. } => [vec![input], vec![output]],
        },
        Op::Gather(Gather { input, kind, .. }) => match kind {
            GatherKind::AllGather { outputs, .. } | GatherKind::Gather { outputs, .. } => {
                [vec![input], outputs.iter_mut().collect()]
            }
            GatherKind::AllGatherSingle { output, .. }
            | GatherKind::AllGatherV { output, .. }
            | GatherKind::GatherSingle { output, .. } => [vec![input], vec![output]],
        },
        Op::Scatter(s) => match &mut s.kind {
            ScatterKind::Broadcast { buf } => [vec![buf], Vec::new()],
            ScatterKind::Scatter { output, inputs } => [inputs.iter_mut().collect(), vec![output]],
        },
        Op::AllToAll(a) => match &mut a.kind {
            AllToAllKind::AllToAll {
                outputs, inputs, ..
            } => [inputs.iter_mut().collect(), outputs.iter_mut().collect()],
            AllToAllKind::AllToAllSingle { output, input, .. }
            | AllToAllKind::AllToAllVSingle { output, input, .. } => [vec![input], vec![output]],
        },
    }
}
