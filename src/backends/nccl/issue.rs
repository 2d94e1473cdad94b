//! Issuing one operation on a CUDA stream: NCCL's data types and reduction
//! ops for an operation, and the dispatch from an [`Op`] to NCCL calls
//! (native calls, or grouped broadcasts/reduces/sends/receives for the list
//! forms, v-variants, scatter/gather and all-to-all).

use super::loader::*;
use super::NcclBackend;
use crate::cuda;
use crate::error::{Error, Result};
use crate::op::{Op, Ptr};
use crate::types::{DType, PremulFactor, RedKind, ReduceOp};
use std::ffi::{c_int, c_void};
/// A reduction op for one call; a PreMulSum op is destroyed on drop (the
/// enqueue that created it still holds its use of the comm).
pub(super) struct RedOp<'a> {
    op: NcclRedOp,
    owned: Option<&'a NcclBackend>,
}

impl Drop for RedOp<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.owned {
            if let Some(destroy) = b.lib.red_op_destroy {
                // SAFETY: created on this comm by ncclRedOpCreatePreMulSum;
                // NCCL allows destroying it once the calls using it returned.
                // An aborted comm took its ops with it.
                let _ = b.call("ncclRedOpDestroy", |c| unsafe { destroy(self.op, c) });
            }
        }
    }
}

impl NcclBackend {
    pub(super) fn dtype(&self, d: DType) -> Result<NcclDataType> {
        Ok(match d {
            DType::F32 => NCCL_FLOAT32,
            DType::F64 => NCCL_FLOAT64,
            DType::F16 => NCCL_FLOAT16,
            DType::BF16 => NCCL_BFLOAT16,
            DType::I8 => NCCL_INT8,
            DType::U8 | DType::Bool => NCCL_UINT8,
            DType::I32 => NCCL_INT32,
            DType::I64 => NCCL_INT64,
            DType::U32 => NCCL_UINT32,
            DType::U64 => NCCL_UINT64,
            DType::F8E4M3 | DType::F8E5M2 if !self.lib.has_fp8() => {
                return Err(Error::unsupported(format!(
                    "dtype {} needs NCCL 2.24 or newer; the loaded NCCL is {}",
                    d.name(),
                    self.lib.version_string()
                )))
            }
            DType::F8E4M3 => NCCL_FLOAT8_E4M3,
            DType::F8E5M2 => NCCL_FLOAT8_E5M2,
        })
    }

    /// The built-in NCCL op for `op` on `dtype`, or None for PREMUL_SUM;
    /// errors for what NCCL cannot do.
    pub(super) fn builtin_op(&self, op: &ReduceOp, dtype: DType) -> Result<Option<NcclRedOp>> {
        let unsupported = |why: &str| {
            Err(Error::unsupported(format!(
                "reduce op {} on {}: {why}",
                op.kind.name(),
                dtype.name()
            )))
        };
        Ok(Some(match (op.kind, dtype) {
            (RedKind::BAnd | RedKind::BOr | RedKind::BXor, _) => {
                return unsupported("NCCL has no bitwise reductions")
            }
            (RedKind::Sum | RedKind::Max, DType::Bool) => NCCL_MAX,
            (RedKind::Product | RedKind::Min, DType::Bool) => NCCL_MIN,
            (RedKind::Avg | RedKind::PremulSum, DType::Bool) => {
                return unsupported("not defined on bool")
            }
            (RedKind::Sum, _) => NCCL_SUM,
            (RedKind::Product, _) => NCCL_PROD,
            (RedKind::Min, _) => NCCL_MIN,
            (RedKind::Max, _) => NCCL_MAX,
            (RedKind::Avg, _) => NCCL_AVG,
            (RedKind::PremulSum, DType::F16 | DType::BF16 | DType::F32 | DType::F64) => {
                if self.lib.red_op_create_pre_mul_sum.is_none() {
                    return unsupported("the loaded NCCL lacks ncclRedOpCreatePreMulSum");
                }
                return Ok(None);
            }
            (RedKind::PremulSum, _) => {
                return unsupported(
                    "NCCL pre-multiplies float16, bfloat16, float32 and float64 only",
                )
            }
        }))
    }

    /// The op for one call (creating a PreMulSum op when needed).
    pub(super) fn red_op(&self, op: &ReduceOp, dtype: DType) -> Result<RedOp<'_>> {
        if let Some(b) = self.builtin_op(op, dtype)? {
            return Ok(RedOp { op: b, owned: None });
        }
        let create = self
            .lib
            .red_op_create_pre_mul_sum
            .ok_or_else(|| Error::unsupported("ncclRedOpCreatePreMulSum missing"))?;
        let dt = self.dtype(dtype)?;
        let mut host = [0u8; 8];
        let host_value = |f: f64, host: &mut [u8; 8]| match dtype {
            DType::F64 => host.copy_from_slice(&f.to_ne_bytes()),
            DType::F32 => host[..4].copy_from_slice(&(f as f32).to_ne_bytes()),
            DType::F16 => {
                host[..2].copy_from_slice(&crate::half::f32_to_f16(f as f32).to_ne_bytes())
            }
            _ => host[..2].copy_from_slice(&crate::half::f32_to_bf16(f as f32).to_ne_bytes()),
        };
        let (scalar, residence) = match op.factor {
            PremulFactor::Host(f) => {
                host_value(f, &mut host);
                (host.as_mut_ptr() as *mut c_void, NCCL_SCALAR_HOST_IMMEDIATE)
            }
            PremulFactor::Pointer(p) => match cuda::memory_type(p)? {
                cuda::MemoryType::Host => {
                    // SAFETY: the caller passes one element of `dtype` at `p`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            p as *const u8,
                            host.as_mut_ptr(),
                            dtype.size(),
                        )
                    };
                    (host.as_mut_ptr() as *mut c_void, NCCL_SCALAR_HOST_IMMEDIATE)
                }
                _ => (p as *mut c_void, NCCL_SCALAR_DEVICE),
            },
        };
        let mut handle: NcclRedOp = 0;
        // SAFETY: `scalar` is read now (host) or by the kernel (device, the
        // caller keeps it alive); valid out-pointer.
        self.call("ncclRedOpCreatePreMulSum", |c| unsafe {
            create(&mut handle, scalar, dt, residence, c)
        })?;
        Ok(RedOp {
            op: handle,
            owned: Some(self),
        })
    }

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
