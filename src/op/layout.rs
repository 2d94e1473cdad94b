//! The one description of an operation's bytes as one rank sees them
//! ([`Op::layout`]): every buffer's address and size, whether it is read,
//! written or both, and, for the collectives that move one block per rank,
//! where each rank's block lies. Buffer walks ([`super::for_each_buffer`]:
//! CUDA staging, pointer and NaN checks), the overlap rules of the nccl
//! backend and of gloo's shared-memory path all read it, so that a block's
//! offset or a v-variant's total is computed here only.

use super::{
    AllToAll, AllToAllKind, Gather, GatherKind, Op, P2p, PointToPoint, Ptr, Reduction,
    ReductionKind, Scatter, ScatterKind, Use,
};
use crate::types::DType;
use crate::util;

/// `bytes` bytes at `ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub ptr: Ptr,
    pub bytes: usize,
}

impl Span {
    #[inline(always)]
    pub fn new(ptr: Ptr, bytes: usize) -> Span {
        Span { ptr, bytes }
    }

    /// Whether the two spans share a byte (overflow-guarded, see
    /// [`util::overlaps`]).
    #[inline(always)]
    pub fn overlaps(&self, other: &Span) -> bool {
        util::overlaps(self.ptr.as_u8(), self.bytes, other.ptr.as_u8(), other.bytes)
    }
}

/// The sizes of the per-rank blocks of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSizes<'a> {
    /// Every block `bytes` long.
    Even { bytes: usize },
    /// Rank r's block `counts[r]` elements of `elem` bytes (the v-variants).
    Counts { counts: &'a [usize], elem: usize },
}

impl BlockSizes<'_> {
    /// Rank `r`'s block length in bytes.
    #[inline(always)]
    pub fn bytes(&self, r: usize) -> usize {
        match *self {
            BlockSizes::Even { bytes } => bytes,
            BlockSizes::Counts { counts, elem } => counts[r] * elem,
        }
    }

    /// Where rank `r`'s block starts, in bytes from the buffer's start.
    #[inline(always)]
    pub fn offset(&self, r: usize) -> usize {
        match *self {
            BlockSizes::Even { bytes } => r * bytes,
            BlockSizes::Counts { counts, elem } => counts[..r].iter().sum::<usize>() * elem,
        }
    }

    /// The whole buffer's length in bytes, for `ranks` blocks.
    #[inline(always)]
    pub fn total(&self, ranks: usize) -> usize {
        match *self {
            BlockSizes::Even { bytes } => ranks * bytes,
            BlockSizes::Counts { counts, elem } => counts.iter().sum::<usize>() * elem,
        }
    }
}

/// The inputs or the outputs of a collective that is not in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side<'a> {
    /// No buffer here (a gather's output, a scatter's input, off the root).
    Absent,
    /// One buffer, this rank's own block (a gather's input, a scatter's
    /// output).
    Own(Span),
    /// One buffer of one block per rank, contiguous in rank order.
    Blocks {
        base: Ptr,
        sizes: BlockSizes<'a>,
        ranks: usize,
    },
    /// One buffer of `bytes` per rank (the list forms; empty off the root
    /// for gather and scatter).
    List { ptrs: &'a [Ptr], bytes: usize },
}

