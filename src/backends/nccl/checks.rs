//! Checks and diagnosis before an operation reaches NCCL: buffers NCCL
//! cannot use (plain host memory) are refused, and inputs that overlap
//! their outputs outside NCCL's in-place layouts are staged into a copy.

use super::NcclBackend;
use crate::cuda::{self, DeviceBuffer};
use crate::error::{Error, Result};
use crate::op::{Op, P2p, Ptr};
use crate::util::{self, lock};
use std::ffi::c_void;

/// Device memory for staged inputs, reused by launched operations in order:
/// `done` is recorded after the last operation that read `buf`, and the next
/// copy into `buf` waits for it on its stream.
#[derive(Default)]
pub(super) struct Staging {
    pub(super) buf: Option<DeviceBuffer>,
    pub(super) done: Option<cuda::Event>,
}

/// Whether [a, a + alen) and [b, b + blen) share a byte ([`util::overlaps`]
/// on the op's pointers).
pub(super) fn overlaps(a: Ptr, alen: usize, b: Ptr, blen: usize) -> bool {
    util::overlaps(a.as_u8(), alen, b.as_u8(), blen)
}

/// `p` advanced by `bytes`.
pub(super) fn offset(p: Ptr, bytes: usize) -> Ptr {
    Ptr(p.as_u8().wrapping_add(bytes) as *mut c_void)
}

/// The input blocks of `op` that NCCL would read while the same call (or
/// another call of its group) writes an overlapping output: NCCL defines
/// overlap only for its in-place layouts (the same pointer for all-reduce,
/// reduce and broadcast; for all-gather the input at this rank's block of
/// the output, for reduce-scatter the output at this rank's block of the
/// input). All-to-alls run their sends and receives concurrently, and a
/// group's operations run concurrently, so any other overlap is a race on a
/// GPU. Empty when nothing needs a copy. `n`, `me`: size and rank.
pub(super) fn hazardous_inputs(op: &Op, n: usize, me: usize) -> Vec<(Ptr, usize)> {
    match op {
        Op::AllGatherSingle { .. }
        | Op::AllGather { .. }
        | Op::AllGatherV { .. }
        | Op::Gather { .. } => gather_hazards(op, n, me),
        Op::ReduceScatterSingle { .. }
        | Op::ReduceScatter { .. }
        | Op::ReduceScatterV { .. }
        | Op::Scatter { .. } => reduce_scatter_hazards(op, n, me),
        Op::AllToAll { .. }
        | Op::AllToAllSingle { .. }
        | Op::AllToAllVSingle { .. }
        | Op::Batch { .. } => all_to_all_hazards(op, n),
        _ => Vec::new(),
    }
}

/// [`hazardous_inputs`] of the all-gathers and gather: the input may sit
/// only at this rank's block of the output.
fn gather_hazards(op: &Op, n: usize, me: usize) -> Vec<(Ptr, usize)> {
    let sum = |c: &[usize]| c.iter().sum::<usize>();
    let before = |c: &[usize]| c[..me].iter().sum::<usize>();
    match op {
        Op::AllGatherSingle {
            output,
            input,
            count,
            dtype,
        } => {
            let b = count * dtype.size();
            if overlaps(*input, b, *output, b * n) && input.0 != offset(*output, b * me).0 {
                return vec![(*input, b)];
            }
        }
        Op::AllGather {
            outputs,
            input,
            count,
            dtype,
        } => {
            let b = count * dtype.size();
            if outputs
                .iter()
                .enumerate()
                .any(|(q, o)| overlaps(*input, b, *o, b) && !(q == me && o.0 == input.0))
            {
                return vec![(*input, b)];
            }
        }
        Op::AllGatherV {
            output,
            input,
            counts,
            dtype,
        } => {
            let es = dtype.size();
            let b = counts[me] * es;
            if overlaps(*input, b, *output, sum(counts) * es)
                && input.0 != offset(*output, before(counts) * es).0
            {
                return vec![(*input, b)];
            }
        }
        // The root receives into its outputs while the group runs, and
        // copies its own input after it.
        Op::Gather {
            outputs,
            input,
            count,
            dtype,
            ..
        } if !outputs.is_empty() => {
            let b = count * dtype.size();
            if outputs
                .iter()
                .enumerate()
                .any(|(q, o)| overlaps(*input, b, *o, b) && !(q == me && o.0 == input.0))
            {
                return vec![(*input, b)];
            }
        }
        _ => {}
    }
    Vec::new()
}

