//! The operations tc-perf measures and what nccl-tests says about each.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
    Gather,
    Scatter,
    Barrier,
}

impl Coll {
    pub(crate) fn parse(s: &str) -> Option<Coll> {
        Some(match s {
            "all_reduce" | "allreduce" => Coll::AllReduce,
            "all_gather" | "allgather" => Coll::AllGather,
            "reduce_scatter" | "reducescatter" => Coll::ReduceScatter,
            "broadcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "all_to_all" | "alltoall" => Coll::AllToAll,
            "sendrecv" => Coll::SendRecv,
            "gather" => Coll::Gather,
            "scatter" => Coll::Scatter,
            "barrier" => Coll::Barrier,
            _ => return None,
        })
    }
    pub(crate) fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "all_to_all",
            Coll::SendRecv => "sendrecv",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::Barrier => "barrier",
        }
    }
    pub(crate) fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }
    pub(crate) fn rooted(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }
    /// The size names the whole n-rank buffer (each rank holds size / n).
    pub(crate) fn size_is_total(self) -> bool {
        matches!(
            self,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter
        )
    }
    pub(crate) fn has_out_of_place(self) -> bool {
        matches!(
            self,
            Coll::AllGather
                | Coll::ReduceScatter
                | Coll::AllToAll
                | Coll::SendRecv
                | Coll::Gather
                | Coll::Scatter
        )
    }
    pub(crate) fn has_in_place(self) -> bool {
        matches!(
            self,
            Coll::AllReduce
                | Coll::AllGather
                | Coll::ReduceScatter
                | Coll::Broadcast
                | Coll::Reduce
                | Coll::AllToAll
        )
    }
    /// nccl-tests' bus bandwidth factor.
    pub(crate) fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather
            | Coll::ReduceScatter
            | Coll::AllToAll
            | Coll::Gather
            | Coll::Scatter => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv | Coll::Barrier => 1.0,
        }
    }
}
