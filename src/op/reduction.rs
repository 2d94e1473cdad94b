//! The reduction family: all-reduce, reduce and the reduce-scatters. Every
//! member combines the ranks' data of one dtype with one reduce op.

use super::Ptr;
use crate::types::{DType, ReduceOp};

/// A reduction: what every member shares, and the member.
#[derive(Debug, Clone)]
pub struct Reduction {
    pub dtype: DType,
    pub op: ReduceOp,
    pub kind: ReductionKind,
}

/// The members of [`Reduction`]. Counts are elements of the reduction's
/// dtype.
#[derive(Debug, Clone)]
pub enum ReductionKind {
    /// In place.
    AllReduce { buf: Ptr, count: usize },
    /// In place; the result is defined on `root` only.
    Reduce { buf: Ptr, count: usize, root: i32 },
    /// One input buffer per rank; rank r gets the reduction of `inputs[r]`.
    ReduceScatter {
        output: Ptr,
        inputs: Vec<Ptr>,
        count: usize,
    },
    /// `input` holds `count * size` elements; rank r gets the reduction of
    /// block r.
    ReduceScatterSingle {
        output: Ptr,
        input: Ptr,
        count: usize,
    },
    /// `input` holds `sum(counts)` elements; rank r gets block r, `counts[r]`
    /// elements long.
    ReduceScatterV {
        output: Ptr,
        input: Ptr,
        counts: Vec<usize>,
    },
}

impl Reduction {
    /// The member's name, as the C API spells it (without `tc_`).
    pub fn name(&self) -> &'static str {
        super::OP_NAMES[self.code() as usize]
    }

    /// The member's [`super::Op::code`].
    #[inline(always)]
    pub fn code(&self) -> u8 {
        match self.kind {
            ReductionKind::Reduce { .. } => 4,
            ReductionKind::AllReduce { .. } => 5,
            ReductionKind::ReduceScatter { .. } => 9,
            ReductionKind::ReduceScatterSingle { .. } => 10,
            ReductionKind::ReduceScatterV { .. } => 11,
        }
    }

    /// (per-rank count, root) every rank must agree on (see
    /// [`super::Op::signature`]).
    #[inline(always)]
    pub fn count_and_root(&self) -> (usize, i32) {
        match &self.kind {
            ReductionKind::AllReduce { count, .. }
            | ReductionKind::ReduceScatter { count, .. }
            | ReductionKind::ReduceScatterSingle { count, .. } => (*count, -1),
            ReductionKind::Reduce { count, root, .. } => (*count, *root),
            ReductionKind::ReduceScatterV { counts, .. } => (counts.iter().sum(), -1),
        }
    }
}
