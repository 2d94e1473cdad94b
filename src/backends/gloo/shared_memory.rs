//! The shared-memory forms of the collectives (see [`super::intra_host`]):
//! which operations take that path and how their buffers are prepared.
//! Whether an input must be read from a private copy is decided on the
//! operation's [`Layout`] (where each rank's block lies), not re-derived
//! here.

use super::*;
use crate::op::{Layout, Ptr};

// These helpers are inlined into each operation's arm, where the op's kind
// is known, so that its layout is never built as a whole.

/// `op`'s layout as this rank of the shared-memory comm sees it.
#[inline(always)]
fn layout_of<'a>(ih: &intra_host::IntraHost, op: &'a Op) -> Layout<'a> {
    op.layout(ih.rank() as i32, ih.size() as i32)
}

/// `op`'s one input buffer, or a private copy of it when `needed` (see
/// [`private_input`]).
///
/// # Safety
/// As for [`GlooBackend::intra_host_op`].
#[inline(always)]
unsafe fn input_or_copy(layout: &Layout<'_>, needed: bool) -> Result<(Option<Scratch>, *const u8)> {
    let Layout::Apart { input, .. } = layout else {
        unreachable!("only collectives that are not in place read a private copy")
    };
    let whole = input.buffer(0);
    private_input(whole.ptr.as_u8(), whole.bytes, needed)
}

/// The input of a gather or reduce-scatter: read where it is, or from a
/// private copy when it overlaps the output anywhere but at this rank's own
/// block (later chunks would read what earlier ones wrote).
///
/// # Safety
/// As for [`GlooBackend::intra_host_op`].
#[inline(always)]
unsafe fn own_block_input(
    ih: &intra_host::IntraHost,
    op: &Op,
) -> Result<(Option<Scratch>, *const u8)> {
    let layout = layout_of(ih, op);
    input_or_copy(&layout, layout.overlaps_outside_own_block(ih.rank()))
}

/// The input of an all-to-all: read where it is when apart from the output
/// or in place with the same blocks (each chunk is read whole before any
/// of it is written), else from a private copy.
///
/// # Safety
/// As for [`GlooBackend::intra_host_op`].
#[inline(always)]
unsafe fn all_to_all_input(
    ih: &intra_host::IntraHost,
    op: &Op,
) -> Result<(Option<Scratch>, *const u8)> {
    let layout = layout_of(ih, op);
    let clash = layout.inputs_overlap_outputs() && !layout.same_blocks_in_place();
    input_or_copy(&layout, clash)
}

impl GlooBackend {
    /// Runs `op` through shared memory (see [`intra_host`]) when that path
    /// takes it; None sends it to Gloo. The choice depends only on the
    /// operation's kind, never on this rank's buffers, so every rank makes
    /// the same one: buffers that overlap in a way the chunked copies would
    /// break go through a private copy instead.
    ///
    /// # Safety
    /// The comm validated the operation's buffers against its counts.
    pub(super) unsafe fn intra_host_op(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        d: &Deadline,
    ) -> Option<Result<()>> {
        let alive = || self.check_not_broken();
        // The operation's first sync publishes and checks its fingerprint.
        let first = std::cell::Cell::new(fingerprint(op));
        let sync = |what: &str| ih.sync(what, first.take().as_ref(), d, &alive);
        let result = self.intra_host_dispatch(ih, op, &sync)?;
        // An operation that never synced (nothing to move, or an error
        // before its first transfer) still meets the other ranks' first
        // sync, so that they stay in step and see a mismatch; an error
        // shows as a call of its own that fails every rank.
        if let Some(fp) = first.take() {
            let fp = match result {
                Ok(()) => fp,
                Err(_) => signature::Fingerprint {
                    op: FAILED_ALONE,
                    ..Default::default()
                },
            };
            let synced = ih.sync(op.name(), Some(&fp), d, &alive);
            return Some(result.and(synced));
        }
        // Memory that ran out after the first sync (chunk-sized buffers
        // only: the caller-sized ones come before it) leaves this rank out
        // of step, as any failure mid-operation.
        if let Err(e) = &result {
            if e.kind == ErrorKind::OutOfMemory {
                self.mark_broken(e);
            }
        }
        Some(result)
    }