/// [`hazardous_inputs`] of the reduce-scatters and scatter: the output may
/// sit only at this rank's block of the input.
fn reduce_scatter_hazards(op: &Op, n: usize, me: usize) -> Vec<(Ptr, usize)> {
    let sum = |c: &[usize]| c.iter().sum::<usize>();
    let before = |c: &[usize]| c[..me].iter().sum::<usize>();
    match op {
        Op::ReduceScatterSingle {
            output,
            input,
            count,
            dtype,
            ..
        } => {
            let b = count * dtype.size();
            if overlaps(*input, b * n, *output, b) && output.0 != offset(*input, b * me).0 {
                return vec![(*input, b * n)];
            }
        }
        Op::ReduceScatter {
            output,
            inputs,
            count,
            dtype,
            ..
        } => {
            let b = count * dtype.size();
            if inputs
                .iter()
                .enumerate()
                .any(|(q, i)| overlaps(*i, b, *output, b) && !(q == me && i.0 == output.0))
            {
                return inputs.iter().map(|i| (*i, b)).collect();
            }
        }
        Op::ReduceScatterV {
            output,
            input,
            counts,
            dtype,
            ..
        } => {
            let es = dtype.size();
            if overlaps(*input, sum(counts) * es, *output, counts[me] * es)
                && output.0 != offset(*input, before(counts) * es).0
            {
                return vec![(*input, sum(counts) * es)];
            }
        }
        // The root copies its own block after the group; a copy between
        // partly overlapping buffers is undefined.
        Op::Scatter {
            output,
            inputs,
            count,
            dtype,
            ..
        } if !inputs.is_empty() => {
            let b = count * dtype.size();
            if overlaps(inputs[me], b, *output, b) && inputs[me].0 != output.0 {
                return inputs.iter().map(|i| (*i, b)).collect();
            }
        }
        _ => {}
    }
    Vec::new()
}

/// [`hazardous_inputs`] of the all-to-alls and batches, whose sends and
/// receives run concurrently: no input may overlap an output.
fn all_to_all_hazards(op: &Op, n: usize) -> Vec<(Ptr, usize)> {
    let sum = |c: &[usize]| c.iter().sum::<usize>();
    match op {
        Op::AllToAll {
            outputs,
            inputs,
            count,
            dtype,
        } => {
            let b = count * dtype.size();
            if inputs
                .iter()
                .any(|i| outputs.iter().any(|o| overlaps(*i, b, *o, b)))
            {
                return inputs.iter().map(|i| (*i, b)).collect();
            }
        }
        Op::AllToAllSingle {
            output,
            input,
            count,
            dtype,
        } => {
            let b = count * dtype.size() * n;
            if overlaps(*input, b, *output, b) {
                return vec![(*input, b)];
            }
        }
        Op::AllToAllVSingle {
            output,
            output_counts,
            input,
            input_counts,
            dtype,
        } => {
            let es = dtype.size();
            if overlaps(
                *input,
                sum(input_counts) * es,
                *output,
                sum(output_counts) * es,
            ) {
                return vec![(*input, sum(input_counts) * es)];
            }
        }
        // Sends and receives of a batch run concurrently.
        Op::Batch { ops } => {
            return ops
                .iter()
                .filter(|s| send_overlaps_a_recv(s, ops))
                .map(|s| (s.buf, s.count * s.dtype.size()))
                .collect();
        }
        _ => {}
    }
    Vec::new()
}

/// Whether `p` is a send whose buffer overlaps a receive buffer of `batch`.
pub(super) fn send_overlaps_a_recv(p: &P2p, batch: &[P2p]) -> bool {
    let bytes = |q: &P2p| q.count * q.dtype.size();
    p.is_send
        && batch
            .iter()
            .any(|r| !r.is_send && overlaps(p.buf, bytes(p), r.buf, bytes(r)))
}

