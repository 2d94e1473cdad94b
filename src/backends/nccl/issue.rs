//! Issuing one operation on a CUDA stream: the dispatch from an [`Op`] to
//! NCCL calls (native calls, or grouped broadcasts/reduces/sends/receives
//! for the list forms, v-variants, scatter/gather and all-to-all). NCCL's
//! data types and reduction ops are in `red_op.rs`.

use super::loader::*;
use super::NcclBackend;
use crate::cuda;
use crate::error::{Error, Result};
use crate::op::{Op, Ptr};
use crate::types::{DType, ReduceOp};
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
            Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. } => {
                self.issue_point_to_point(op, s)
            }
            Op::Broadcast { .. } | Op::Reduce { .. } | Op::AllReduce { .. } | Op::Barrier => {
                self.issue_reduction(op, s)
            }
            Op::AllGather { .. } | Op::AllGatherSingle { .. } | Op::AllGatherV { .. } => {
                self.issue_all_gather(op, s)
            }
            Op::ReduceScatter { .. }
            | Op::ReduceScatterSingle { .. }
            | Op::ReduceScatterV { .. } => self.issue_reduce_scatter(op, s),
            Op::AllToAll { .. } | Op::AllToAllSingle { .. } => self.issue_all_to_all(op, s),
            Op::AllToAllVSingle { .. } => self.issue_all_to_all_v(op, s),
            Op::Scatter { .. } | Op::Gather { .. } | Op::GatherSingle { .. } => {
                self.issue_scatter_gather(op, s)
            }
            // Never enqueued (see `NcclBackend::submit`).
            Op::Refused(refusal) => Err(refusal.error.clone()),
        }
    }

    /// Issues sends, receives and batches of them (see [`Self::issue`]).
    fn issue_point_to_point(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let l = self.lib;
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        unsafe {
            match op {
                Op::Send {
                    buf,
                    count,
                    dtype,
                    peer,
                    ..
                } => {
                    let dt = self.dtype(*dtype)?;
                    self.call("ncclSend", |c| (l.send)(buf.0, *count, dt, *peer, c, s))
                }
                Op::Recv {
                    buf,
                    count,
                    dtype,
                    peer,
                    ..
                } => {
                    let dt = self.dtype(*dtype)?;
                    self.call("ncclRecv", |c| (l.recv)(buf.0, *count, dt, *peer, c, s))
                }
                Op::Batch { ops } => self.group(|| {
                    for p in ops {
                        let dt = self.dtype(p.dtype)?;
                        if p.is_send {
                            self.call("ncclSend", |c| {
                                (l.send)(p.buf.0, p.count, dt, p.peer, c, s)
                            })?;
                        } else {
                            self.call("ncclRecv", |c| {
                                (l.recv)(p.buf.0, p.count, dt, p.peer, c, s)
                            })?;
                        }
                    }
                    Ok(())
                }),
                _ => Err(Error::internal(format!(
                    "{} reached {} (issue dispatches by family)",
                    op.name(),
                    "issue_point_to_point"
                ))),
            }
        }
    }

    /// Issues broadcast, reduce, all-reduce and barrier (see [`Self::issue`]).
    fn issue_reduction(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let l = self.lib;
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        unsafe {
            match op {
                Op::Broadcast {
                    buf,
                    count,
                    dtype,
                    root,
                } => {
                    let dt = self.dtype(*dtype)?;
                    self.call("ncclBroadcast", |c| {
                        (l.broadcast)(buf.0, buf.0, *count, dt, *root, c, s)
                    })
                }
                Op::Reduce {
                    buf,
                    count,
                    dtype,
                    root,
                    op,
                } => {
                    let rop = self.red_op(op, *dtype)?;
                    let dt = self.dtype(*dtype)?;
                    self.call("ncclReduce", |c| {
                        (l.reduce)(buf.0, buf.0, *count, dt, rop.op, *root, c, s)
                    })
                }
                Op::AllReduce {
                    buf,
                    count,
                    dtype,
                    op,
                } => {
                    let rop = self.red_op(op, *dtype)?;
                    let dt = self.dtype(*dtype)?;
                    self.call("ncclAllReduce", |c| {
                        (l.all_reduce)(buf.0, buf.0, *count, dt, rop.op, c, s)
                    })
                }
                Op::Barrier => {
                    let p = self.scratch.ptr();
                    self.call("ncclAllReduce (barrier)", |c| {
                        (l.all_reduce)(p, p, 1, NCCL_FLOAT32, NCCL_SUM, c, s)
                    })
                }
                _ => Err(Error::internal(format!(
                    "{} reached {} (issue dispatches by family)",
                    op.name(),
                    "issue_reduction"
                ))),
            }
        }
    }

    /// Issues the all-gathers (see [`Self::issue`]).
    fn issue_all_gather(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let (l, n, me) = (self.lib, self.size as usize, self.rank);
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        unsafe {
            match op {
                Op::AllGather {
                    outputs,
                    input,
                    count,
                    dtype,
                } => {
                    let dt = self.dtype(*dtype)?;
                    self.group(|| {
                        for (q, out) in outputs.iter().enumerate() {
                            let src = if q as i32 == me { input.0 } else { out.0 };
                            self.call("ncclBroadcast", |c| {
                                (l.broadcast)(src, out.0, *count, dt, q as c_int, c, s)
                            })?;
                        }
                        Ok(())
                    })
                }
                Op::AllGatherSingle {
                    output,
                    input,
                    count,
                    dtype,
                } => {
                    let dt = self.dtype(*dtype)?;
                    self.call("ncclAllGather", |c| {
                        (l.all_gather)(input.0, output.0, *count, dt, c, s)
                    })
                }
                Op::AllGatherV {
                    output,
                    input,
                    counts,
                    dtype,
                } => {
                    let dt = self.dtype(*dtype)?;
                    let offs = offsets(counts);
                    self.group(|| {
                        for q in 0..n {
                            if counts[q] == 0 {
                                continue;
                            }
                            let dst = at(*output, offs[q], *dtype);
                            let src = if q as i32 == me { input.0 } else { dst };
                            self.call("ncclBroadcast", |c| {
                                (l.broadcast)(src, dst, counts[q], dt, q as c_int, c, s)
                            })?;
                        }
                        Ok(())
                    })
                }
                _ => Err(Error::internal(format!(
                    "{} reached {} (issue dispatches by family)",
                    op.name(),
                    "issue_all_gather"
                ))),
            }
        }
    }

    /// Issues the reduce-scatters (see [`Self::issue`]).
    fn issue_reduce_scatter(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let (l, me) = (self.lib, self.rank);
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        unsafe {
            match op {
                Op::ReduceScatter {
                    output,
                    inputs,
                    count,
                    dtype,
                    op,
                } => {
                    let dt = self.dtype(*dtype)?;
                    let rop = self.red_op(op, *dtype)?;
                    self.group(|| {
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
                    })
                }
                Op::ReduceScatterSingle {
                    output,
                    input,
                    count,
                    dtype,
                    op,
                } => {
                    let rop = self.red_op(op, *dtype)?;
                    let dt = self.dtype(*dtype)?;
                    self.call("ncclReduceScatter", |c| {
                        (l.reduce_scatter)(input.0, output.0, *count, dt, rop.op, c, s)
                    })
                }
                Op::ReduceScatterV {
                    output,
                    input,
                    counts,
                    dtype,
                    op,
                } => self.issue_reduce_scatter_v(*output, *input, counts, *dtype, op, s),
                _ => Err(Error::internal(format!(
                    "{} reached {} (issue dispatches by family)",
                    op.name(),
                    "issue_reduce_scatter"
                ))),
            }
        }
    }

    /// Issues reduce_scatter_v as one grouped reduce per rank's block.
    fn issue_reduce_scatter_v(
        &self,
        output: Ptr,
        input: Ptr,
        counts: &[usize],
        dtype: DType,
        op: &ReduceOp,
        s: *mut c_void,
    ) -> Result<()> {
        let (l, n, me) = (self.lib, self.size as usize, self.rank);
        let dt = self.dtype(dtype)?;
        let rop = self.red_op(op, dtype)?;
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
                // SAFETY: as in `issue_reduce_scatter`.
                self.call("ncclReduce", |c| unsafe {
                    (l.reduce)(
                        at(input, offs[q], dtype),
                        dst,
                        counts[q],
                        dt,
                        rop.op,
                        q as c_int,
                        c,
                        s,
                    )
                })?;
            }
            Ok(())
        })
    }

    /// Issues all_to_all and all_to_all_single (see [`Self::issue`]).
    fn issue_all_to_all(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let (l, n) = (self.lib, self.size as usize);
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        unsafe {
            match op {
                Op::AllToAll {
                    outputs,
                    inputs,
                    count,
                    dtype,
                } => {
                    let dt = self.dtype(*dtype)?;
                    self.group(|| {
                        for q in 0..n {
                            self.call("ncclSend", |c| {
                                (l.send)(inputs[q].0, *count, dt, q as c_int, c, s)
                            })?;
                            self.call("ncclRecv", |c| {
                                (l.recv)(outputs[q].0, *count, dt, q as c_int, c, s)
                            })?;
                        }
                        Ok(())
                    })
                }
                Op::AllToAllSingle {
                    output,
                    input,
                    count,
                    dtype,
                } => {
                    let dt = self.dtype(*dtype)?;
                    if let Some(a2a) = l.all_to_all {
                        return self
                            .call("ncclAlltoAll", |c| a2a(input.0, output.0, *count, dt, c, s));
                    }
                    self.group(|| {
                        for q in 0..n {
                            self.call("ncclSend", |c| {
                                (l.send)(
                                    at(*input, q * count, *dtype),
                                    *count,
                                    dt,
                                    q as c_int,
                                    c,
                                    s,
                                )
                            })?;
                            self.call("ncclRecv", |c| {
                                (l.recv)(
                                    at(*output, q * count, *dtype),
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
                _ => Err(Error::internal(format!(
                    "{} reached {} (issue dispatches by family)",
                    op.name(),
                    "issue_all_to_all"
                ))),
            }
        }
    }

    /// Issues all_to_all_v_single (see [`Self::issue`]).
    fn issue_all_to_all_v(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let (l, n) = (self.lib, self.size as usize);
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        unsafe {
            match op {
                Op::AllToAllVSingle {
                    output,
                    output_counts,
                    input,
                    input_counts,
                    dtype,
                } => {
                    let dt = self.dtype(*dtype)?;
                    let (oo, io) = (offsets(output_counts), offsets(input_counts));
                    self.group(|| {
                        for q in 0..n {
                            if input_counts[q] > 0 {
                                self.call("ncclSend", |c| {
                                    (l.send)(
                                        at(*input, io[q], *dtype),
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
                                        at(*output, oo[q], *dtype),
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
                _ => Err(Error::internal(format!(
                    "{} reached {} (issue dispatches by family)",
                    op.name(),
                    "issue_all_to_all_v"
                ))),
            }
        }
    }

    /// Issues scatter and gather (see [`Self::issue`]).
    fn issue_scatter_gather(&self, op: &Op, s: *mut c_void) -> Result<()> {
        let (l, me) = (self.lib, self.rank);
        // SAFETY (every NCCL call below): buffers were validated by the comm
        // (non-NULL where needed, sizes not overflowing) and the caller keeps
        // them alive until the work completes; `c` is the comm, checked live
        // by `call` just before each call.
        unsafe {
            match op {
                Op::Scatter {
                    output,
                    inputs,
                    count,
                    dtype,
                    root,
                } => self.issue_scatter(*output, inputs, *count, *dtype, *root, s),
                Op::Gather {
                    outputs,
                    input,
                    count,
                    dtype,
                    root,
                } => {
                    let dt = self.dtype(*dtype)?;
                    self.group(|| {
                        if me == *root {
                            for (q, out) in outputs.iter().enumerate() {
                                if q as i32 != me {
                                    self.call("ncclRecv", |c| {
                                        (l.recv)(out.0, *count, dt, q as c_int, c, s)
                                    })?;
                                }
                            }
                        } else {
                            self.call("ncclSend", |c| (l.send)(input.0, *count, dt, *root, c, s))?;
                        }
                        Ok(())
                    })?;
                    if me == *root && outputs[me as usize].0 != input.0 {
                        cuda::memcpy_async(
                            outputs[me as usize].0,
                            input.0,
                            count * dtype.size(),
                            s as cuda::RawStream,
                        )?;
                    }
                    Ok(())
                }
                Op::GatherSingle { .. } => Err(Error::internal(
                    "gather_single reached issue unlowered (enqueue lowers it to gather)",
                )),
                _ => Err(Error::internal(format!(
                    "{} reached {} (issue dispatches by family)",
                    op.name(),
                    "issue_scatter_gather"
                ))),
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
        // SAFETY: as in `issue_scatter_gather`.
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