impl Side<'_> {
    /// How many buffers the side has.
    #[inline(always)]
    pub fn buffer_count(&self) -> usize {
        match self {
            Side::Absent => 0,
            Side::Own(_) | Side::Blocks { .. } => 1,
            Side::List { ptrs, .. } => ptrs.len(),
        }
    }

    /// Buffer `i` of the side, whole (a `Blocks` side is one buffer).
    #[inline(always)]
    pub fn buffer(&self, i: usize) -> Span {
        match *self {
            Side::Absent => unreachable!("an absent side has no buffer"),
            Side::Own(s) => s,
            Side::Blocks { base, sizes, ranks } => Span::new(base, sizes.total(ranks)),
            Side::List { ptrs, bytes } => Span::new(ptrs[i], bytes),
        }
    }

    /// The side's buffers, in order.
    #[inline(always)]
    pub fn buffers(&self) -> impl Iterator<Item = Span> + '_ {
        (0..self.buffer_count()).map(|i| self.buffer(i))
    }

    /// Rank `r`'s block, where the side has one block per rank (and holds
    /// them: not off the root).
    #[inline(always)]
    pub fn block(&self, r: usize) -> Option<Span> {
        match *self {
            Side::Blocks { base, sizes, .. } => Some(Span::new(
                Ptr(base.as_u8().wrapping_add(sizes.offset(r)).cast()),
                sizes.bytes(r),
            )),
            Side::List { ptrs, bytes } => ptrs.get(r).map(|p| Span::new(*p, bytes)),
            Side::Absent | Side::Own(_) => None,
        }
    }
}

/// The bytes of an operation as one rank sees them.
#[derive(Debug, Clone, Copy)]
pub enum Layout<'a> {
    /// A barrier.
    Nothing,
    /// One buffer: a send's (read), a receive's (written), an in-place
    /// collective's (read and written).
    One(Span, Use),
    /// The members of a batch, each read (send) or written (receive).
    Batch(&'a [P2p]),
    /// Inputs read, outputs written: every collective not in place.
    Apart { input: Side<'a>, output: Side<'a> },
}

impl<'a> Layout<'a> {
    /// Calls `f(span, use)` for every buffer, inputs before outputs (the
    /// order of [`super::for_each_buffer`]).
    #[inline]
    pub fn each(&self, mut f: impl FnMut(Span, Use)) {
        match self {
            Layout::Nothing => {}
            Layout::One(s, u) => f(*s, *u),
            Layout::Batch(ops) => ops.iter().for_each(|p| {
                let u = if p.is_send { Use::In } else { Use::Out };
                f(Span::new(p.buf, p.count * p.dtype.size()), u)
            }),
            Layout::Apart { input, output } => {
                input.buffers().for_each(|s| f(s, Use::In));
                output.buffers().for_each(|s| f(s, Use::Out));
            }
        }
    }

    /// The input buffers, in order (a batch's sends; the one buffer of an
    /// in-place collective).
    #[inline]
    pub fn inputs(&self) -> Vec<Span> {
        let mut v = Vec::new();
        self.each(|s, u| {
            if u != Use::Out {
                v.push(s)
            }
        });
        v
    }

    /// For the collectives where one side is this rank's own block and the
    /// other holds every rank's (gathers, scatters): the own buffer and
    /// this rank's block of the other side, where that side holds blocks.
    #[inline(always)]
    pub fn own_and_block(&self, me: usize) -> Option<(Span, Span)> {
        match *self {
            Layout::Apart {
                input: Side::Own(own),
                output: other,
            }
            | Layout::Apart {
                input: other,
                output: Side::Own(own),
            } => other.block(me).map(|b| (own, b)),
            _ => None,
        }
    }

    /// Whether this rank's own buffer (a gather's input, a scatter's
    /// output) overlaps the other side anywhere but exactly at this rank's
    /// block there: the in-place layout every backend accepts. False for
    /// other operations.
    #[inline(always)]
    pub fn overlaps_outside_own_block(&self, me: usize) -> bool {
        let (own, other) = match *self {
            Layout::Apart {
                input: Side::Own(own),
                output: other,
            }
            | Layout::Apart {
                input: other,
                output: Side::Own(own),
            } => (own, other),
            _ => return false,
        };
        match other {
            // The in-place test first: the cheaper one.
            Side::Blocks { .. } => {
                other.block(me).map_or(true, |b| b.ptr != own.ptr) && own.overlaps(&other.buffer(0))
            }
            Side::List { ptrs, bytes } => ptrs
                .iter()
                .enumerate()
                .any(|(q, p)| own.overlaps(&Span::new(*p, bytes)) && !(q == me && *p == own.ptr)),
            Side::Absent | Side::Own(_) => false,
        }
    }

