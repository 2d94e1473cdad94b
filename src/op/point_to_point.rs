//! The point-to-point family: a send, a receive, or sends and receives
//! issued together (a batch). Each transfer is a [`P2p`].

use super::Ptr;
use crate::types::DType;

/// One send or receive (alone, or a member of a batch).
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

/// Send, receive and batch. Every member is a list of transfers
/// ([`PointToPoint::transfers`]): one for a send or a receive.
#[derive(Debug, Clone)]
pub enum PointToPoint {
    /// A send (`is_send`) or a receive, issued alone.
    One(P2p),
    /// Sends and receives issued together (NCCL group semantics).
    Batch(Vec<P2p>),
}

impl PointToPoint {
    /// The transfers: the one of a send or receive, or a batch's members.
    #[inline(always)]
    pub fn transfers(&self) -> &[P2p] {
        match self {
            PointToPoint::One(p) => std::slice::from_ref(p),
            PointToPoint::Batch(ops) => ops,
        }
    }

    /// As [`PointToPoint::transfers`], each rewritable.
    pub fn transfers_mut(&mut self) -> &mut [P2p] {
        match self {
            PointToPoint::One(p) => std::slice::from_mut(p),
            PointToPoint::Batch(ops) => ops,
        }
    }

    /// The member's [`super::Op::code`]: send, recv or batch_p2p.
    #[inline(always)]
    pub fn code(&self) -> u8 {
        match self {
            PointToPoint::One(p) if p.is_send => 0,
            PointToPoint::One(_) => 1,
            PointToPoint::Batch(_) => 2,
        }
    }

    /// The first non-zero tag, with the argument that gave it.
    pub fn nonzero_tag(&self) -> Option<(String, u32)> {
        match self {
            PointToPoint::One(p) => (p.tag != 0).then(|| ("opts.tag".into(), p.tag)),
            PointToPoint::Batch(ops) => ops
                .iter()
                .enumerate()
                .find(|(_, p)| p.tag != 0)
                .map(|(i, p)| (format!("batch[{i}].tag"), p.tag)),
        }
    }

    /// The element type all transfers share, if they do.
    pub fn dtype(&self) -> Option<DType> {
        let ops = self.transfers();
        ops.first()
            .map(|p| p.dtype)
            .filter(|d| ops.iter().all(|p| p.dtype == *d))
    }
}
