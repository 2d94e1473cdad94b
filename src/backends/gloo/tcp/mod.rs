//! Gloo over TCP: the host transport that carries every operation of a
//! comm among all its ranks, the last of the comm's table (see
//! [`super::routes`]).
//!
//! The Gloo calls live in a separate module, `libtorchcomm-gloo.so` (see
//! [`shim`]), loaded on first use so that programs that never use the gloo
//! backend need no Gloo. Operations run one at a time on the comm's
//! progress thread, in issue order, so every rank allocates the same
//! sequence of Gloo tags (one per Gloo call, never reused while in flight).
//!
//! Safety rails around traps of this Gloo build:
//! - a size mismatch between ranks makes Gloo terminate the receiving
//!   process, so sizes are agreed before every transfer whose sizes could
//!   differ: each point-to-point send through Gloo carries a descriptor
//!   (count, dtype, bytes) that its receive takes first, and the per-rank
//!   counts of the v-variants are all-gathered and compared first; with
//!   `TORCHCOMM_CHECK_COLLECTIVES=1` every collective first all-gathers (op,
//!   dtype, count, root, reduce op) and fails on all ranks, naming the rank
//!   that differs;
//! - without that check, ranks that call different collectives would send
//!   messages of the wrong size, which makes Gloo's network thread throw
//!   (uncatchable: the process terminates), or of the right size with the
//!   wrong meaning (silently wrong results): every Gloo tag of a collective
//!   carries a hash of its signature, so such ranks exchange nothing and
//!   fail at the timeout, told to enable the check;
//! - after a timeout or a vanished peer the context is closed (Gloo closes
//!   it on timeouts anyway), which makes the peers fail fast too; the comm
//!   breaks (see [`GlooTcp::keeps_step`]) and later operations fail at once;
//! - Gloo has no gatherv and no reduce-scatter: reduce-scatter is one
//!   all-to-all (block r to rank r) followed by a local reduction of the
//!   received blocks in rank order; the list forms go through contiguous
//!   scratch buffers.

mod buffered_sends;
mod collectives;
mod connect;
mod families;
mod p2p;
pub mod shim;
mod store_bridge;
mod transport;

use super::failure::{FailureReports, Unusable};
use super::signature::{describe_sig, signature_words};
use crate::error::{Error, ErrorKind, Result};
use crate::util::{lock, Deadline};
use std::sync::{Arc, Mutex};

pub(super) use connect::ContextOptions;

const SLOT_PREFIX_P2P: u64 = 0x40;
/// A send's descriptor (count, dtype, bytes), see `buffered_sends`.
const SLOT_KIND_DESC: u64 = 1;
const SLOT_KIND_DATA: u64 = 3;
/// Added to a slot kind for transfers with a non-zero tag (see
/// `GlooTcp::slot`).
const SLOT_KIND_TAGGED: u64 = 3;
const HELLO_MAGIC: u64 = 0x7463_676c_6f6f_0001; // "tcgloo" v1

struct Seqs {
    /// Counts Gloo calls of collectives (the same on every rank): the low
    /// [`super::signature::TAG_COUNTER_BITS`] of each call's tag.
    tag: u32,
    /// The rest of the tag: a hash of the running collective's signature
    /// (see [`super::signature::tag_salt`]), 0 outside collectives.
    salt: u32,
    /// Next sequence number of a send to / receive from each peer.
    send: Vec<u64>,
    recv: Vec<u64>,
    /// The same for tagged transfers: (is_send, peer, tag) -> next number.
    tagged: std::collections::HashMap<(bool, i32, u32), u64>,
}

/// Gloo over TCP among a comm's ranks.
pub(super) struct GlooTcp {
    rank: i32,
    size: i32,
    name: String,
    /// Sends whose Gloo posts were not waited for yet: declared before
    /// `ctx`, so dropped before it.
    buffered: buffered_sends::BufferedSends,
    /// None for a world of one rank, where every operation is local.
    ctx: Option<shim::Context>,
    seqs: Mutex<Seqs>,
    /// Set once the context is unusable (peer failure, timeout, abort).
    closed: Unusable,
    check_collectives: bool,
    /// How each peer's address appears in this rank's Gloo messages (the
    /// peer's local address of its connection to this rank).
    peer_addresses: Vec<String>,
    /// The address selection of the context, reused by windows.
    options: ContextOptions,
    /// The comm's failure reports, through which refusals are told.
    reports: Arc<FailureReports>,
}

impl GlooTcp {
    /// The rank whose address the message names, if any.
    fn peer_in_message(&self, message: &str) -> Option<i32> {
        self.peer_addresses
            .iter()
            .position(|a| !a.is_empty() && message.contains(a.as_str()))
            .map(|j| j as i32)
    }

