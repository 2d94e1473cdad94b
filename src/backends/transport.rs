//! The host transports' common interface: one method per family of
//! operations, and what a transport can do. The host backend keeps its
//! transports in one table, in order of preference, and offers each
//! operation to them in that order (see `gloo::routes`); a transport that
//! does not carry a member of a family answers `None` and the next one
//! takes it. Every rank decides alike, from the operation alone.

use crate::error::{Error, ErrorKind, Result};
use crate::op::{AllToAll, Gather, Op, P2p, Reduction, Refusal, Scatter};
use crate::util::Deadline;

/// What one operation gives the transport that runs it.
pub(crate) struct Call<'a> {
    /// The operation (its name and fingerprint; the transport is handed
    /// its family's payload beside it).
    pub op: &'a Op,
    pub deadline: &'a Deadline,
    /// Fails once the comm was aborted or broke: a transport's waits call
    /// it between polls.
    pub alive: &'a dyn Fn() -> Result<()>,
    /// Tells the comm that a failure left this rank out of step with its
    /// peers (the comm breaks), where the transport knows it better than
    /// [`Transport::keeps_step`] can from the error's kind.
    pub out_of_step: &'a dyn Fn(&Error),
}

impl<'a> Call<'a> {
    /// The same call for another operation (a step of a composed one).
    pub fn with<'b>(&'b self, op: &'b Op) -> Call<'b> {
        Call { op, ..*self }
    }

    /// The same call with another deadline.
    pub fn until<'b>(&'b self, deadline: &'b Deadline) -> Call<'b> {
        Call { deadline, ..*self }
    }
}

/// A way of moving host memory between the comm's ranks.
///
/// # Safety (every family method)
/// The comm validated every pointer of the operation against its counts,
/// and the caller keeps the buffers alive until the method returns.
pub(crate) trait Transport {
    /// Its name in the comm's transport table (logged once per comm).
    fn name(&self) -> &'static str;

    /// What it carries, for the comm's log line ("every operation",
    /// "collectives of even blocks", ...).
    fn carries(&self) -> String;

    /// Whether a failure of `kind` leaves this rank in step with its peers
    /// (the comm stays usable); any other failure breaks the comm.
    fn keeps_step(&self, kind: ErrorKind) -> bool {
        matches!(kind, ErrorKind::InvalidUsage | ErrorKind::InvalidArgument)
    }

    /// All-reduce, reduce and the reduce-scatters.
    unsafe fn reduction(&self, r: &Reduction, call: &Call) -> Option<Result<()>>;
    /// The all-gathers and gathers.
    unsafe fn gather(&self, g: &Gather, call: &Call) -> Option<Result<()>>;
    /// Broadcast and scatter.
    unsafe fn scatter(&self, s: &Scatter, call: &Call) -> Option<Result<()>>;
    /// The all-to-alls.
    unsafe fn all_to_all(&self, a: &AllToAll, call: &Call) -> Option<Result<()>>;
    fn barrier(&self, call: &Call) -> Option<Result<()>>;
    /// Sends, receives and their batches.
    unsafe fn point_to_point(&self, transfers: &[P2p], call: &Call) -> Option<Result<()>>;
    /// A collective this rank refused (see [`crate::op::Refusal`]), run in
    /// its place so that the peers fail it with the reason; Ok once they
    /// were told.
    fn refuse(&self, refusal: &Refusal, call: &Call) -> Option<Result<()>>;

    /// The comm broke (`why`) or was aborted: wakes or fails this
    /// transport's waits, so that the peers learn it before their timeout.
    fn abort(&self, why: &Error);
}

/// Offers `call.op` to `t`: its result, or `None` when `t` does not carry
/// that member.
///
/// # Safety
/// As for the family methods of [`Transport`].
#[inline(always)]
pub(crate) unsafe fn offer<T: Transport + ?Sized>(t: &T, call: &Call) -> Option<Result<()>> {
    match call.op {
        Op::Reduction(r) => t.reduction(r, call),
        Op::Gather(g) => t.gather(g, call),
        Op::Scatter(s) => t.scatter(s, call),
        Op::AllToAll(a) => t.all_to_all(a, call),
        Op::Barrier => t.barrier(call),
        Op::PointToPoint(p) => t.point_to_point(p.transfers(), call),
        Op::Refused(refusal) => t.refuse(refusal, call),
    }
}