    /// Whether some input buffer overlaps some output buffer.
    #[inline(always)]
    pub fn inputs_overlap_outputs(&self) -> bool {
        match self {
            Layout::Apart { input, output } => input
                .buffers()
                .any(|i| output.buffers().any(|o| i.overlaps(&o))),
            _ => false,
        }
    }

    /// Whether input and output are one buffer cut into the same blocks
    /// (an in-place all-to-all with the same splits both ways).
    #[inline(always)]
    pub fn same_blocks_in_place(&self) -> bool {
        match self {
            Layout::Apart {
                input: Side::Blocks {
                    base: a, sizes: sa, ..
                },
                output: Side::Blocks {
                    base: b, sizes: sb, ..
                },
            } => a == b && sa == sb,
            _ => false,
        }
    }
}

impl Op {
    /// The operation's bytes as `rank` of `size` sees them. The op must have
    /// been validated, so that no size overflows.
    #[inline(always)]
    pub fn layout(&self, rank: i32, size: i32) -> Layout<'_> {
        let at = At::new(rank, size);
        match self {
            Op::Barrier | Op::Refused(_) => Layout::Nothing,
            Op::PointToPoint(PointToPoint::Batch(ops)) => Layout::Batch(ops),
            Op::PointToPoint(PointToPoint::One(p)) => {
                let usage = if p.is_send { Use::In } else { Use::Out };
                Layout::One(Span::new(p.buf, p.count * p.dtype.size()), usage)
            }
            Op::Reduction(r) => reduction(r, at),
            Op::Gather(g) => gather(g, at),
            Op::Scatter(s) => scatter(s),
            Op::AllToAll(a) => all_to_all(a, at),
        }
    }
}

impl Reduction {
    /// As [`Op::layout`].
    #[inline(always)]
    pub fn layout(&self, rank: i32, size: i32) -> Layout<'_> {
        reduction(self, At::new(rank, size))
    }
}

impl Gather {
    /// As [`Op::layout`].
    #[inline(always)]
    pub fn layout(&self, rank: i32, size: i32) -> Layout<'_> {
        gather(self, At::new(rank, size))
    }
}

impl Scatter {
    /// As [`Op::layout`].
    #[inline(always)]
    pub fn layout(&self) -> Layout<'_> {
        scatter(self)
    }
}

impl AllToAll {
    /// As [`Op::layout`].
    #[inline(always)]
    pub fn layout(&self, rank: i32, size: i32) -> Layout<'_> {
        all_to_all(self, At::new(rank, size))
    }
}

/// The rank a layout is seen from: the comm's size, and the rank as an
/// index and as the ops number roots.
#[derive(Clone, Copy)]
struct At {
    n: usize,
    me: usize,
    rank: i32,
}

impl At {
    #[inline(always)]
    fn new(rank: i32, size: i32) -> At {
        At {
            n: size as usize,
            me: rank as usize,
            rank,
        }
    }
}

/// `count` elements of `dtype` per rank.
#[inline(always)]
fn even(count: usize, dtype: DType) -> BlockSizes<'static> {
    BlockSizes::Even {
        bytes: count * dtype.size(),
    }
}

/// `counts[r]` elements of `dtype` for rank r.
#[inline(always)]
fn counted(counts: &[usize], dtype: DType) -> BlockSizes<'_> {
    BlockSizes::Counts {
        counts,
        elem: dtype.size(),
    }
}

