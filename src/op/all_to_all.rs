//! The all-to-all family: every rank sends a block to every rank.

use super::Ptr;
use crate::types::DType;

/// An all-to-all: what every member shares, and the member.
#[derive(Debug, Clone)]
pub struct AllToAll {
    pub dtype: DType,
    pub kind: AllToAllKind,
}

/// The members of [`AllToAll`]. Counts are elements of the dtype.
#[derive(Debug, Clone)]
pub enum AllToAllKind {
    /// One buffer per rank each way, `count` elements each.
    AllToAll {
        outputs: Vec<Ptr>,
        inputs: Vec<Ptr>,
        count: usize,
    },
    /// `count` elements to and from each rank.
    AllToAllSingle {
        output: Ptr,
        input: Ptr,
        count: usize,
    },
    /// `input_counts[r]` elements go to rank r; `output_counts[r]` come from
    /// rank r; blocks are contiguous in rank order.
    AllToAllVSingle {
        output: Ptr,
        output_counts: Vec<usize>,
        input: Ptr,
        input_counts: Vec<usize>,
    },
}

impl AllToAll {
    /// The member's name, as the C API spells it (without `tc_`).
    pub fn name(&self) -> &'static str {
        super::OP_NAMES[self.code() as usize]
    }

    /// The member's [`super::Op::code`].
    #[inline(always)]
    pub fn code(&self) -> u8 {
        match self.kind {
            AllToAllKind::AllToAll { .. } => 12,
            AllToAllKind::AllToAllSingle { .. } => 13,
            AllToAllKind::AllToAllVSingle { .. } => 14,
        }
    }

    /// The per-rank count every rank must agree on (see
    /// [`super::Op::signature`]): 0 for the v-variant, whose counts differ.
    #[inline(always)]
    pub fn count(&self) -> usize {
        match &self.kind {
            AllToAllKind::AllToAll { count, .. } | AllToAllKind::AllToAllSingle { count, .. } => {
                *count
            }
            AllToAllKind::AllToAllVSingle { .. } => 0,
        }
    }
}
