//! The op vocabulary: the operations a comm runs (`Op`, its point-to-point
//! members `P2p`, the raw addresses `Ptr`), their per-call options
//! (`OpOptions`), their validation, and the one description of the bytes
//! each operation reads or writes ([`Op::layout`]: every buffer's address,
//! size and use, and where each rank's block lies; [`for_each_buffer`]
//! walks it with rewritable addresses). Everything here is
//! plain data: backends and the comm both depend on it, it depends on
//! neither.

use crate::types::{DType, Hints, ReduceOp};
use std::ffi::c_void;
use std::time::Duration;

mod buffers;
mod layout;
#[cfg(test)]
mod layout_tests;
mod validate;
#[cfg(test)]
mod validate_tests;

pub use buffers::{for_each_buffer, Use};
pub use layout::Layout;
#[cfg(test)]
use layout::{Side, Span};

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

/// One send or receive of a batch.
#[derive(Debug, Clone)]
pub struct P2p {
    pub is_send: bool,
    pub buf: Ptr,
    pub count: usize,
    pub dtype: DType,
    pub peer: i32,
    /// A send matches a receive of the same (peer, tag); 0 is the tag of
    /// every untagged call (see `tc_op_options_t.tag`).
    pub tag: u32,
}

impl P2p {
    /// Why this receive cannot take its sender's message of `count`
    /// elements of dtype code `dtype` (every transport's words alike).
    pub fn mismatch_with_send(&self, count: u64, dtype: u64) -> String {
        let name = DType::ALL.get(dtype as usize).map_or("?", |d| d.name());
        let tag = match self.tag {
            0 => String::new(),
            t => format!(" with tag {t}"),
        };
        format!(
            "receive of {} {} from rank {}{tag} does not match that rank's send of {count} {name} \
             (the send completed there)",
            self.count,
            self.dtype.name(),
            self.peer
        )
    }
}

/// A validated operation. Counts are elements of `dtype`; every list has one
/// entry per rank unless noted; same input and output address means in place.
#[derive(Debug, Clone)]
pub enum Op {
    /// `tag`: as [`P2p::tag`].
    Send {
        buf: Ptr,
        count: usize,
        dtype: DType,
        peer: i32,
        tag: u32,
    },
    Recv {
        buf: Ptr,
        count: usize,
        dtype: DType,
        peer: i32,
        tag: u32,
    },
    /// Sends and receives issued together (NCCL group semantics).
    Batch {
        ops: Vec<P2p>,
    },
    Broadcast {
        buf: Ptr,
        count: usize,
        dtype: DType,
        root: i32,
    },
    /// In place; the result is defined on `root` only.
    Reduce {
        buf: Ptr,
        count: usize,
        dtype: DType,
        root: i32,
        op: ReduceOp,
    },
    /// In place.
    AllReduce {
        buf: Ptr,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    },
    AllGather {
        outputs: Vec<Ptr>,
        input: Ptr,
        count: usize,
        dtype: DType,
    },
    /// `output` holds `count * size` elements, rank r's at `r * count`.
    AllGatherSingle {
        output: Ptr,
        input: Ptr,
        count: usize,
        dtype: DType,
    },
    /// Rank r contributes `counts[r]` elements; `output` holds them all in
    /// rank order.
    AllGatherV {
        output: Ptr,
        input: Ptr,
        counts: Vec<usize>,
        dtype: DType,
    },
    ReduceScatter {
        output: Ptr,
        inputs: Vec<Ptr>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    },
    /// `input` holds `count * size` elements; rank r gets the reduction of
    /// block r.
    ReduceScatterSingle {
        output: Ptr,
        input: Ptr,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    },
    /// `input` holds `sum(counts)` elements; rank r gets block r, `counts[r]`
    /// elements long.
    ReduceScatterV {
        output: Ptr,
        input: Ptr,
        counts: Vec<usize>,
        dtype: DType,
        op: ReduceOp,
    },
    AllToAll {
        outputs: Vec<Ptr>,
        inputs: Vec<Ptr>,
        count: usize,
        dtype: DType,
    },
    /// `count` elements to and from each rank.
    AllToAllSingle {
        output: Ptr,
        input: Ptr,
        count: usize,
        dtype: DType,
    },
    /// `input_counts[r]` elements go to rank r; `output_counts[r]` come from
    /// rank r; blocks are contiguous in rank order.
    AllToAllVSingle {
        output: Ptr,
        output_counts: Vec<usize>,
        input: Ptr,
        input_counts: Vec<usize>,
        dtype: DType,
    },
    Barrier,
    /// `inputs` has one buffer per rank on `root`, and is empty elsewhere.
    Scatter {
        output: Ptr,
        inputs: Vec<Ptr>,
        count: usize,
        dtype: DType,
        root: i32,
    },
    /// `outputs` has one buffer per rank on `root`, and is empty elsewhere.
    Gather {
        outputs: Vec<Ptr>,
        input: Ptr,
        count: usize,
        dtype: DType,
        root: i32,
    },
    /// On `root`, `output` holds `count * size` elements, rank r's at
    /// `r * count`; it is ignored (may be null) elsewhere.
    GatherSingle {
        output: Ptr,
        input: Ptr,
        count: usize,
        dtype: DType,
        root: i32,
    },
    /// A collective this rank refused before issuing it (see [`Refusal`]),
    /// issued in its place so that the other ranks fail too.
    Refused(Refusal),
}