/// One buffer of blocks `sizes` for `at.n` ranks at `base`.
#[inline(always)]
fn blocks(base: Ptr, sizes: BlockSizes<'_>, at: At) -> Side<'_> {
    Side::Blocks {
        base,
        sizes,
        ranks: at.n,
    }
}

/// This rank's own `bytes` at `p`.
#[inline(always)]
fn own<'a>(p: Ptr, bytes: usize) -> Side<'a> {
    Side::Own(Span::new(p, bytes))
}

/// The reductions: all-reduce and reduce in place on one buffer; the
/// reduce-scatters every rank's block in, this rank's out.
#[inline(always)]
fn reduction(r: &Reduction, at: At) -> Layout<'_> {
    let dtype = r.dtype;
    let (input, output) = match &r.kind {
        ReductionKind::AllReduce { buf, count } | ReductionKind::Reduce { buf, count, .. } => {
            return Layout::One(Span::new(*buf, count * dtype.size()), Use::InOut)
        }
        ReductionKind::ReduceScatter {
            output,
            inputs,
            count,
        } => {
            let bytes = count * dtype.size();
            (
                Side::List {
                    ptrs: inputs,
                    bytes,
                },
                own(*output, bytes),
            )
        }
        ReductionKind::ReduceScatterSingle {
            output,
            input,
            count,
        } => (
            blocks(*input, even(*count, dtype), at),
            own(*output, count * dtype.size()),
        ),
        ReductionKind::ReduceScatterV {
            output,
            input,
            counts,
        } => (
            blocks(*input, counted(counts, dtype), at),
            own(*output, counts[at.me] * dtype.size()),
        ),
    };
    Layout::Apart { input, output }
}

/// The all-gathers and gathers: this rank's block in, every rank's out (on
/// the root only, for the gathers).
#[inline(always)]
fn gather(g: &Gather, at: At) -> Layout<'_> {
    let (input, dtype) = (g.input, g.dtype);
    let (input, output) = match &g.kind {
        GatherKind::AllGather { outputs, count } | GatherKind::Gather { outputs, count, .. } => {
            let bytes = count * dtype.size();
            (
                own(input, bytes),
                Side::List {
                    ptrs: outputs,
                    bytes,
                },
            )
        }
        GatherKind::AllGatherSingle { output, count } => (
            own(input, count * dtype.size()),
            blocks(*output, even(*count, dtype), at),
        ),
        GatherKind::GatherSingle {
            output,
            count,
            root,
        } => (
            own(input, count * dtype.size()),
            if *root == at.rank {
                blocks(*output, even(*count, dtype), at)
            } else {
                Side::Absent
            },
        ),
        GatherKind::AllGatherV { output, counts } => (
            own(input, counts[at.me] * dtype.size()),
            blocks(*output, counted(counts, dtype), at),
        ),
    };
    Layout::Apart { input, output }
}

/// Broadcast in place on one buffer; scatter every rank's block in (on the
/// root only), this rank's out.
#[inline(always)]
fn scatter(s: &Scatter) -> Layout<'_> {
    let bytes = s.count * s.dtype.size();
    match &s.kind {
        ScatterKind::Broadcast { buf } => Layout::One(Span::new(*buf, bytes), Use::InOut),
        ScatterKind::Scatter { output, inputs } => Layout::Apart {
            input: Side::List {
                ptrs: inputs,
                bytes,
            },
            output: own(*output, bytes),
        },
    }
}

/// The all-to-alls: every rank's block in and out.
#[inline(always)]
fn all_to_all(a: &AllToAll, at: At) -> Layout<'_> {
    let dtype = a.dtype;
    let (input, output) = match &a.kind {
        AllToAllKind::AllToAll {
            outputs,
            inputs,
            count,
        } => {
            let bytes = count * dtype.size();
            (
                Side::List {
                    ptrs: inputs,
                    bytes,
                },
                Side::List {
                    ptrs: outputs,
                    bytes,
                },
            )
        }
        AllToAllKind::AllToAllSingle {
            output,
            input,
            count,
        } => (
            blocks(*input, even(*count, dtype), at),
            blocks(*output, even(*count, dtype), at),
        ),
        AllToAllKind::AllToAllVSingle {
            output,
            output_counts,
            input,
            input_counts,
        } => (
            blocks(*input, counted(input_counts, dtype), at),
            blocks(*output, counted(output_counts, dtype), at),
        ),
    };
    Layout::Apart { input, output }
}