/// `op` with its input blocks (in the order [`hazardous_inputs`] lists
/// them) replaced by `staged`.
pub(super) fn with_inputs(op: &Op, staged: &[Ptr]) -> Op {
    let mut op = op.clone();
    match &mut op {
        Op::AllGatherSingle { input, .. }
        | Op::AllGather { input, .. }
        | Op::AllGatherV { input, .. }
        | Op::ReduceScatterSingle { input, .. }
        | Op::ReduceScatterV { input, .. }
        | Op::AllToAllSingle { input, .. }
        | Op::AllToAllVSingle { input, .. }
        | Op::Gather { input, .. } => *input = staged[0],
        Op::ReduceScatter { inputs, .. }
        | Op::AllToAll { inputs, .. }
        | Op::Scatter { inputs, .. } => inputs.copy_from_slice(staged),
        Op::Batch { ops } => {
            let hazardous: Vec<bool> = ops.iter().map(|p| send_overlaps_a_recv(p, ops)).collect();
            let mut copies = staged.iter();
            for (p, _) in ops.iter_mut().zip(hazardous).filter(|(_, h)| *h) {
                if let Some(copy) = copies.next() {
                    p.buf = *copy;
                }
            }
        }
        _ => {}
    }
    op
}

impl NcclBackend {
    /// When `op` reads an input that overlaps an output outside NCCL's
    /// in-place layouts (see [`hazardous_inputs`]), copies those inputs on
    /// `stream` into the staging buffer and returns the operation reading
    /// the copy; the caller records `staging.done` after issuing it. Under
    /// graph capture there is no buffer whose lifetime matches the graph's,
    /// so such an operation is refused there.
    pub(super) fn stage_overlapping(
        &self,
        op: &Op,
        stream: cuda::RawStream,
        captured: bool,
    ) -> Result<Option<Op>> {
        let blocks = hazardous_inputs(op, self.size as usize, self.rank as usize);
        if blocks.is_empty() {
            return Ok(None);
        }
        if captured {
            return Err(Error::unsupported(format!(
                "{} with input and output buffers that overlap outside NCCL's in-place layout cannot be captured into a CUDA \
                 graph on the nccl backend (the input would need a copy that outlives the graph); pass separate buffers",
                op.name()
            )));
        }
        let total: usize = blocks.iter().map(|b| b.1).sum();
        let mut st = lock(&self.staging);
        if st.buf.as_ref().map_or(true, |b| b.bytes < total) {
            // The old buffer may still be read by a launched operation.
            if let Some(done) = &st.done {
                done.synchronize()?;
            }
            st.buf = None;
            st.buf = Some(DeviceBuffer::uninit(
                &self.device,
                total.next_power_of_two(),
            )?);
        }
        if let Some(done) = &st.done {
            cuda::stream_wait_event(stream, done)?;
        }
        let base = Ptr(st
            .buf
            .as_ref()
            .map(|b| b.ptr())
            .unwrap_or(std::ptr::null_mut()));
        let mut staged = Vec::with_capacity(blocks.len());
        let mut at = 0;
        for (p, bytes) in &blocks {
            let dst = offset(base, at);
            cuda::memcpy_async(dst.0, p.0, *bytes, stream)?;
            staged.push(dst);
            at += bytes;
        }
        Ok(Some(with_inputs(op, &staged)))
    }

    /// Refuses buffers in plain host memory: NCCL (which checks pointers
    /// only with NCCL_CHECK_POINTERS=1) would hand them to a kernel, whose
    /// illegal-address fault poisons the process's CUDA context for good.
    pub(super) fn check_buffers(&self, op: &Op) -> Result<()> {
        let mut op = op.clone();
        crate::op::for_each_buffer(&mut op, self.rank, self.size, &mut |p, bytes, _| {
            if bytes > 0 && !cuda::device_accessible(p.0)? {
                return Err(Error::invalid_argument(format!(
                    "buffer {:p} is host memory unknown to CUDA: the nccl backend needs device memory (or pinned or \
                     registered host memory); use the gloo backend for host buffers",
                    p.0
                )));
            }
            Ok(())
        })
    }
}
