//! The op vocabulary: the operations a comm runs (`Op`, in families:
//! point-to-point, reductions, gathers, scatters, all-to-alls, barrier;
//! each family's payload in a file of its own; the raw addresses `Ptr`), their per-call options
//! (`OpOptions`), their validation, and the one description of the bytes
//! each operation reads or writes ([`Op::layout`]: every buffer's address,
//! size and use, and where each rank's block lies; [`for_each_buffer`]
//! walks it with rewritable addresses). Everything here is
//! plain data: backends and the comm both depend on it, it depends on
//! neither.

use crate::types::{DType, Hints, ReduceOp};
use std::ffi::c_void;
use std::time::Duration;

mod all_to_all;
mod buffers;
mod constructors;
#[cfg(test)]
mod families_tests;
mod gather;
mod layout;
#[cfg(test)]
mod layout_tests;
mod point_to_point;
mod reduction;
mod refusal;
mod scatter;
mod validate;
#[cfg(test)]
mod validate_tests;

pub use all_to_all::{AllToAll, AllToAllKind};
pub use buffers::{for_each_buffer, Use};
pub use gather::{gather_single_outputs, Gather, GatherKind};
pub use layout::Layout;
#[cfg(test)]
use layout::{Side, Span};
pub use point_to_point::{P2p, PointToPoint, SourceSlot, ANY_SOURCE};
pub use reduction::{Reduction, ReductionKind};
pub use refusal::Refusal;
pub use scatter::{Scatter, ScatterKind};

/// A raw buffer address handed in by C. The caller guarantees it stays valid
/// until the operation's work completes (torchcomms' contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr(pub *mut c_void);
// The address is only dereferenced by the backend while the caller keeps the
// buffer alive; moving the address between threads is the point.
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

impl Ptr {
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
    pub fn as_u8(self) -> *mut u8 {
        self.0 as *mut u8
    }
}

/// A validated operation: one of the families of operations, each a
/// typed payload holding what its members share and which member it is,
/// so that code serving a family serves each of its members. Counts are
/// elements of the dtype; every list has one entry per rank unless noted;
/// same input and output address means in place.
#[derive(Debug, Clone)]
pub enum Op {
    /// Send, receive and batch.
    PointToPoint(PointToPoint),
    /// All-reduce, reduce and the reduce-scatters.
    Reduction(Reduction),
    /// The all-gathers and the gathers.
    Gather(Gather),
    /// Broadcast and scatter.
    Scatter(Scatter),
    /// The all-to-alls.
    AllToAll(AllToAll),
    Barrier,
    /// A collective this rank refused before issuing it (see [`Refusal`]),
    /// issued in its place so that the other ranks fail too.
    Refused(Refusal),
}

/// Every operation's name, indexed by its [`Op::code`].
pub const OP_NAMES: [&str; 24] = [
    "send",
    "recv",
    "batch_p2p",
    "broadcast",
    "reduce",
    "all_reduce",
    "all_gather",
    "all_gather_single",
    "all_gather_v",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_v",
    "all_to_all",
    "all_to_all_single",
    "all_to_all_v_single",
    "barrier",
    "scatter",
    "gather",
    "gather_single",
    // Window calls: not operations (no code), named here for the hooks.
    "window_put",
    "window_get",
    "window_signal",
    "window_wait_signal",
    // A refused collective (Op::Refused).
    "refused",
];

impl Op {
    /// The operation's number, exchanged between ranks by the collective
    /// checks (so stable across builds) and the index of its name in
    /// [`OP_NAMES`].
    #[inline(always)]
    pub fn code(&self) -> u8 {
        match self {
            Op::PointToPoint(p) => p.code(),
            Op::Reduction(r) => r.code(),
            Op::Gather(g) => g.code(),
            Op::Scatter(s) => s.code(),
            Op::AllToAll(a) => a.code(),
            Op::Barrier => 15,
            Op::Refused(_) => 23,
        }
    }

    /// The operation's name, as the C API spells it (without `tc_`).
    pub fn name(&self) -> &'static str {
        OP_NAMES[self.code() as usize]
    }

    /// (dtype, per-rank count, root) that every rank must agree on for a
    /// collective; None for point-to-point operations and refusals. Used by
    /// `TORCHCOMM_CHECK_COLLECTIVES`.
    #[inline(always)]
    pub fn signature(&self) -> Option<(Option<DType>, usize, i32)> {
        match self {
            Op::PointToPoint(_) | Op::Refused(_) => None,
            Op::Reduction(r) => {
                let (count, root) = r.count_and_root();
                Some((Some(r.dtype), count, root))
            }
            Op::Gather(g) => {
                let (count, root) = g.count_and_root();
                Some((Some(g.dtype), count, root))
            }
            Op::Scatter(s) => Some((Some(s.dtype), s.count, s.root)),
            Op::AllToAll(a) => Some((Some(a.dtype), a.count(), -1)),
            Op::Barrier => Some((None, 0, -1)),
        }
    }

    /// The element type, where the operation has one (a batch mixing types
    /// and a barrier have none).
    pub fn dtype(&self) -> Option<DType> {
        match self {
            Op::PointToPoint(p) => p.dtype(),
            _ => self.signature().and_then(|s| s.0),
        }
    }

    /// The operation's size as its caller gave it, in elements: the count of
    /// one rank's block (the total of the counts for v-variants, of the
    /// input counts for all_to_all_v_single, of the members for a batch).
    pub fn elements(&self) -> usize {
        match self {
            Op::PointToPoint(p) => p.transfers().iter().map(|p| p.count).sum(),
            Op::AllToAll(AllToAll {
                kind: AllToAllKind::VSingle { input_counts, .. },
                ..
            }) => input_counts.iter().sum(),
            _ => self.signature().map_or(0, |s| s.1),
        }
    }

    /// The reduce op, if the operation reduces.
    pub fn reduce_op(&self) -> Option<&ReduceOp> {
        match self {
            Op::Reduction(r) => Some(&r.op),
            _ => None,
        }
    }

    /// The per-rank counts every rank passes alike: those of all_gather_v
    /// and reduce_scatter_v (all_to_all_v_single's differ between ranks).
    #[inline]
    pub fn agreed_counts(&self) -> Option<&[usize]> {
        match self {
            Op::Gather(Gather {
                kind: GatherKind::AllGatherV { counts, .. },
                ..
            })
            | Op::Reduction(Reduction {
                kind: ReductionKind::ReduceScatterV { counts, .. },
                ..
            }) => Some(counts),
            _ => None,
        }
    }

    /// The first non-zero point-to-point tag, with the argument that gave
    /// it, for backends that cannot match on tags.
    pub fn nonzero_tag(&self) -> Option<(String, u32)> {
        match self {
            Op::PointToPoint(p) => p.nonzero_tag(),
            _ => None,
        }
    }
}

/// Per-operation options, read from `tc_op_options_t`.
#[derive(Debug, Clone)]
pub struct OpOptions {
    pub async_op: bool,
    /// None: the comm's timeout.
    pub timeout: Option<Duration>,
    /// CUDA stream for device buffers (NULL: legacy default stream).
    pub stream: *mut c_void,
    pub hints: Hints,
}

impl Default for OpOptions {
    fn default() -> Self {
        OpOptions {
            async_op: false,
            timeout: None,
            stream: std::ptr::null_mut(),
            hints: Vec::new(),
        }
    }
}