/// A collective call refused on this rank (a bad argument, a failed local
/// check), issued in place of the call so that every rank fails it: a
/// backend takes part in the synchronisation its peers make for their
/// call, tells them this rank's `reason`, and fails. Without it the
/// refusing rank would skip a collective its peers run, and every later
/// collective would pair with the wrong call (silent wrong data).
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The refused call's name, as the C API spells it (`tc_all_reduce`).
    pub call: &'static str,
    /// The refusing rank.
    pub rank: i32,
    /// Why: the error this rank's caller gets.
    pub error: crate::error::Error,
}

impl Refusal {
    /// What the other ranks are told: "rank 1 refused this call
    /// (tc_broadcast_coalesced): argument 'dtypes[0]' ...".
    pub fn told(&self) -> String {
        format!(
            "rank {} refused this call ({}): {}",
            self.rank, self.call, self.error.message
        )
    }
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
    pub fn code(&self) -> u8 {
        match self {
            Op::Send { .. } => 0,
            Op::Recv { .. } => 1,
            Op::Batch { .. } => 2,
            Op::Broadcast { .. } => 3,
            Op::Reduce { .. } => 4,
            Op::AllReduce { .. } => 5,
            Op::AllGather { .. } => 6,
            Op::AllGatherSingle { .. } => 7,
            Op::AllGatherV { .. } => 8,
            Op::ReduceScatter { .. } => 9,
            Op::ReduceScatterSingle { .. } => 10,
            Op::ReduceScatterV { .. } => 11,
            Op::AllToAll { .. } => 12,
            Op::AllToAllSingle { .. } => 13,
            Op::AllToAllVSingle { .. } => 14,
            Op::Barrier => 15,
            Op::Scatter { .. } => 16,
            Op::Gather { .. } => 17,
            Op::GatherSingle { .. } => 18,
            Op::Refused(_) => 23,
        }
    }

