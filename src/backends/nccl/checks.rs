//! Checks and diagnosis before an operation reaches NCCL: buffers NCCL
//! cannot use (plain host memory) are refused, and inputs that overlap
//! their outputs outside NCCL's in-place layouts are staged into a copy.

use super::NcclBackend;
use crate::cuda::{self, DeviceBuffer};
use crate::error::{Error, Result};
use crate::op::{AllToAllKind, Op, P2p, Ptr, Reduction, ReductionKind, Scatter, ScatterKind};
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
/// GPU. Empty when nothing needs a copy, else every input buffer of the
/// operation's [`Layout`](crate::op::Layout) (a batch: the sends that
/// overlap a receive).
/// `n`, `me`: size and rank.
pub(super) fn hazardous_inputs(op: &Op, n: usize, me: usize) -> Vec<(Ptr, usize)> {
    let layout = op.layout(me as i32, n as i32);
    let hazard = match op {
        // NCCL's in-place layouts (the same pointer in and out).
        Op::Reduction(Reduction {
            kind: ReductionKind::AllReduce { .. } | ReductionKind::Reduce { .. },
            ..
        })
        | Op::Scatter(Scatter {
            kind: ScatterKind::Broadcast { .. },
            ..
        }) => false,
        // Only this rank's own block in place (a gather's root receives
        // into its outputs while the group runs and copies its own input
        // after it).
        Op::Reduction(_) | Op::Gather(_) => layout.overlaps_outside_own_block(me),
        // The root copies its own block after the group; a copy between
        // partly overlapping buffers is undefined.
        Op::Scatter(_) => layout
            .own_and_block(me)
            .is_some_and(|(own, block)| own.overlaps(&block) && own.ptr != block.ptr),
        Op::AllToAll(_) => layout.inputs_overlap_outputs(),
        // Sends and receives of a batch run concurrently (a send or a
        // receive alone overlaps nothing).
        Op::PointToPoint(p) => {
            let ops = p.transfers();
            return ops
                .iter()
                .filter(|s| send_overlaps_a_recv(s, ops))
                .map(|s| (s.buf, s.count * s.dtype.size()))
                .collect();
        }
        Op::Barrier | Op::Refused(_) => false,
    };
    if !hazard {
        return Vec::new();
    }
    layout.inputs().iter().map(|s| (s.ptr, s.bytes)).collect()
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
        Op::Reduction(r) => match &mut r.kind {
            ReductionKind::ReduceScatterSingle { input, .. }
            | ReductionKind::ReduceScatterV { input, .. } => *input = staged[0],
            ReductionKind::ReduceScatter { inputs, .. } => inputs.copy_from_slice(staged),
            // In place: nothing staged.
            ReductionKind::AllReduce { .. } | ReductionKind::Reduce { .. } => {}
        },
        Op::Gather(g) => g.input = staged[0],
        Op::Scatter(s) => match &mut s.kind {
            ScatterKind::Scatter { inputs, .. } => inputs.copy_from_slice(staged),
            // In place: nothing staged.
            ScatterKind::Broadcast { .. } => {}
        },
        Op::AllToAll(a) => match &mut a.kind {
            AllToAllKind::Lists { inputs, .. } => inputs.copy_from_slice(staged),
            AllToAllKind::Single { input, .. } | AllToAllKind::VSingle { input, .. } => {
                *input = staged[0]
            }
        },
        Op::PointToPoint(p) => {
            let ops = p.transfers_mut();
            let hazardous: Vec<bool> = ops.iter().map(|p| send_overlaps_a_recv(p, ops)).collect();
            let mut copies = staged.iter();
            for (p, _) in ops.iter_mut().zip(hazardous).filter(|(_, h)| *h) {
                if let Some(copy) = copies.next() {
                    p.buf = *copy;
                }
            }
        }
        // No buffers.
        Op::Barrier | Op::Refused(_) => {}
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
                 graph on the nccl backend (the input would need a copy that outlives the graph; stream {stream:p} is \
                 capturing); pass separate buffers",
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
