//! The shared-memory forms of the collective families: how each member's
//! buffers are prepared for the engine (see [`super::engine`]).
//! Whether an input must be read from a private copy is decided on the
//! operation's [`Layout`] (where each rank's block lies), not re-derived
//! here.

use super::super::memory::{copy, private_input, Scratch};
use super::engine::{self, IntraHost, SyncAll};
use crate::error::Result;
use crate::kernels::reduce;
use crate::kernels::reduce::host_premul_factor;
use crate::op::{
    gather_single_outputs, AllToAll, AllToAllKind, Gather, GatherKind, Layout, Ptr, Reduction,
    ReductionKind, Scatter, ScatterKind,
};
use crate::types::{DType, RedKind, ReduceOp};

// These helpers are inlined into each member's arm, where the op's kind is
// known, so that its layout is never built as a whole.

/// The one input buffer of `layout`, or a private copy of it when `needed`
/// (see [`private_input`]).
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
unsafe fn input_or_copy(layout: &Layout<'_>, needed: bool) -> Result<(Option<Scratch>, *const u8)> {
    let Layout::Apart { input, .. } = layout else {
        unreachable!("only collectives that are not in place read a private copy")
    };
    let whole = input.buffer(0);
    private_input(whole.ptr.as_u8(), whole.bytes, needed)
}

/// The input of a gather or reduce-scatter (of `layout`): read where it
/// is, or from a private copy when it overlaps the output anywhere but at
/// this rank's own block (later chunks would read what earlier ones
/// wrote).
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
unsafe fn own_block_input(
    ih: &IntraHost,
    layout: Layout<'_>,
) -> Result<(Option<Scratch>, *const u8)> {
    input_or_copy(&layout, layout.overlaps_outside_own_block(ih.rank()))
}

/// The input of an all-to-all: read where it is when apart from the output
/// or in place with the same blocks (each chunk is read whole before any
/// of it is written), else from a private copy.
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
unsafe fn all_to_all_input(ih: &IntraHost, a: &AllToAll) -> Result<(Option<Scratch>, *const u8)> {
    let layout = a.layout(ih.rank() as i32, ih.size() as i32);
    let clash = layout.inputs_overlap_outputs() && !layout.same_blocks_in_place();
    input_or_copy(&layout, clash)
}

/// All-reduce and reduce (in place), and the reduce-scatters.
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
pub(super) unsafe fn reduction(ih: &IntraHost, r: &Reduction, sync: &SyncAll) -> Result<()> {
    let layout = || r.layout(ih.rank() as i32, ih.size() as i32);
    match &r.kind {
        ReductionKind::AllReduce { buf, count } => {
            let how = plan(ih, r.dtype, &r.op)?;
            ih.reduce(buf.as_u8(), *count, &how, None, sync)
        }
        ReductionKind::Reduce { buf, count, root } => {
            let how = plan(ih, r.dtype, &r.op)?;
            ih.reduce(buf.as_u8(), *count, &how, Some(*root as usize), sync)
        }
        ReductionKind::ReduceScatterSingle { output, count, .. } => {
            let (_copy, input) = own_block_input(ih, layout())?;
            let how = plan(ih, r.dtype, &r.op)?;
            ih.reduce_scatter(output.as_u8(), input, *count, &how, sync)
        }
        ReductionKind::ReduceScatter {
            output,
            inputs,
            count,
        } => {
            let bytes = count * r.dtype.size();
            let mut packed = Scratch::packed(inputs, bytes)?;
            let how = plan(ih, r.dtype, &r.op)?;
            ih.reduce_scatter(output.as_u8(), packed.ptr(), *count, &how, sync)
        }
        ReductionKind::ReduceScatterV { output, counts, .. } => {
            let (_copy, input) = own_block_input(ih, layout())?;
            let how = plan(ih, r.dtype, &r.op)?;
            ih.reduce_scatter_v(output.as_u8(), input, counts, &how, sync)
        }
    }
}

/// The all-gathers and gathers.
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
pub(super) unsafe fn gather(ih: &IntraHost, g: &Gather, sync: &SyncAll) -> Result<()> {
    let n = ih.size();
    let layout = || g.layout(ih.rank() as i32, n as i32);
    let (dtype, input) = (g.dtype, g.input);
    match &g.kind {
        GatherKind::AllGatherSingle { output, count } => {
            let (_copy, input) = own_block_input(ih, layout())?;
            ih.all_gather(output.as_u8(), input, count * dtype.size(), sync)
        }
        GatherKind::AllGather { outputs, count } => {
            let bytes = count * dtype.size();
            let mut all = Scratch::new(bytes * n)?;
            ih.all_gather(all.ptr(), input.as_u8(), bytes, sync)
                .map(|()| {
                    for (r, out) in outputs.iter().enumerate() {
                        copy(out.as_u8(), all.ptr().add(r * bytes), bytes);
                    }
                })
        }
        GatherKind::AllGatherV { output, counts } => {
            let (_copy, input) = own_block_input(ih, layout())?;
            ih.all_gather_v(output.as_u8(), input, counts, dtype.size(), sync)
        }
        GatherKind::Gather {
            outputs,
            count,
            root,
        } => {
            let outs: Vec<*mut u8> = outputs.iter().map(|o| o.as_u8()).collect();
            shm_gather_to_root(ih, layout(), &outs, count * dtype.size(), *root, sync)
        }
        GatherKind::GatherSingle {
            output,
            count,
            root,
        } => {
            // Written in place: the root's blocks as a gather's list.
            let at = (ih.rank() as i32, *root, n as i32);
            let outputs = gather_single_outputs(*output, *count, dtype, at);
            let outs: Vec<*mut u8> = outputs.iter().map(|o| o.as_u8()).collect();
            shm_gather_to_root(ih, layout(), &outs, count * dtype.size(), *root, sync)
        }
    }
}

