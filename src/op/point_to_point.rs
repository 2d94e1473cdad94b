//! The point-to-point family: a send, a receive, or sends and receives
//! issued together (a batch). Each transfer is a [`P2p`].

use super::Ptr;
use crate::types::DType;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// The peer of a receive that takes the first message of its tag from any
/// other rank (`TC_ANY_SOURCE` of the C API, as MPI_ANY_SOURCE).
pub const ANY_SOURCE: i32 = -1;

/// Where the transport that runs an any-source receive writes the rank
/// whose message it took (shared with the receive's work handle, which
/// reads it once the receive completed); [`ANY_SOURCE`] until then.
#[derive(Debug, Clone)]
pub struct SourceSlot(Arc<AtomicI32>);

impl SourceSlot {
    pub fn new() -> SourceSlot {
        SourceSlot(Arc::new(AtomicI32::new(ANY_SOURCE)))
    }

    /// The sender, once a message was matched.
    pub fn get(&self) -> Option<i32> {
        let r = self.0.load(Ordering::Acquire);
        (r >= 0).then_some(r)
    }

    pub fn set(&self, rank: i32) {
        self.0.store(rank, Ordering::Release);
    }
}

impl Default for SourceSlot {
    fn default() -> Self {
        SourceSlot::new()
    }
}

/// One send or receive (alone, or a member of a batch).
#[derive(Debug, Clone)]
pub struct P2p {
    pub is_send: bool,
    pub buf: Ptr,
    pub count: usize,
    pub dtype: DType,
    /// The other rank, or [`ANY_SOURCE`] on a receive alone.
    pub peer: i32,
    /// A send matches a receive of the same (peer, tag); 0 is the tag of
    /// every untagged call (see `tc_op_options_t.tag`).
    pub tag: u32,
    /// Set on an any-source receive: where its sender is told.
    pub source: Option<SourceSlot>,
}

impl P2p {
    /// A receive from whichever rank's send of its tag comes first.
    #[inline(always)]
    pub fn is_any_source(&self) -> bool {
        !self.is_send && self.peer == ANY_SOURCE
    }

    /// Tells an any-source receive's work that it took `rank`'s message.
    #[inline]
    pub fn matched_source(&self, rank: i32) {
        if let Some(s) = &self.source {
            s.set(rank);
        }
    }

    /// "rank N", or "any source" (logs and error messages).
    pub fn peer_name(&self) -> String {
        peer_name(self.peer)
    }

    /// Why this receive cannot take its sender's message of `count`
    /// elements of dtype code `dtype` (every transport's words alike).
    pub fn mismatch_with_send(&self, count: u64, dtype: u64) -> String {
        let name = DType::ALL.get(dtype as usize).map_or("?", |d| d.name());
        let tag = match self.tag {
            0 => String::new(),
            t => format!(" with tag {t}"),
        };
        format!(
            "receive of {} {} from {}{tag} does not match {}'s send of {count} {name} \
             (the send completed there)",
            self.count,
            self.dtype.name(),
            self.peer_name(),
            match self.is_any_source() {
                true => "a sender".to_string(),
                false => "that rank".to_string(),
            }
        )
    }

    /// [`P2p::mismatch_with_send`] for an any-source receive that took
    /// `sender`'s message (names both ranks' sides).
    pub fn mismatch_with_send_from(&self, sender: i32, count: u64, dtype: u64) -> String {
        if !self.is_any_source() {
            return self.mismatch_with_send(count, dtype);
        }
        let name = DType::ALL.get(dtype as usize).map_or("?", |d| d.name());
        let tag = match self.tag {
            0 => String::new(),
            t => format!(" with tag {t}"),
        };
        format!(
            "receive of {} {} from any source{tag} took rank {sender}'s send of {count} {name}, \
             which does not match (the send completed there)",
            self.count,
            self.dtype.name(),
        )
    }
}

/// "rank N", or "any source" for [`ANY_SOURCE`].
pub fn peer_name(peer: i32) -> String {
    match peer {
        ANY_SOURCE => "any source".into(),
        p => format!("rank {p}"),
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

    /// The first any-source receive, with the argument that gave it.
    pub fn any_source(&self) -> Option<String> {
        match self {
            PointToPoint::One(p) => p.is_any_source().then(|| "peer".into()),
            PointToPoint::Batch(ops) => ops
                .iter()
                .position(|p| p.is_any_source())
                .map(|i| format!("batch[{i}].peer")),
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
