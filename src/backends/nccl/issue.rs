//! Issuing one operation on a CUDA stream: the dispatch from an [`Op`] to
//! NCCL calls (native calls, or grouped broadcasts/reduces/sends/receives
//! for the list forms, v-variants, scatter/gather and all-to-all). NCCL's
//! data types and reduction ops are in `red_op.rs`.

use super::loader::*;
use super::NcclBackend;
use crate::cuda;
use crate::error::Result;
use crate::op::{
    gather_single_outputs, AllToAll, AllToAllKind, Gather, GatherKind, Op, P2p, PointToPoint, Ptr,
    Reduction, ReductionKind, Scatter, ScatterKind,
};
use crate::types::DType;
use std::ffi::{c_int, c_void};

impl NcclBackend {
    /// Runs `body` between ncclGroupStart and ncclGroupEnd (always ended).
    pub(super) fn group(&self, body: impl FnOnce() -> Result<()>) -> Result<()> {
        // SAFETY: group calls take no arguments.
        self.lib.check(
            unsafe { (self.lib.group_start)() },
            "ncclGroupStart",
            self.detail_comm(),
        )?;
        let r = body();
        let end = unsafe { (self.lib.group_end)() };
        r?;
        self.settle(end, "ncclGroupEnd")
    }

    /// Issues `op` on stream `s`. The device's context is current. One
    /// function per family of operations below.
    pub(super) fn issue(&self, op: &Op, s: *mut c_void) -> Result<()> {
        match op {
            Op::PointToPoint(p) => self.issue_point_to_point(p, s),
            Op::Reduction(r) => self.issue_reduction(r, s),
            Op::Gather(g) => self.issue_gather(g, s),
            Op::Scatter(sc) => self.issue_scatter_family(sc, s),
            Op::AllToAll(a) => self.issue_all_to_all(a, s),
            Op::Barrier => {
                let (l, p) = (self.lib, self.scratch.ptr());
                // SAFETY: the comm's own scratch element, on its device.
                self.call("ncclAllReduce (barrier)", |c| unsafe {
                    (l.all_reduce)(p, p, 1, NCCL_FLOAT32, NCCL_SUM, c, s)
                })
            }
            // Never enqueued (see `NcclBackend::submit`).
            Op::Refused(refusal) => Err(refusal.error.clone()),
        }
    }

    /// Issues a send, a receive, or a batch of them (see [`Self::issue`]).
    fn issue_point_to_point(&self, p: &PointToPoint, s: *mut c_void) -> Result<()> {
        let l = self.lib;
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        let one = |p: &P2p| unsafe {
            let dt = self.dtype(p.dtype)?;
            if p.is_send {
                self.call("ncclSend", |c| (l.send)(p.buf.0, p.count, dt, p.peer, c, s))
            } else {
                self.call("ncclRecv", |c| (l.recv)(p.buf.0, p.count, dt, p.peer, c, s))
            }
        };
        match p {
            PointToPoint::One(p) => one(p),
            PointToPoint::Batch(ops) => self.group(|| ops.iter().try_for_each(one)),
        }
    }

    /// Issues all-reduce, reduce and the reduce-scatters (see
    /// [`Self::issue`]).
    fn issue_reduction(&self, r: &Reduction, s: *mut c_void) -> Result<()> {
        let (l, me, dtype) = (self.lib, self.rank, r.dtype);
        let rop = self.red_op(&r.op, dtype)?;
        let dt = self.dtype(dtype)?;
        // SAFETY (every NCCL call below): as in `issue_point_to_point`.
        unsafe {
            match &r.kind {
                ReductionKind::AllReduce { buf, count } => self.call("ncclAllReduce", |c| {
                    (l.all_reduce)(buf.0, buf.0, *count, dt, rop.op, c, s)
                }),
                ReductionKind::Reduce { buf, count, root } => self.call("ncclReduce", |c| {
                    (l.reduce)(buf.0, buf.0, *count, dt, rop.op, *root, c, s)
                }),
                ReductionKind::ReduceScatter {
                    output,
                    inputs,
                    count,
                } => self.group(|| {
                    for (q, inp) in inputs.iter().enumerate() {
                        let dst = if q as i32 == me {
                            output.0
                        } else {
                            std::ptr::null_mut()
                        };
                        self.call("ncclReduce", |c| {
                            (l.reduce)(inp.0, dst, *count, dt, rop.op, q as c_int, c, s)
                        })?;
                    }
                    Ok(())
                }),
                ReductionKind::ReduceScatterSingle {
                    output,
                    input,
                    count,
                } => self.call("ncclReduceScatter", |c| {
                    (l.reduce_scatter)(input.0, output.0, *count, dt, rop.op, c, s)
                }),
                ReductionKind::ReduceScatterV {
                    output,
                    input,
                    counts,
                } => self.issue_reduce_scatter_v(*output, *input, counts, (dtype, dt, rop.op), s),
            }
        }
    }