/// Broadcast (in place) and scatter.
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
pub(super) unsafe fn scatter(ih: &IntraHost, s: &Scatter, sync: &SyncAll) -> Result<()> {
    let bytes = s.count * s.dtype.size();
    let root = s.root as usize;
    match &s.kind {
        ScatterKind::Broadcast { buf } => ih.broadcast(buf.as_u8(), bytes, root, sync),
        ScatterKind::Scatter { output, inputs } => {
            let clash = s.layout().overlaps_outside_own_block(ih.rank());
            scatter_from_root(ih, (*output, bytes, root), inputs, clash, sync)
        }
    }
}

/// The all-to-alls.
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
pub(super) unsafe fn all_to_all(ih: &IntraHost, a: &AllToAll, sync: &SyncAll) -> Result<()> {
    let n = ih.size();
    let es = a.dtype.size();
    match &a.kind {
        AllToAllKind::Single { output, count, .. } => {
            let (_copy, input) = all_to_all_input(ih, a)?;
            ih.all_to_all(output.as_u8(), input, count * es, sync)
        }
        AllToAllKind::Lists {
            outputs,
            inputs,
            count,
        } => {
            let bytes = count * es;
            let (mut packed, mut received) =
                (Scratch::packed(inputs, bytes)?, Scratch::new(bytes * n)?);
            ih.all_to_all(received.ptr(), packed.ptr(), bytes, sync)
                .map(|()| {
                    for (r, out) in outputs.iter().enumerate() {
                        copy(out.as_u8(), received.ptr().add(r * bytes), bytes);
                    }
                })
        }
        AllToAllKind::VSingle {
            output,
            output_counts,
            input_counts,
            ..
        } => {
            let (_copy, input) = all_to_all_input(ih, a)?;
            ih.all_to_all_v(output.as_u8(), output_counts, input, input_counts, es, sync)
        }
    }
}

/// How the shared-memory path reduces `dtype` with `op`.
#[inline(always)]
fn plan(ih: &IntraHost, dtype: DType, op: &ReduceOp) -> Result<engine::Reduction> {
    Ok(engine::Reduction {
        dtype,
        f: reduce::kernel(dtype, op.kind)?,
        premul: if op.kind == RedKind::PremulSum {
            Some(host_premul_factor(op, dtype)?)
        } else {
            None
        },
        avg: op.kind == RedKind::Avg,
        halves: ih.size() > 1 && op.kind.sums_halves(dtype),
    })
}

/// The gather of `bytes` per rank into the root's `outs` (one per rank on
/// the root, none elsewhere): the root writes outputs while later chunks
/// of its input are still read, so an input overlapping them (in
/// `layout`) is read from a private copy.
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
#[inline(always)]
unsafe fn shm_gather_to_root(
    ih: &IntraHost,
    layout: Layout<'_>,
    outs: &[*mut u8],
    bytes: usize,
    root: i32,
    sync: &SyncAll,
) -> Result<()> {
    let (_copy, input) = own_block_input(ih, layout)?;
    ih.gather(outs, input, bytes, root as usize, sync)
}

/// The scatter of `bytes` per rank from `root`'s `inputs` into `output`
/// (`to`: output, bytes, root); `clash`: the root's output overlaps its
/// inputs outside its own block, so it is received into a copy instead
/// (written while later chunks of the inputs are still to be read).
///
/// # Safety
/// As for [`super::SharedMemory::collective`].
unsafe fn scatter_from_root(
    ih: &IntraHost,
    (output, bytes, root): (Ptr, usize, usize),
    inputs: &[Ptr],
    clash: bool,
    sync: &SyncAll,
) -> Result<()> {
    let mut landing = Scratch::new(if clash { bytes } else { 0 })?;
    let out = if clash { landing.ptr() } else { output.as_u8() };
    let ins: Vec<*const u8> = inputs.iter().map(|i| i.as_u8() as *const u8).collect();
    ih.scatter(out, &ins, bytes, root, sync).map(|()| {
        if clash {
            copy(output.as_u8(), landing.ptr(), bytes);
        }
    })
}