    fn next_tag(&self) -> u32 {
        let mut s = lock(&self.seqs);
        let t = s.tag | s.salt << super::signature::TAG_COUNTER_BITS;
        s.tag = (s.tag + 1) % (1 << super::signature::TAG_COUNTER_BITS);
        s.tag = s.tag.max(1);
        t
    }

    fn ctx(&self) -> &shim::Context {
        self.ctx.as_ref().expect("gloo context exists for size > 1")
    }

    /// Whether every collective first compares the ranks' calls
    /// (`TORCHCOMM_CHECK_COLLECTIVES`, agreed at creation).
    pub(super) fn checks_collectives(&self) -> bool {
        self.check_collectives
    }

    /// How the context chose its addresses, for the windows' contexts.
    pub(super) fn options(&self) -> &ContextOptions {
        &self.options
    }

    /// Whether its context is still usable (a failure that closed it left
    /// this rank out of step with its peers).
    pub(super) fn is_open(&self) -> bool {
        !self.closed.is_set()
    }

    fn check_open(&self) -> Result<()> {
        self.closed.check(&self.name)
    }

    /// Closes the context once (`why`: the first reason), so that blocked
    /// peers fail now rather than at their timeout.
    fn close(&self, why: &Error) {
        if let (true, Some(ctx)) = (self.closed.record(why), &self.ctx) {
            ctx.close();
        }
    }

    /// Converts a shim failure of `what` into an error; failures that leave
    /// the context unusable close it (and so break the comm).
    fn fail(&self, what: &str, e: shim::CallError) -> Error {
        let peer = e
            .peer
            .or_else(|| self.peer_in_message(&e.message))
            .map(|p| format!(" (peer rank {p})"))
            .unwrap_or_default();
        let kind = e.kind();
        let hint = match kind {
            ErrorKind::Timeout => "; a peer is slow, stopped or gone",
            ErrorKind::Remote => "; a peer failed or closed its connection",
            _ => "",
        };
        let err = Error::new(
            kind,
            format!(
                "gloo {what} on rank {}{peer}: {}{hint}",
                self.rank, e.message
            ),
        );
        if matches!(
            kind,
            ErrorKind::Timeout | ErrorKind::Remote | ErrorKind::Internal
        ) {
            self.close(&err);
        }
        err
    }

    /// Every rank's `mine` (the same length on every rank), in rank order.
    pub(super) fn all_gather_words(
        &self,
        mine: &[u64],
        d: &Deadline,
        what: &str,
    ) -> Result<Vec<u64>> {
        let n = self.size as usize;
        let mut all = vec![0u64; mine.len() * n];
        if n == 1 {
            all.copy_from_slice(mine);
            return Ok(all);
        }
        let tag = self.next_tag();
        let t = d.left()?;
        // SAFETY: both buffers are sized for the call.
        unsafe {
            self.ctx().allgather(
                mine.as_ptr() as *const u8,
                all.as_mut_ptr() as *mut u8,
                std::mem::size_of_val(mine),
                tag,
                t,
            )
        }
        .map_err(|e| self.fail(what, e))?;
        Ok(all)
    }

    /// With `TORCHCOMM_CHECK_COLLECTIVES`: every rank compares the
    /// collective `op` it called with every other rank's.
    pub(super) fn check_collective(&self, op: &crate::op::Op, d: &Deadline) -> Result<()> {
        let Some(sig) = signature_words(op) else {
            return Ok(());
        };
        let mine = [sig[0], sig[1], sig[2], sig[3], sig[4], 0, 0, 0];
        let all = self.all_gather_words(&mine, d, "collective check")?;
        let me = self.rank as usize;
        for (r, theirs) in all.chunks(8).enumerate() {
            if theirs != mine {
                return Err(Error::invalid_usage(format!(
                    "TORCHCOMM_CHECK_COLLECTIVES: rank {me} called {} but rank {r} called {}",
                    describe_sig(&mine),
                    describe_sig(theirs)
                )));
            }
        }
        Ok(())
    }

    /// All ranks must pass the same per-rank counts to a v-variant.
    fn agree_counts(&self, what: &str, counts: &[usize], d: &Deadline) -> Result<()> {
        let mine: Vec<u64> = counts.iter().map(|c| *c as u64).collect();
        let all = self.all_gather_words(&mine, d, what)?;
        for (r, theirs) in all.chunks(mine.len()).enumerate() {
            if theirs != mine.as_slice() {
                return Err(Error::invalid_usage(format!(
                    "{what}: ranks disagree on the per-rank counts: rank {} has {:?}, rank {r} has {:?}",
                    self.rank, mine, theirs
                )));
            }
        }
        Ok(())
    }
}

// Raw pointers inside operations are only dereferenced on the progress
// thread; the context's own `close` may come from another (see `shim`).
unsafe impl Send for GlooTcp {}
unsafe impl Sync for GlooTcp {}
