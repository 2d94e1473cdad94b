//! The scatter family: broadcast and scatter. Every member sends from the
//! root to every rank `count` elements each: the same ones (broadcast) or
//! each rank its own block (scatter). Broadcast is here rather than among
//! the reductions or beside barrier because it shares exactly what the
//! scatter's members share (dtype, per-rank count, root) and the
//! direction of its data, root to all, and nothing with the others (no
//! reduce op, no input of every rank).

use super::Ptr;
use crate::types::DType;

/// A scatter or broadcast: what both share, and the member.
#[derive(Debug, Clone)]
pub struct Scatter {
    pub dtype: DType,
    /// Elements each rank receives.
    pub count: usize,
    pub root: i32,
    pub kind: ScatterKind,
}

/// The members of [`Scatter`].
#[derive(Debug, Clone)]
pub enum ScatterKind {
    /// In place: the root's `buf` is copied to every rank's.
    Broadcast { buf: Ptr },
    /// `inputs` has one buffer per rank on `root`, and is empty elsewhere.
    Scatter { output: Ptr, inputs: Vec<Ptr> },
}

impl Scatter {
    /// The member's name, as the C API spells it (without `tc_`).
    pub fn name(&self) -> &'static str {
        super::OP_NAMES[self.code() as usize]
    }

    /// The member's [`super::Op::code`].
    #[inline(always)]
    pub fn code(&self) -> u8 {
        match self.kind {
            ScatterKind::Broadcast { .. } => 3,
            ScatterKind::Scatter { .. } => 16,
        }
    }
}