    /// The operation's name, as the C API spells it (without `tc_`).
    pub fn name(&self) -> &'static str {
        OP_NAMES[self.code() as usize]
    }

    /// A send or receive as the one transfer of a batch; None for other
    /// operations.
    pub fn as_transfer(&self) -> Option<P2p> {
        match *self {
            Op::Send {
                buf,
                count,
                dtype,
                peer,
                tag,
            }
            | Op::Recv {
                buf,
                count,
                dtype,
                peer,
                tag,
            } => Some(P2p {
                is_send: matches!(self, Op::Send { .. }),
                buf,
                count,
                dtype,
                peer,
                tag,
            }),
            _ => None,
        }
    }

    /// (dtype, per-rank count, root) that every rank must agree on for a
    /// collective; None for point-to-point operations and refusals. Used by
    /// `TORCHCOMM_CHECK_COLLECTIVES`.
    #[inline]
    pub fn signature(&self) -> Option<(Option<DType>, usize, i32)> {
        match self {
            Op::Send { .. } | Op::Recv { .. } | Op::Batch { .. } | Op::Refused(_) => None,
            Op::Broadcast {
                count, dtype, root, ..
            } => Some((Some(*dtype), *count, *root)),
            Op::Reduce {
                count, dtype, root, ..
            } => Some((Some(*dtype), *count, *root)),
            Op::AllReduce { count, dtype, .. }
            | Op::AllGather { count, dtype, .. }
            | Op::AllGatherSingle { count, dtype, .. }
            | Op::ReduceScatter { count, dtype, .. }
            | Op::ReduceScatterSingle { count, dtype, .. }
            | Op::AllToAll { count, dtype, .. }
            | Op::AllToAllSingle { count, dtype, .. } => Some((Some(*dtype), *count, -1)),
            Op::AllGatherV { counts, dtype, .. } | Op::ReduceScatterV { counts, dtype, .. } => {
                Some((Some(*dtype), counts.iter().sum(), -1))
            }
            Op::AllToAllVSingle { dtype, .. } => Some((Some(*dtype), 0, -1)),
            Op::Barrier => Some((None, 0, -1)),
            Op::Scatter {
                count, dtype, root, ..
            }
            | Op::Gather {
                count, dtype, root, ..
            }
            | Op::GatherSingle {
                count, dtype, root, ..
            } => Some((Some(*dtype), *count, *root)),
        }
    }

    /// The element type, where the operation has one (a batch mixing types
    /// and a barrier have none).
    pub fn dtype(&self) -> Option<DType> {
        match self {
            Op::Send { dtype, .. } | Op::Recv { dtype, .. } => Some(*dtype),
            Op::Batch { ops } => ops
                .first()
                .map(|p| p.dtype)
                .filter(|d| ops.iter().all(|p| p.dtype == *d)),
            _ => self.signature().and_then(|s| s.0),
        }
    }

    /// The operation's size as its caller gave it, in elements: the count of
    /// one rank's block (the total of the counts for v-variants, of the
    /// input counts for all_to_all_v_single, of the members for a batch).
    pub fn elements(&self) -> usize {
        match self {
            Op::Send { count, .. } | Op::Recv { count, .. } => *count,
            Op::Batch { ops } => ops.iter().map(|p| p.count).sum(),
            Op::AllToAllVSingle { input_counts, .. } => input_counts.iter().sum(),
            _ => self.signature().map_or(0, |s| s.1),
        }
    }

    /// The reduce op, if the operation reduces.
    pub fn reduce_op(&self) -> Option<&ReduceOp> {
        match self {
            Op::Reduce { op, .. }
            | Op::AllReduce { op, .. }
            | Op::ReduceScatter { op, .. }
            | Op::ReduceScatterSingle { op, .. }
            | Op::ReduceScatterV { op, .. } => Some(op),
            _ => None,
        }
    }
}

impl Op {
    /// The first non-zero point-to-point tag, with the argument that gave
    /// it, for backends that cannot match on tags.
    pub fn nonzero_tag(&self) -> Option<(String, u32)> {
        match self {
            Op::Send { tag, .. } | Op::Recv { tag, .. } if *tag != 0 => {
                Some(("opts.tag".into(), *tag))
            }
            Op::Batch { ops } => ops
                .iter()
                .enumerate()
                .find(|(_, p)| p.tag != 0)
                .map(|(i, p)| (format!("batch[{i}].tag"), p.tag)),
            _ => None,
        }
    }

    /// A `GatherSingle` as the `Gather` it equals, for backends that run
    /// the list form: on `root` one output per rank, rank r's at `r *
    /// count` elements of `output`; none elsewhere. None for other ops.
    pub fn gather_single_as_gather(&self, rank: i32, size: i32) -> Option<Op> {
        let Op::GatherSingle {
            output,
            input,
            count,
            dtype,
            root,
        } = self
        else {
            return None;
        };
        let block = count * dtype.size();
        let outputs = if rank == *root {
            // In bounds: validation checked `count * size` elements.
            (0..size as usize)
                .map(|r| Ptr(output.as_u8().wrapping_add(r * block) as *mut c_void))
                .collect()
        } else {
            Vec::new()
        };
        Some(Op::Gather {
            outputs,
            input: *input,
            count: *count,
            dtype: *dtype,
            root: *root,
        })
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