    /// The shared-memory form of `op`, if it has one. `sync` must be the
    /// first thing every form synchronises through.
    ///
    /// # Safety
    /// As for [`GlooBackend::intra_host_op`].
    pub(super) unsafe fn intra_host_dispatch(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        sync: &intra_host::SyncAll,
    ) -> Option<Result<()>> {
        match op {
            Op::Barrier | Op::Broadcast { .. } | Op::AllReduce { .. } | Op::Reduce { .. } => {
                self.shm_in_place(ih, op, sync)
            }
            Op::AllGatherSingle { .. }
            | Op::AllGather { .. }
            | Op::AllGatherV { .. }
            | Op::Gather { .. } => self.shm_gathers(ih, op, sync),
            Op::ReduceScatterSingle { .. }
            | Op::ReduceScatter { .. }
            | Op::ReduceScatterV { .. }
            | Op::Scatter { .. } => self.shm_scatters(ih, op, sync),
            Op::AllToAllSingle { .. } | Op::AllToAll { .. } | Op::AllToAllVSingle { .. } => {
                self.shm_all_to_alls(ih, op, sync)
            }
            _ => None,
        }
    }

    /// Barrier, broadcast, all-reduce and reduce: in place.
    ///
    /// # Safety
    /// As for [`GlooBackend::intra_host_op`].
    unsafe fn shm_in_place(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        sync: &intra_host::SyncAll,
    ) -> Option<Result<()>> {
        match op {
            Op::Barrier => Some(sync("barrier")),
            Op::Broadcast {
                buf,
                count,
                dtype,
                root,
            } => Some(ih.broadcast(buf.as_u8(), count * dtype.size(), *root as usize, sync)),
            Op::AllReduce {
                buf,
                count,
                dtype,
                op,
            } => Some(
                self.reduction(*dtype, op)
                    .and_then(|r| ih.reduce(buf.as_u8(), *count, &r, None, sync)),
            ),
            Op::Reduce {
                buf,
                count,
                dtype,
                root,
                op,
            } => Some(
                self.reduction(*dtype, op)
                    .and_then(|r| ih.reduce(buf.as_u8(), *count, &r, Some(*root as usize), sync)),
            ),
            _ => None,
        }
    }

    /// The all-gathers and gather.
    ///
    /// # Safety
    /// As for [`GlooBackend::intra_host_op`].
    unsafe fn shm_gathers(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        sync: &intra_host::SyncAll,
    ) -> Option<Result<()>> {
        let n = ih.size();
        match op {
            Op::AllGatherSingle {
                output,
                count,
                dtype,
                ..
            } => {
                let (_copy, input) = some_try!(own_block_input(ih, op));
                Some(ih.all_gather(output.as_u8(), input, count * dtype.size(), sync))
            }
            Op::AllGather {
                outputs,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let mut all = some_try!(Scratch::new(bytes * n));
                Some(
                    ih.all_gather(all.ptr(), input.as_u8(), bytes, sync)
                        .map(|()| {
                            for (r, out) in outputs.iter().enumerate() {
                                copy(out.as_u8(), all.ptr().add(r * bytes), bytes);
                            }
                        }),
                )
            }
            Op::AllGatherV {
                output,
                counts,
                dtype,
                ..
            } => {
                let (_copy, input) = some_try!(own_block_input(ih, op));
                Some(ih.all_gather_v(output.as_u8(), input, counts, dtype.size(), sync))
            }
            Op::Gather {
                outputs,
                count,
                dtype,
                root,
                ..
            } => {
                // The root writes outputs while later chunks of its input
                // are still read.
                let (_copy, input) = some_try!(own_block_input(ih, op));
                let outs: Vec<*mut u8> = outputs.iter().map(|o| o.as_u8()).collect();
                Some(ih.gather(&outs, input, count * dtype.size(), *root as usize, sync))
            }
            _ => None,
        }
    }

