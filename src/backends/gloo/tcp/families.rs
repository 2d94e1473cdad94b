//! The families of operations over Gloo (TCP): one function per family,
//! each matching every member, and the scatter and gathers they share.
//! The transport's family methods (`transport.rs`) hand each operation
//! here with the op's tag salt set.

use super::GlooTcp;
use crate::backends::gloo::memory::{copy, Scratch};
use crate::error::Result;
use crate::kernels::reduce::host_premul_factor;
use crate::kernels::reduce::{self, Scale};
use crate::op::{
    AllToAll, AllToAllKind, Gather, GatherKind, Ptr, Reduction, ReductionKind, Scatter, ScatterKind,
};
use crate::types::RedKind;
use crate::util::Deadline;

impl GlooTcp {
    /// All-reduce, reduce and the reduce-scatters over Gloo (float16/bfloat16
    /// sums accumulated in f32).
    ///
    /// # Safety
    /// As for [`GlooTcp::gloo_reductions`]; the salt of `op` is set.
    pub(super) unsafe fn gloo_reductions(&self, r: &Reduction, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        let (dtype, op) = (r.dtype, &r.op);
        let halves = |count: usize| self.size > 1 && op.kind.sums_halves(dtype) && count >= n;
        match &r.kind {
            ReductionKind::AllReduce { buf, count } if halves(*count) => {
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
                    dtype,
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
            ReductionKind::AllReduce { buf, count } => {
                let f = reduce::kernel(dtype, op.kind)?;
                if op.kind == RedKind::PremulSum {
                    let k = host_premul_factor(op, dtype)?;
                    reduce::scale(dtype, buf.as_u8(), buf.as_u8(), *count, Scale::Mul(k))?;
                }
                self.g_allreduce(buf.as_u8(), *count, dtype, f, d)?;
                if op.kind == RedKind::Avg {
                    reduce::scale(
                        dtype,
                        buf.as_u8(),
                        buf.as_u8(),
                        *count,
                        Scale::Div(n as u64),
                    )?;
                }
                Ok(())
            }
            ReductionKind::Reduce { buf, count, root } if halves(*count) => {
                self.reduce_halves(buf.as_u8(), *count, dtype, *root, op, d)
            }
            ReductionKind::Reduce { buf, count, root } => {
                self.reduce(buf.as_u8(), *count, dtype, *root, op, d)
            }
            // The reduce-scatters: one all-to-all and a local reduction.
            ReductionKind::ReduceScatter {
                output,
                inputs,
                count,
            } => {
                let bytes = count * dtype.size();
                let mut tmp = Scratch::packed(inputs, bytes)?;
                self.reduce_scatter_blocks(
                    tmp.ptr(),
                    output.as_u8(),
                    &vec![*count; n],
                    dtype,
                    op,
                    d,
                )
            }
            ReductionKind::ReduceScatterSingle {
                output,
                input,
                count,
            } => self.reduce_scatter_blocks(
                input.as_u8(),
                output.as_u8(),
                &vec![*count; n],
                dtype,
                op,
                d,
            ),
            ReductionKind::ReduceScatterV {
                output,
                input,
                counts,
            } => {
                self.agree_counts("reduce_scatter_v", counts, d)?;
                self.reduce_scatter_blocks(input.as_u8(), output.as_u8(), counts, dtype, op, d)
            }
        }
    }

    /// The all-gathers (list, single-buffer and per-rank counts) and the
    /// gathers over Gloo.
    ///
    /// # Safety
    /// As for [`GlooTcp::gloo_reductions`].
    pub(super) unsafe fn gloo_gathers(&self, g: &Gather, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        let me = self.rank as usize;
        let (dtype, input) = (g.dtype, g.input);
        match &g.kind {
            GatherKind::AllGather { outputs, count } => {
                let bytes = count * dtype.size();
                let mut tmp = Scratch::new(bytes * n)?;
                self.all_gather_into(input.as_u8(), tmp.ptr(), bytes, d)?;
                for (r, out) in outputs.iter().enumerate() {
                    copy(out.as_u8(), tmp.ptr().add(r * bytes), bytes);
                }
                Ok(())
            }
            GatherKind::AllGatherSingle { output, count } => {
                let bytes = count * dtype.size();
                let out = output.as_u8();
                let layout = g.layout(self.rank, self.size);
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
            GatherKind::AllGatherV { output, counts } => {
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
            GatherKind::Gather {
                outputs,
                count,
                root,
            } => self.gloo_gather_list(outputs, input, count * dtype.size(), *root, d),
            GatherKind::GatherSingle {
                output,
                count,
                root,
            } => {
                // Gloo reads the root's input while it writes the output.
                let clash = g.layout(self.rank, self.size).inputs_overlap_outputs();
                let at = (*output, count * dtype.size(), *root);
                self.gloo_gather_single(at, input, clash, d)
            }
        }
    }

    /// Broadcast and scatter over Gloo (the root holds the data).
    ///
    /// # Safety
    /// As for [`GlooTcp::gloo_reductions`].
    pub(super) unsafe fn gloo_scatters(&self, s: &Scatter, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        let (bytes, root) = (s.count * s.dtype.size(), s.root);
        match &s.kind {
            ScatterKind::Broadcast { buf } => {
                if n == 1 || bytes == 0 {
                    return Ok(());
                }
                let tag = self.next_tag();
                self.ctx()
                    .broadcast(buf.as_u8(), bytes, root, tag, d.left()?)
                    .map_err(|e| self.fail("broadcast", e))
            }
            ScatterKind::Scatter { output, inputs } => {
                // The root's own block overlapping its output: read from a
                // copy.
                let own_clash = s
                    .layout()
                    .own_and_block(self.rank as usize)
                    .is_some_and(|(own, block)| own.overlaps(&block));
                self.gloo_scatter((*output, bytes, root), inputs, own_clash, d)
            }
        }
    }

    /// The all-to-alls over Gloo: list, single-buffer and per-rank counts.
    ///
    /// # Safety
    /// As for [`GlooTcp::gloo_reductions`].
    pub(super) unsafe fn gloo_all_to_alls(&self, a: &AllToAll, d: &Deadline) -> Result<()> {
        let n = self.size as usize;
        let dtype = a.dtype;
        match &a.kind {
            AllToAllKind::Lists {
                outputs,
                inputs,
                count,
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
            AllToAllKind::Single {
                output,
                input,
                count,
            } => {
                let bytes = count * dtype.size();
                if a.layout(self.rank, self.size).inputs_overlap_outputs() {
                    let mut tin = Scratch::new(bytes * n)?;
                    copy(tin.ptr(), input.as_u8(), bytes * n);
                    self.all_to_all(tin.ptr(), output.as_u8(), bytes, d)
                } else {
                    self.all_to_all(input.as_u8(), output.as_u8(), bytes, d)
                }
            }
            AllToAllKind::VSingle {
                output,
                output_counts,
                input,
                input_counts,
            } => self.all_to_all_v(
                (output.as_u8(), output_counts),
                (input.as_u8(), input_counts),
                dtype,
                a.layout(self.rank, self.size).inputs_overlap_outputs(),
                d,
            ),
        }
    }

    /// The barrier over Gloo.
    pub(super) fn gloo_barrier(&self, d: &Deadline) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let tag = self.next_tag();
        self.ctx()
            .barrier(tag, d.left()?)
            .map_err(|e| self.fail("barrier", e))
    }

    /// The scatter of `bytes` per rank from `root`'s `inputs` into `output`
    /// (`to`: output, bytes, root); `own_clash`: the root's own input
    /// overlaps its output, and is read from a copy.
    ///
    /// # Safety
    /// As for [`GlooTcp::gloo_reductions`].
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
    /// As for [`GlooTcp::gloo_reductions`].
    unsafe fn gloo_gather_list(
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
    /// As for [`GlooTcp::gloo_reductions`].
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
