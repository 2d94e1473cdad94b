//! The shared-memory forms of the collectives (see [`super::intra_host`]):
//! which operations take that path and how their buffers are prepared.

use super::*;
use crate::op::Ptr;

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
        let (n, me) = (ih.size(), ih.rank());
        match op {
            Op::AllGatherSingle {
                output,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let out = output.as_u8();
                // Later chunks read the input after earlier ones wrote the
                // output: fine in place or apart, else read a copy.
                let in_place = std::ptr::eq(input.as_u8(), out.add(me * bytes));
                let (_copy, input) = private_input(
                    input.as_u8(),
                    bytes,
                    !in_place && overlaps(input.as_u8(), bytes, out, bytes * n),
                );
                Some(ih.all_gather(out, input, bytes, sync))
            }
            Op::AllGather {
                outputs,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let mut all = Scratch::new(bytes * n);
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
                input,
                counts,
                dtype,
            } => {
                let es = dtype.size();
                let (total, before) = (
                    counts.iter().sum::<usize>(),
                    counts[..me].iter().sum::<usize>(),
                );
                let in_place = std::ptr::eq(input.as_u8(), output.as_u8().add(before * es));
                let clash = !in_place
                    && overlaps(input.as_u8(), counts[me] * es, output.as_u8(), total * es);
                let (_copy, input) = private_input(input.as_u8(), counts[me] * es, clash);
                Some(ih.all_gather_v(output.as_u8(), input, counts, es, sync))
            }
            Op::Gather {
                outputs,
                input,
                count,
                dtype,
                root,
            } => {
                let bytes = count * dtype.size();
                // The root writes outputs while later chunks of its input are
                // still to be read: its own block in place, or apart, or a copy.
                let clash = outputs.iter().enumerate().any(|(r, o)| {
                    overlaps(input.as_u8(), bytes, o.as_u8(), bytes) && !(r == me && o.0 == input.0)
                });
                let (_copy, input) = private_input(input.as_u8(), bytes, clash);
                let outs: Vec<*mut u8> = outputs.iter().map(|o| o.as_u8()).collect();
                Some(ih.gather(&outs, input, bytes, *root as usize, sync))
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
        let (n, me) = (ih.size(), ih.rank());
        match op {
            Op::ReduceScatterSingle {
                output,
                input,
                count,
                dtype,
                op,
            } => {
                let (es, out) = (dtype.size(), output.as_u8());
                let in_place = std::ptr::eq(out, input.as_u8().add(me * count * es));
                let clash = !in_place && overlaps(input.as_u8(), count * es * n, out, count * es);
                let (_copy, input) = private_input(input.as_u8(), count * es * n, clash);
                Some(
                    self.reduction(*dtype, op)
                        .and_then(|r| ih.reduce_scatter(out, input, *count, &r, sync)),
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
                let mut packed = Scratch::packed(inputs, bytes);
                Some(self.reduction(*dtype, op).and_then(|r| {
                    ih.reduce_scatter(output.as_u8(), packed.ptr(), *count, &r, sync)
                }))
            }
            Op::ReduceScatterV {
                output,
                input,
                counts,
                dtype,
                op,
            } => {
                let (es, out) = (dtype.size(), output.as_u8());
                let (total, before) = (
                    counts.iter().sum::<usize>(),
                    counts[..me].iter().sum::<usize>(),
                );
                let in_place = std::ptr::eq(out, input.as_u8().add(before * es));
                let clash = !in_place && overlaps(input.as_u8(), total * es, out, counts[me] * es);
                let (_copy, input) = private_input(input.as_u8(), total * es, clash);
                Some(
                    self.reduction(*dtype, op)
                        .and_then(|r| ih.reduce_scatter_v(out, input, counts, &r, sync)),
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
                Some(shm_scatter(
                    ih,
                    *output,
                    inputs,
                    bytes,
                    *root as usize,
                    sync,
                ))
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
                input,
                count,
                dtype,
            } => {
                let (block, out) = (count * dtype.size(), output.as_u8());
                // Each chunk is read whole before any of it is written.
                let clash = !std::ptr::eq(out, input.as_u8())
                    && overlaps(input.as_u8(), block * n, out, block * n);
                let (_copy, input) = private_input(input.as_u8(), block * n, clash);
                Some(ih.all_to_all(out, input, block, sync))
            }
            Op::AllToAll {
                outputs,
                inputs,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let (mut packed, mut received) =
                    (Scratch::packed(inputs, bytes), Scratch::new(bytes * n));
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
                input,
                input_counts,
                dtype,
            } => {
                let es = dtype.size();
                let (in_total, out_total) = (
                    input_counts.iter().sum::<usize>(),
                    output_counts.iter().sum::<usize>(),
                );
                // In place with the same splits, each chunk is read before it
                // is written; any other overlap reads a copy.
                let same_layout = output.0 == input.0 && input_counts == output_counts;
                let clash = !same_layout
                    && overlaps(input.as_u8(), in_total * es, output.as_u8(), out_total * es);
                let (_copy, input) = private_input(input.as_u8(), in_total * es, clash);
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

/// The scatter of `bytes` per rank from `root`'s `inputs` into `output`.
///
/// # Safety
/// As for [`GlooBackend::intra_host_op`].
unsafe fn shm_scatter(
    ih: &intra_host::IntraHost,
    output: Ptr,
    inputs: &[Ptr],
    bytes: usize,
    root: usize,
    sync: &intra_host::SyncAll,
) -> Result<()> {
    let me = ih.rank();
    // The root's output written while later chunks of its inputs are still
    // to be read: received into a copy instead.
    let clash = inputs.iter().enumerate().any(|(r, i)| {
        overlaps(i.as_u8(), bytes, output.as_u8(), bytes) && !(r == me && i.0 == output.0)
    });
    let mut landing = Scratch::new(if clash { bytes } else { 0 });
    let out = if clash { landing.ptr() } else { output.as_u8() };
    let ins: Vec<*const u8> = inputs.iter().map(|i| i.as_u8() as *const u8).collect();
    ih.scatter(out, &ins, bytes, root, sync).map(|()| {
        if clash {
            copy(output.as_u8(), landing.ptr(), bytes);
        }
    })
}
