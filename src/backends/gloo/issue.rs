//! Issue: one operation through the shared-memory path when it takes it,
//! else through Gloo, one function per family of operations.

use super::*;
use crate::op::Ptr;

impl GlooBackend {
    pub(super) fn execute(&self, op: &Op, d: &Deadline) -> Result<()> {
        if let Op::Refused(refusal) = op {
            return self.refuse(refusal, d);
        }
        if self.check_collectives {
            self.check_collective(op, d)?;
        }
        if let Some(h) = &self.hier {
            // SAFETY: as for `execute_gloo`.
            if let Some(result) = unsafe { h.run(self, op, d) } {
                // A failed step leaves this rank out of step with the others.
                return result.inspect_err(|e| {
                    if !matches!(e.kind, ErrorKind::InvalidUsage | ErrorKind::InvalidArgument) {
                        self.mark_broken(e)
                    }
                });
            }
        }
        if let Some(ih) = &self.intra {
            let p2p = is_point_to_point(op);
            // The shared-memory path writes gather_single's blocks in place.
            let lowered = op.gather_single_as_gather(self.rank, self.size);
            // SAFETY: as for `execute_gloo`.
            let shared = unsafe {
                match p2p {
                    true => ih.has_p2p().then(|| self.shm_p2p(ih, op, d)),
                    false => self.intra_host_op(ih, lowered.as_ref().unwrap_or(op), d),
                }
            };
            if let Some(result) = shared {
                // Ranks that failed mid-operation are out of step. Argument
                // errors and caller-sized allocations come before any sync,
                // and calls that differ are found by all ranks at the same
                // sync: those stay in step (see `intra_host_op`).
                return result.inspect_err(|e| {
                    if !matches!(
                        e.kind,
                        ErrorKind::InvalidUsage
                            | ErrorKind::InvalidArgument
                            | ErrorKind::Unsupported
                            | ErrorKind::OutOfMemory
                    ) {
                        self.mark_broken(e)
                    }
                });
            }
        }
        if let Some(u) = &self.ucx {
            let alive = || self.check_not_broken();
            // SAFETY: as for `execute_gloo`.
            if let Some(result) = unsafe { u.run(op, d, &alive) } {
                return result.inspect_err(|e| {
                    if !matches!(e.kind, ErrorKind::InvalidUsage | ErrorKind::InvalidArgument) {
                        self.mark_broken(e)
                    }
                });
            }
        }
        lock(&self.seqs).salt = tag_salt(op);
        let result = self.execute_gloo(op, d);
        lock(&self.seqs).salt = 0;
        match result {
            Err(e) if e.kind == ErrorKind::OutOfMemory => match is_point_to_point(op) {
                false => Err(self.refuse_out_of_memory(op, e, d)),
                // A peer's matching call would wait until its timeout.
                true => {
                    self.mark_broken(&e);
                    Err(e)
                }
            },
            result => result,
        }
    }

    /// A collective whose scratch memory ran out on this rank over Gloo:
    /// the peers wait only for its messages, so it is told to them as a
    /// refusal (see [`GlooBackend::refuse`]): they fail within about a
    /// second naming this rank and the allocation, never pairing this call
    /// with this rank's next one.
    #[cold]
    fn refuse_out_of_memory(&self, op: &Op, error: Error, d: &Deadline) -> Error {
        let error = error.context(op.name());
        let refusal = crate::op::Refusal {
            call: op.name(),
            rank: self.rank,
            error: error.clone(),
        };
        match self.refuse(&refusal, d) {
            Ok(()) => error,
            Err(told) => Error::new(
                error.kind,
                format!(
                    "{}; telling the other ranks failed: {}",
                    error.message, told.message
                ),
            ),
        }
    }