    /// Issues reduce_scatter_v as one grouped reduce per rank's block
    /// (`types`: the dtype, as NCCL's, and NCCL's reduce op).
    fn issue_reduce_scatter_v(
        &self,
        output: Ptr,
        input: Ptr,
        counts: &[usize],
        (dtype, dt, rop): (DType, NcclDataType, NcclRedOp),
        s: *mut c_void,
    ) -> Result<()> {
        let (l, n, me) = (self.lib, self.size as usize, self.rank);
        let offs = offsets(counts);
        self.group(|| {
            for q in 0..n {
                if counts[q] == 0 {
                    continue;
                }
                let dst = if q as i32 == me {
                    output.0
                } else {
                    std::ptr::null_mut()
                };
                // SAFETY: as in `issue_point_to_point`.
                self.call("ncclReduce", |c| unsafe {
                    (l.reduce)(
                        at(input, offs[q], dtype),
                        dst,
                        counts[q],
                        dt,
                        rop,
                        q as c_int,
                        c,
                        s,
                    )
                })?;
            }
            Ok(())
        })
    }

    /// Issues the all-gathers and gathers (see [`Self::issue`]).
    fn issue_gather(&self, g: &Gather, s: *mut c_void) -> Result<()> {
        let (l, n, me) = (self.lib, self.size as usize, self.rank);
        let (dtype, input) = (g.dtype, g.input);
        let dt = self.dtype(dtype)?;
        // SAFETY (every NCCL call below): as in `issue_point_to_point`.
        unsafe {
            match &g.kind {
                GatherKind::AllGather { outputs, count } => self.group(|| {
                    for (q, out) in outputs.iter().enumerate() {
                        let src = if q as i32 == me { input.0 } else { out.0 };
                        self.call("ncclBroadcast", |c| {
                            (l.broadcast)(src, out.0, *count, dt, q as c_int, c, s)
                        })?;
                    }
                    Ok(())
                }),
                GatherKind::AllGatherSingle { output, count } => self.call("ncclAllGather", |c| {
                    (l.all_gather)(input.0, output.0, *count, dt, c, s)
                }),
                GatherKind::AllGatherV { output, counts } => {
                    let offs = offsets(counts);
                    self.group(|| {
                        for q in 0..n {
                            if counts[q] == 0 {
                                continue;
                            }
                            let dst = at(*output, offs[q], dtype);
                            let src = if q as i32 == me { input.0 } else { dst };
                            self.call("ncclBroadcast", |c| {
                                (l.broadcast)(src, dst, counts[q], dt, q as c_int, c, s)
                            })?;
                        }
                        Ok(())
                    })
                }
                GatherKind::Gather {
                    outputs,
                    count,
                    root,
                } => self.issue_gather_list(outputs, input, *count, (dtype, dt), *root, s),
                // The grouped sends and receives of gather, into the root's
                // blocks.
                GatherKind::GatherSingle {
                    output,
                    count,
                    root,
                } => {
                    let outputs =
                        gather_single_outputs(*output, *count, dtype, (me, *root, n as i32));
                    self.issue_gather_list(&outputs, input, *count, (dtype, dt), *root, s)
                }
            }
        }
    }

    /// Issues gather: the root receives each peer's block and copies its
    /// own (`types`: the dtype, and as NCCL's).
    fn issue_gather_list(
        &self,
        outputs: &[Ptr],
        input: Ptr,
        count: usize,
        (dtype, dt): (DType, NcclDataType),
        root: i32,
        s: *mut c_void,
    ) -> Result<()> {
        let (l, me) = (self.lib, self.rank);
        // SAFETY: as in `issue_point_to_point`.
        self.group(|| unsafe {
            if me == root {
                for (q, out) in outputs.iter().enumerate() {
                    if q as i32 != me {
                        self.call("ncclRecv", |c| (l.recv)(out.0, count, dt, q as c_int, c, s))?;
                    }
                }
            } else {
                self.call("ncclSend", |c| (l.send)(input.0, count, dt, root, c, s))?;
            }
            Ok(())
        })?;
        if me == root && outputs[me as usize].0 != input.0 {
            cuda::memcpy_async(
                outputs[me as usize].0,
                input.0,
                count * dtype.size(),
                s as cuda::RawStream,
            )?;
        }
        Ok(())
    }