    /// The reduce-scatters and scatter.
    ///
    /// # Safety
    /// As for [`GlooBackend::intra_host_op`].
    unsafe fn shm_scatters(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        sync: &intra_host::SyncAll,
    ) -> Option<Result<()>> {
        match op {
            Op::ReduceScatterSingle {
                output,
                count,
                dtype,
                op: red,
                ..
            } => {
                let (_copy, input) = some_try!(own_block_input(ih, op));
                Some(
                    self.reduction(*dtype, red)
                        .and_then(|r| ih.reduce_scatter(output.as_u8(), input, *count, &r, sync)),
                )
            }
            Op::ReduceScatter {
                output,
                inputs,
                count,
                dtype,
                op,
            } => {
                let bytes = count * dtype.size();
                let mut packed = some_try!(Scratch::packed(inputs, bytes));
                Some(self.reduction(*dtype, op).and_then(|r| {
                    ih.reduce_scatter(output.as_u8(), packed.ptr(), *count, &r, sync)
                }))
            }
            Op::ReduceScatterV {
                output,
                counts,
                dtype,
                op: red,
                ..
            } => {
                let (_copy, input) = some_try!(own_block_input(ih, op));
                Some(
                    self.reduction(*dtype, red)
                        .and_then(|r| ih.reduce_scatter_v(output.as_u8(), input, counts, &r, sync)),
                )
            }
            Op::Scatter {
                output,
                inputs,
                count,
                dtype,
                root,
            } => {
                let bytes = count * dtype.size();
                let to = (*output, bytes, *root as usize);
                let clash = layout_of(ih, op).overlaps_outside_own_block(ih.rank());
                Some(shm_scatter(ih, to, inputs, clash, sync))
            }
            _ => None,
        }
    }

    /// The all-to-alls.
    ///
    /// # Safety
    /// As for [`GlooBackend::intra_host_op`].
    unsafe fn shm_all_to_alls(
        &self,
        ih: &intra_host::IntraHost,
        op: &Op,
        sync: &intra_host::SyncAll,
    ) -> Option<Result<()>> {
        let n = ih.size();
        match op {
            Op::AllToAllSingle {
                output,
                count,
                dtype,
                ..
            } => {
                let (_copy, input) = some_try!(all_to_all_input(ih, op));
                Some(ih.all_to_all(output.as_u8(), input, count * dtype.size(), sync))
            }
            Op::AllToAll {
                outputs,
                inputs,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let (mut packed, mut received) = (
                    some_try!(Scratch::packed(inputs, bytes)),
                    some_try!(Scratch::new(bytes * n)),
                );
                Some(
                    ih.all_to_all(received.ptr(), packed.ptr(), bytes, sync)
                        .map(|()| {
                            for (r, out) in outputs.iter().enumerate() {
                                copy(out.as_u8(), received.ptr().add(r * bytes), bytes);
                            }
                        }),
                )
            }
            Op::AllToAllVSingle {
                output,
                output_counts,
                input_counts,
                dtype,
                ..
            } => {
                let (_copy, input) = some_try!(all_to_all_input(ih, op));
                let es = dtype.size();
                Some(ih.all_to_all_v(output.as_u8(), output_counts, input, input_counts, es, sync))
            }
            _ => None,
        }
    }

    /// How the shared-memory path reduces `dtype` with `op`.
    fn reduction(&self, dtype: DType, op: &ReduceOp) -> Result<intra_host::Reduction> {
        Ok(intra_host::Reduction {
            dtype,
            f: reduce::kernel(dtype, op.kind)?,
            premul: if op.kind == RedKind::PremulSum {
                Some(premul_factor(op, dtype)?)
            } else {
                None
            },
            avg: op.kind == RedKind::Avg,
            halves: self.sums_halves(dtype, op.kind),
        })
    }
}

/// The scatter of `bytes` per rank from `root`'s `inputs` into `output`
/// (`to`: output, bytes, root); `clash`: the root's output overlaps its
/// inputs outside its own block, so it is received into a copy instead
/// (written while later chunks of the inputs are still to be read).
///
/// # Safety
/// As for [`GlooBackend::intra_host_op`].
unsafe fn shm_scatter(
    ih: &intra_host::IntraHost,
    (output, bytes, root): (Ptr, usize, usize),
    inputs: &[Ptr],
    clash: bool,
    sync: &intra_host::SyncAll,
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