    /// `op` through Gloo, its tags carrying its salt (see [`tag_salt`]).
    pub(super) fn execute_gloo(&self, op: &Op, d: &Deadline) -> Result<()> {
        // SAFETY (every family): the comm validated every pointer against its
        // count, and the caller keeps the buffers alive until completion.
        unsafe {
            match op {
                Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. } => {
                    self.gloo_point_to_point(op, d)
                }
                Op::AllReduce { .. } | Op::Reduce { .. } => self.gloo_reductions(op, d),
                Op::AllGather { .. } | Op::AllGatherSingle { .. } | Op::AllGatherV { .. } => {
                    self.gloo_all_gathers(op, d)
                }
                Op::ReduceScatter { .. }
                | Op::ReduceScatterSingle { .. }
                | Op::ReduceScatterV { .. } => self.gloo_reduce_scatters(op, d),
                Op::AllToAll { .. } | Op::AllToAllSingle { .. } | Op::AllToAllVSingle { .. } => {
                    self.gloo_all_to_alls(op, d)
                }
                Op::Broadcast { .. } | Op::Barrier => self.gloo_broadcast_or_barrier(op, d),
                Op::Scatter { .. } | Op::Gather { .. } | Op::GatherSingle { .. } => {
                    self.gloo_scatter_or_gather(op, d)
                }
                Op::Refused(refusal) => self.refuse(refusal, d),
            }
        }
    }

    /// Send, receive and batch.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_point_to_point(&self, op: &Op, d: &Deadline) -> Result<()> {
        match (op, op.as_transfer()) {
            (Op::Batch { ops }, _) => self.p2p(ops, d),
            (_, Some(single)) => self.p2p(&[single], d),
            _ => Err(misrouted("point_to_point", op)),
        }
    }

    /// All-reduce and reduce (float16/bfloat16 sums accumulated in f32).
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_reductions(&self, op: &Op, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        match op {
            Op::AllReduce {
                buf,
                count,
                dtype,
                op,
            } if self.sums_halves(*dtype, op.kind) && *count >= n => {
                // A reduce-scatter (summing in f32, rounding once) and an
                // all-gather: the data volume of a ring all-reduce, the
                // precision of one rounding instead of one per rank.
                let counts: Vec<usize> = (0..n)
                    .map(|r| *count / n + usize::from(r < *count % n))
                    .collect();
                let es = dtype.size();
                let offset = counts[..me].iter().sum::<usize>() * es;
                self.reduce_scatter_blocks(
                    buf.as_u8(),
                    buf.as_u8().add(offset),
                    &counts,
                    *dtype,
                    op,
                    d,
                )?;
                let sizes: Vec<usize> = counts.iter().map(|c| c * es).collect();
                let mut own = Scratch::new(sizes[me])?;
                copy(own.ptr(), buf.as_u8().add(offset), sizes[me]);
                let tag = self.next_tag();
                self.ctx()
                    .allgatherv(own.ptr(), buf.as_u8(), &sizes, tag, d.left()?)
                    .map_err(|e| self.fail("all_reduce", e))
            }
            Op::AllReduce {
                buf,
                count,
                dtype,
                op,
            } => {
                let f = reduce::kernel(*dtype, op.kind)?;
                if op.kind == RedKind::PremulSum {
                    let k = premul_factor(op, *dtype)?;
                    reduce::scale(*dtype, buf.as_u8(), buf.as_u8(), *count, Scale::Mul(k))?;
                }
                self.g_allreduce(buf.as_u8(), *count, *dtype, f, d)?;
                if op.kind == RedKind::Avg {
                    reduce::scale(
                        *dtype,
                        buf.as_u8(),
                        buf.as_u8(),
                        *count,
                        Scale::Div(n as u64),
                    )?;
                }
                Ok(())
            }
            Op::Reduce {
                buf,
                count,
                dtype,
                root,
                op,
            } if self.sums_halves(*dtype, op.kind) && *count >= n => {
                self.reduce_halves(buf.as_u8(), *count, *dtype, *root, op, d)
            }
            Op::Reduce {
                buf,
                count,
                dtype,
                root,
                op,
            } => self.reduce(buf.as_u8(), *count, *dtype, *root, op, d),
            _ => Err(misrouted("reductions", op)),
        }
    }

    /// The all-gathers: list, single-buffer and per-rank counts.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_all_gathers(&self, op: &Op, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        match op {
            Op::AllGather {
                outputs,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let mut tmp = Scratch::new(bytes * n)?;
                self.all_gather_into(input.as_u8(), tmp.ptr(), bytes, d)?;
                for (r, out) in outputs.iter().enumerate() {
                    copy(out.as_u8(), tmp.ptr().add(r * bytes), bytes);
                }
                Ok(())
            }
            Op::AllGatherSingle {
                output,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let out = output.as_u8();
                let layout = op.layout(self.rank, self.size);
                let in_place = layout
                    .own_and_block(me)
                    .is_some_and(|(own, block)| own.ptr == block.ptr);
                if in_place {
                    self.all_gather_into(std::ptr::null(), out, bytes, d)
                } else if layout.inputs_overlap_outputs() {
                    let mut tmp = Scratch::new(bytes)?;
                    copy(tmp.ptr(), input.as_u8(), bytes);
                    self.all_gather_into(tmp.ptr(), out, bytes, d)
                } else {
                    self.all_gather_into(input.as_u8(), out, bytes, d)
                }
            }
            Op::AllGatherV {
                output,
                input,
                counts,
                dtype,
            } => {
                self.agree_counts("all_gather_v", counts, d)?;
                let es = dtype.size();
                let sizes: Vec<usize> = counts.iter().map(|c| c * es).collect();
                let total: usize = sizes.iter().sum();
                let mine = sizes[me];
                let out = output.as_u8();
                if n == 1 {
                    copy(out, input.as_u8(), mine);
                    return Ok(());
                }
                if total == 0 {
                    return Ok(());
                }
                let mut tmp = Scratch::new(mine)?;
                copy(tmp.ptr(), input.as_u8(), mine);
                let tag = self.next_tag();
                self.ctx()
                    .allgatherv(tmp.ptr(), out, &sizes, tag, d.left()?)
                    .map_err(|e| self.fail("all_gather_v", e))?;
                Ok(())
            }
            _ => Err(misrouted("all_gathers", op)),
        }
    }

    /// The reduce-scatters: one all-to-all and a local reduction.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_reduce_scatters(&self, op: &Op, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        match op {
            Op::ReduceScatter {
                output,
                inputs,
                count,
                dtype,
                op,
            } => {
                let bytes = count * dtype.size();
                let mut tmp = Scratch::packed(inputs, bytes)?;
                self.reduce_scatter_blocks(
                    tmp.ptr(),
                    output.as_u8(),
                    &vec![*count; n],
                    *dtype,
                    op,
                    d,
                )
            }
            Op::ReduceScatterSingle {
                output,
                input,
                count,
                dtype,
                op,
            } => self.reduce_scatter_blocks(
                input.as_u8(),
                output.as_u8(),
                &vec![*count; n],
                *dtype,
                op,
                d,
            ),
            Op::ReduceScatterV {
                output,
                input,
                counts,
                dtype,
                op,
            } => {
                self.agree_counts("reduce_scatter_v", counts, d)?;
                self.reduce_scatter_blocks(input.as_u8(), output.as_u8(), counts, *dtype, op, d)
            }
            _ => Err(misrouted("reduce_scatters", op)),
        }
    }

    /// The all-to-alls: list, single-buffer and per-rank counts.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_all_to_alls(&self, op: &Op, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        match op {
            Op::AllToAll {
                outputs,
                inputs,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                let mut tin = Scratch::packed(inputs, bytes)?;
                let mut tout = Scratch::new(bytes * n)?;
                self.all_to_all(tin.ptr(), tout.ptr(), bytes, d)?;
                for (r, p) in outputs.iter().enumerate() {
                    copy(p.as_u8(), tout.ptr().add(r * bytes), bytes);
                }
                Ok(())
            }
            Op::AllToAllSingle {
                output,
                input,
                count,
                dtype,
            } => {
                let bytes = count * dtype.size();
                if op.layout(self.rank, self.size).inputs_overlap_outputs() {
                    let mut tin = Scratch::new(bytes * n)?;
                    copy(tin.ptr(), input.as_u8(), bytes * n);
                    self.all_to_all(tin.ptr(), output.as_u8(), bytes, d)
                } else {
                    self.all_to_all(input.as_u8(), output.as_u8(), bytes, d)
                }
            }
            Op::AllToAllVSingle {
                output,
                output_counts,
                input,
                input_counts,
                dtype,
            } => self.all_to_all_v(
                (output.as_u8(), output_counts),
                (input.as_u8(), input_counts),
                *dtype,
                op.layout(self.rank, self.size).inputs_overlap_outputs(),
                d,
            ),
            _ => Err(misrouted("all_to_alls", op)),
        }
    }

    /// Broadcast and barrier.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_broadcast_or_barrier(&self, op: &Op, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        match op {
            Op::Broadcast {
                buf,
                count,
                dtype,
                root,
            } => {
                let bytes = count * dtype.size();
                if n == 1 || bytes == 0 {
                    return Ok(());
                }
                let tag = self.next_tag();
                self.ctx()
                    .broadcast(buf.as_u8(), bytes, *root, tag, d.left()?)
                    .map_err(|e| self.fail("broadcast", e))
            }
            Op::Barrier => {
                if n == 1 {
                    return Ok(());
                }
                let tag = self.next_tag();
                self.ctx()
                    .barrier(tag, d.left()?)
                    .map_err(|e| self.fail("barrier", e))
            }
            _ => Err(misrouted("broadcast_or_barrier", op)),
        }
    }

    /// Scatter and gather (the root holds one buffer per rank).
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_scatter_or_gather(&self, op: &Op, d: &Deadline) -> Result<()> {
        let layout = op.layout(self.rank, self.size);
        match op {
            Op::Scatter {
                output,
                inputs,
                count,
                dtype,
                root,
            } => {
                // The root's own block overlapping its output: read from a
                // copy.
                let own_clash = layout
                    .own_and_block(self.rank as usize)
                    .is_some_and(|(own, block)| own.overlaps(&block));
                let to = (*output, count * dtype.size(), *root);
                self.gloo_scatter(to, inputs, own_clash, d)
            }
            Op::Gather {
                outputs,
                input,
                count,
                dtype,
                root,
            } => self.gloo_gather(outputs, *input, count * dtype.size(), *root, d),
            Op::GatherSingle {
                output,
                input,
                count,
                dtype,
                root,
            } => {
                // Gloo reads the root's input while it writes the output.
                let clash = layout.inputs_overlap_outputs();
                let at = (*output, count * dtype.size(), *root);
                self.gloo_gather_single(at, *input, clash, d)
            }
            _ => Err(misrouted("scatter_or_gather", op)),
        }
    }

    /// The scatter of `bytes` per rank from `root`'s `inputs` into `output`
    /// (`to`: output, bytes, root); `own_clash`: the root's own input
    /// overlaps its output, and is read from a copy.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_scatter(
        &self,
        (output, bytes, root): (Ptr, usize, i32),
        inputs: &[Ptr],
        own_clash: bool,
        d: &Deadline,
    ) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        if n == 1 {
            copy(output.as_u8(), inputs[0].as_u8(), bytes);
            return Ok(());
        }
        if bytes == 0 {
            return Ok(());
        }
        let mut ins: Vec<*const u8> = Vec::new();
        let mut own = Scratch::new(0)?;
        if self.rank == root {
            ins = inputs.iter().map(|p| p.as_u8() as *const u8).collect();
            if own_clash {
                own = Scratch::new(bytes)?;
                copy(own.ptr(), ins[me], bytes);
                ins[me] = own.ptr();
            }
        }
        let tag = self.next_tag();
        let r = self
            .ctx()
            .scatter(&ins, output.as_u8(), bytes, root, tag, d.left()?)
            .map_err(|e| self.fail("scatter", e));
        drop(own);
        r
    }

    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_gather(
        &self,
        outputs: &[Ptr],
        input: Ptr,
        bytes: usize,
        root: i32,
        d: &Deadline,
    ) -> Result<()> {
        let n = self.size as usize;
        if n == 1 {
            copy(outputs[0].as_u8(), input.as_u8(), bytes);
            return Ok(());
        }
        if bytes == 0 {
            return Ok(());
        }
        let is_root = self.rank == root;
        let mut tmp = Scratch::new(if is_root { bytes * n } else { 0 })?;
        let tag = self.next_tag();
        self.ctx()
            .gather(input.as_u8(), tmp.ptr(), bytes, root, tag, d.left()?)
            .map_err(|e| self.fail("gather", e))?;
        if is_root {
            for (r, p) in outputs.iter().enumerate() {
                copy(p.as_u8(), tmp.ptr().add(r * bytes), bytes);
            }
        }
        Ok(())
    }

    /// The gather of `bytes` per rank into `root`'s `output` (`at`: output,
    /// bytes, root); `clash`: the root's input overlaps its output, and is
    /// read from a copy.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute_gloo`].
    unsafe fn gloo_gather_single(
        &self,
        (output, bytes, root): (Ptr, usize, i32),
        input: Ptr,
        clash: bool,
        d: &Deadline,
    ) -> Result<()> {
        let n = self.size as usize;
        if bytes == 0 {
            return Ok(());
        }
        let is_root = self.rank == root;
        let out = if is_root {
            output.as_u8()
        } else {
            std::ptr::null_mut()
        };
        // Gloo reads the root's input while it writes the output.
        let mut own = Scratch::new(0)?;
        let mut src = input.as_u8() as *const u8;
        if clash {
            own = Scratch::new(bytes)?;
            copy(own.ptr(), src, bytes);
            src = own.ptr();
        }
        if n == 1 {
            copy(out, src, bytes);
            return Ok(());
        }
        let tag = self.next_tag();
        let r = self
            .ctx()
            .gather(src, out, bytes, root, tag, d.left()?)
            .map_err(|e| self.fail("gather_single", e));
        drop(own);
        r
    }
}

fn is_point_to_point(op: &Op) -> bool {
    matches!(op, Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. })
}
