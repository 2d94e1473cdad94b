//! The gather family: the all-gathers and the gathers. Every member sends
//! this rank's one input block to every rank (all-gathers) or to the root
//! (gathers).

use super::Ptr;
use crate::types::DType;
use std::ffi::c_void;

/// A gather: what every member shares, and the member.
#[derive(Debug, Clone)]
pub struct Gather {
    pub dtype: DType,
    /// This rank's block.
    pub input: Ptr,
    pub kind: GatherKind,
}

/// The members of [`Gather`]. Counts are elements of the gather's dtype.
#[derive(Debug, Clone)]
pub enum GatherKind {
    /// One output buffer per rank.
    AllGather { outputs: Vec<Ptr>, count: usize },
    /// `output` holds `count * size` elements, rank r's at `r * count`.
    AllGatherSingle { output: Ptr, count: usize },
    /// Rank r contributes `counts[r]` elements; `output` holds them all in
    /// rank order.
    AllGatherV { output: Ptr, counts: Vec<usize> },
    /// `outputs` has one buffer per rank on `root`, and is empty elsewhere.
    Gather {
        outputs: Vec<Ptr>,
        count: usize,
        root: i32,
    },
    /// On `root`, `output` holds `count * size` elements, rank r's at
    /// `r * count`; it is ignored (may be null) elsewhere.
    GatherSingle {
        output: Ptr,
        count: usize,
        root: i32,
    },
}

impl Gather {
    /// The member's name, as the C API spells it (without `tc_`).
    pub fn name(&self) -> &'static str {
        super::OP_NAMES[self.code() as usize]
    }

    /// The member's [`super::Op::code`].
    #[inline(always)]
    pub fn code(&self) -> u8 {
        match self.kind {
            GatherKind::AllGather { .. } => 6,
            GatherKind::AllGatherSingle { .. } => 7,
            GatherKind::AllGatherV { .. } => 8,
            GatherKind::Gather { .. } => 17,
            GatherKind::GatherSingle { .. } => 18,
        }
    }

    /// (per-rank count, root) every rank must agree on (see
    /// [`super::Op::signature`]).
    #[inline(always)]
    pub fn count_and_root(&self) -> (usize, i32) {
        match &self.kind {
            GatherKind::AllGather { count, .. } | GatherKind::AllGatherSingle { count, .. } => {
                (*count, -1)
            }
            GatherKind::AllGatherV { counts, .. } => (counts.iter().sum(), -1),
            GatherKind::Gather { count, root, .. }
            | GatherKind::GatherSingle { count, root, .. } => (*count, *root),
        }
    }
}

/// A gather_single's output as the list a gather takes, for transports
/// that run the list form: on `root` (when `rank` is it) one output per
/// rank of `size`, rank r's at `r * count` elements of `output`; none
/// elsewhere.
pub fn gather_single_outputs(
    output: Ptr,
    count: usize,
    dtype: DType,
    (rank, root, size): (i32, i32, i32),
) -> Vec<Ptr> {
    if rank != root {
        return Vec::new();
    }
    let block = count * dtype.size();
    // In bounds: validation checked `count * size` elements.
    (0..size as usize)
        .map(|r| Ptr(output.as_u8().wrapping_add(r * block) as *mut c_void))
        .collect()
}