    /// Issues broadcast and scatter (see [`Self::issue`]).
    fn issue_scatter_family(&self, sc: &Scatter, s: *mut c_void) -> Result<()> {
        let (count, dtype, root) = (sc.count, sc.dtype, sc.root);
        match &sc.kind {
            ScatterKind::Broadcast { buf } => {
                let (l, dt) = (self.lib, self.dtype(dtype)?);
                // SAFETY: as in `issue_point_to_point`.
                self.call("ncclBroadcast", |c| unsafe {
                    (l.broadcast)(buf.0, buf.0, count, dt, root, c, s)
                })
            }
            ScatterKind::Scatter { output, inputs } => {
                self.issue_scatter(*output, inputs, count, dtype, root, s)
            }
        }
    }

    /// Issues the all-to-alls (see [`Self::issue`]).
    fn issue_all_to_all(&self, a: &AllToAll, s: *mut c_void) -> Result<()> {
        let (l, n, dtype) = (self.lib, self.size as usize, a.dtype);
        let dt = self.dtype(dtype)?;
        // SAFETY (every NCCL call below): as in `issue_point_to_point`.
        unsafe {
            match &a.kind {
                AllToAllKind::AllToAll {
                    outputs,
                    inputs,
                    count,
                } => self.group(|| {
                    for q in 0..n {
                        self.call("ncclSend", |c| {
                            (l.send)(inputs[q].0, *count, dt, q as c_int, c, s)
                        })?;
                        self.call("ncclRecv", |c| {
                            (l.recv)(outputs[q].0, *count, dt, q as c_int, c, s)
                        })?;
                    }
                    Ok(())
                }),
                AllToAllKind::AllToAllSingle {
                    output,
                    input,
                    count,
                } => {
                    if let Some(a2a) = l.all_to_all {
                        return self
                            .call("ncclAlltoAll", |c| a2a(input.0, output.0, *count, dt, c, s));
                    }
                    self.group(|| {
                        for q in 0..n {
                            self.call("ncclSend", |c| {
                                (l.send)(at(*input, q * count, dtype), *count, dt, q as c_int, c, s)
                            })?;
                            self.call("ncclRecv", |c| {
                                (l.recv)(
                                    at(*output, q * count, dtype),
                                    *count,
                                    dt,
                                    q as c_int,
                                    c,
                                    s,
                                )
                            })?;
                        }
                        Ok(())
                    })
                }
                AllToAllKind::AllToAllVSingle {
                    output,
                    output_counts,
                    input,
                    input_counts,
                } => {
                    let (oo, io) = (offsets(output_counts), offsets(input_counts));
                    self.group(|| {
                        for q in 0..n {
                            if input_counts[q] > 0 {
                                self.call("ncclSend", |c| {
                                    (l.send)(
                                        at(*input, io[q], dtype),
                                        input_counts[q],
                                        dt,
                                        q as c_int,
                                        c,
                                        s,
                                    )
                                })?;
                            }
                            if output_counts[q] > 0 {
                                self.call("ncclRecv", |c| {
                                    (l.recv)(
                                        at(*output, oo[q], dtype),
                                        output_counts[q],
                                        dt,
                                        q as c_int,
                                        c,
                                        s,
                                    )
                                })?;
                            }
                        }
                        Ok(())
                    })
                }
            }
        }
    }

    /// Issues scatter: the root sends each peer its block and copies its own.
    fn issue_scatter(
        &self,
        output: Ptr,
        inputs: &[Ptr],
        count: usize,
        dtype: DType,
        root: i32,
        s: *mut c_void,
    ) -> Result<()> {
        let (l, me) = (self.lib, self.rank);
        let dt = self.dtype(dtype)?;
        // SAFETY: as in `issue_point_to_point`.
        self.group(|| unsafe {
            if me == root {
                for (q, inp) in inputs.iter().enumerate() {
                    if q as i32 != me {
                        self.call("ncclSend", |c| (l.send)(inp.0, count, dt, q as c_int, c, s))?;
                    }
                }
            } else {
                self.call("ncclRecv", |c| (l.recv)(output.0, count, dt, root, c, s))?;
            }
            Ok(())
        })?;
        if me == root && output.0 != inputs[me as usize].0 {
            cuda::memcpy_async(
                output.0,
                inputs[me as usize].0,
                count * dtype.size(),
                s as cuda::RawStream,
            )?;
        }
        Ok(())
    }
}

/// `p` advanced by `elems` elements of `d`.
fn at(p: Ptr, elems: usize, d: DType) -> *mut c_void {
    // SAFETY: callers pass an offset within the buffer `p` starts.
    unsafe { p.as_u8().add(elems * d.size()) as *mut c_void }
}

/// The start of each block when blocks of `counts` lie back to back.
fn offsets(counts: &[usize]) -> Vec<usize> {
    let mut acc = 0;
    counts
        .iter()
        .map(|c| {
            let o = acc;
            acc += c;
            o
        })
        .collect()
}
