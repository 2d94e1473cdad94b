//! One constructor per operation, its arguments in the order of the C
//! call's (`Op::all_reduce(buf, count, dtype, op)` builds the
//! [`Reduction`] an all-reduce is).

use super::{
    AllToAll, AllToAllKind, Gather, GatherKind, Op, P2p, PointToPoint, Ptr, Reduction,
    ReductionKind, Scatter, ScatterKind,
};
use crate::types::{DType, ReduceOp};

impl Op {
    /// A send of `count` elements to `peer`.
    pub fn send(buf: Ptr, count: usize, dtype: DType, peer: i32, tag: u32) -> Op {
        Op::PointToPoint(PointToPoint::One(P2p {
            is_send: true,
            buf,
            count,
            dtype,
            peer,
            tag,
            source: None,
        }))
    }

    /// A receive of `count` elements from `peer` ([`super::ANY_SOURCE`]:
    /// from any other rank, the sender told through its source slot).
    pub fn recv(buf: Ptr, count: usize, dtype: DType, peer: i32, tag: u32) -> Op {
        Op::PointToPoint(PointToPoint::One(P2p {
            is_send: false,
            buf,
            count,
            dtype,
            peer,
            tag,
            source: (peer == super::ANY_SOURCE).then(super::SourceSlot::new),
        }))
    }

    /// A receive of `count` elements with tag `tag` from any other rank,
    /// and the slot that tells its sender once it completed.
    pub fn recv_any(buf: Ptr, count: usize, dtype: DType, tag: u32) -> (Op, super::SourceSlot) {
        let op = Op::recv(buf, count, dtype, super::ANY_SOURCE, tag);
        let slot = match &op {
            Op::PointToPoint(PointToPoint::One(P2p {
                source: Some(s), ..
            })) => s.clone(),
            _ => super::SourceSlot::new(),
        };
        (op, slot)
    }

    /// Sends and receives issued together.
    pub fn batch(ops: Vec<P2p>) -> Op {
        Op::PointToPoint(PointToPoint::Batch(ops))
    }

    pub fn broadcast(buf: Ptr, count: usize, dtype: DType, root: i32) -> Op {
        Op::Scatter(Scatter {
            dtype,
            count,
            root,
            kind: ScatterKind::Broadcast { buf },
        })
    }

    pub fn scatter(output: Ptr, inputs: Vec<Ptr>, count: usize, dtype: DType, root: i32) -> Op {
        Op::Scatter(Scatter {
            dtype,
            count,
            root,
            kind: ScatterKind::Scatter { output, inputs },
        })
    }

    pub fn reduce(buf: Ptr, count: usize, dtype: DType, root: i32, op: ReduceOp) -> Op {
        let kind = ReductionKind::Reduce { buf, count, root };
        Op::Reduction(Reduction { dtype, op, kind })
    }

    pub fn all_reduce(buf: Ptr, count: usize, dtype: DType, op: ReduceOp) -> Op {
        let kind = ReductionKind::AllReduce { buf, count };
        Op::Reduction(Reduction { dtype, op, kind })
    }

    pub fn reduce_scatter(
        output: Ptr,
        inputs: Vec<Ptr>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Op {
        let kind = ReductionKind::ReduceScatter {
            output,
            inputs,
            count,
        };
        Op::Reduction(Reduction { dtype, op, kind })
    }

    pub fn reduce_scatter_single(
        output: Ptr,
        input: Ptr,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Op {
        let kind = ReductionKind::ReduceScatterSingle {
            output,
            input,
            count,
        };
        Op::Reduction(Reduction { dtype, op, kind })
    }

    pub fn reduce_scatter_v(
        output: Ptr,
        input: Ptr,
        counts: Vec<usize>,
        dtype: DType,
        op: ReduceOp,
    ) -> Op {
        let kind = ReductionKind::ReduceScatterV {
            output,
            input,
            counts,
        };
        Op::Reduction(Reduction { dtype, op, kind })
    }

    pub fn all_gather(outputs: Vec<Ptr>, input: Ptr, count: usize, dtype: DType) -> Op {
        let kind = GatherKind::AllGather { outputs, count };
        Op::Gather(Gather { dtype, input, kind })
    }

    pub fn all_gather_single(output: Ptr, input: Ptr, count: usize, dtype: DType) -> Op {
        let kind = GatherKind::AllGatherSingle { output, count };
        Op::Gather(Gather { dtype, input, kind })
    }

    pub fn all_gather_v(output: Ptr, input: Ptr, counts: Vec<usize>, dtype: DType) -> Op {
        let kind = GatherKind::AllGatherV { output, counts };
        Op::Gather(Gather { dtype, input, kind })
    }

    pub fn gather(outputs: Vec<Ptr>, input: Ptr, count: usize, dtype: DType, root: i32) -> Op {
        let kind = GatherKind::Gather {
            outputs,
            count,
            root,
        };
        Op::Gather(Gather { dtype, input, kind })
    }

    pub fn gather_single(output: Ptr, input: Ptr, count: usize, dtype: DType, root: i32) -> Op {
        let kind = GatherKind::GatherSingle {
            output,
            count,
            root,
        };
        Op::Gather(Gather { dtype, input, kind })
    }

    pub fn all_to_all(outputs: Vec<Ptr>, inputs: Vec<Ptr>, count: usize, dtype: DType) -> Op {
        let kind = AllToAllKind::Lists {
            outputs,
            inputs,
            count,
        };
        Op::AllToAll(AllToAll { dtype, kind })
    }

    pub fn all_to_all_single(output: Ptr, input: Ptr, count: usize, dtype: DType) -> Op {
        let kind = AllToAllKind::Single {
            output,
            input,
            count,
        };
        Op::AllToAll(AllToAll { dtype, kind })
    }

    pub fn all_to_all_v_single(
        output: Ptr,
        output_counts: Vec<usize>,
        input: Ptr,
        input_counts: Vec<usize>,
        dtype: DType,
    ) -> Op {
        let kind = AllToAllKind::VSingle {
            output,
            output_counts,
            input,
            input_counts,
        };
        Op::AllToAll(AllToAll { dtype, kind })
    }
}
