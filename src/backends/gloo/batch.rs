//! Sends and receives to other ranks through the shared-memory rings, each
//! an operation of its own, run together by the progress thread or a
//! waiter (see [`crate::backends::host_executor::HostBackend::run_batch`]):
//! a window of non-blocking receives posted before their messages arrive
//! is one pass over the rings instead of one job per receive, each
//! receive completing as soon as its message is in.
//!
//! Operations run in issue order, so a later one may rely on an earlier
//! one's outcome: two transfers run together only when neither touches
//! bytes the other writes, except receives from one peer with one tag,
//! which match their messages (and write them) in order anyway.

use super::GlooBackend;
use crate::backends::transport::Transport;
use crate::error::Result;
use crate::op::{Op, P2p, PointToPoint};
use crate::util::Deadline;
use std::time::Duration;

impl GlooBackend {
    /// `op`'s transfer when it is a send or receive alone to another rank,
    /// through the shared-memory rings. Not a receive from any source:
    /// it never runs at once nor with others, as its match depends on
    /// which peer's message comes first (it runs alone, in issue order).
    #[inline]
    pub(super) fn ring_transfer<'a>(&self, op: &'a Op) -> Option<&'a P2p> {
        match op {
            Op::PointToPoint(PointToPoint::One(p)) => (p.peer != self.rank
                && !p.is_any_source()
                && self.routes.shared_memory_p2p().is_some())
            .then_some(p),
            _ => None,
        }
    }

    /// Whether transfer `later` may run together with `earlier` (see
    /// above).
    pub(super) fn transfers_independent(&self, earlier: &Op, later: &Op) -> bool {
        let (Some(a), Some(b)) = (self.ring_transfer(earlier), self.ring_transfer(later)) else {
            return false;
        };
        let bytes = |p: &P2p| {
            let start = p.buf.as_u8() as usize;
            start..start + p.count * p.dtype.size()
        };
        let (x, y) = (bytes(a), bytes(b));
        let overlap = x.start < y.end && y.start < x.end;
        let in_order = !a.is_send && !b.is_send && a.peer == b.peer && a.tag == b.tag;
        !overlap || (a.is_send && b.is_send) || in_order
    }

    /// Runs `ops` (each a [`GlooBackend::ring_transfer`]) together within
    /// `timeout`, telling `done` of each as it completes; on a failure
    /// (a lost peer, the timeout, an abort), every op not completed fails
    /// with it, as the one that would have waited for it.
    pub(super) fn run_transfers_together(
        &self,
        ops: &[&Op],
        timeout: Duration,
        done: &mut dyn FnMut(usize, Result<()>),
    ) {
        let transfers: Option<Vec<&P2p>> = ops.iter().map(|op| self.ring_transfer(op)).collect();
        let (Some(transfers), Some(shm)) = (transfers, self.routes.shared_memory_p2p()) else {
            for (i, op) in ops.iter().enumerate() {
                done(
                    i,
                    crate::backends::host_executor::HostBackend::run(
                        self,
                        op,
                        &Deadline::after(timeout),
                    ),
                );
            }
            return;
        };
        if let Err(e) = self.check_not_broken() {
            for i in 0..ops.len() {
                done(i, Err(e.clone()));
            }
            return;
        }
        let seqs: Vec<u64> = ops.iter().map(|_| self.reports.next_op()).collect();
        let d = Deadline::after(timeout);
        let alive = || self.check_not_broken();
        let mut told = vec![false; ops.len()];
        // SAFETY: the comm validated every buffer against its count, and
        // each caller keeps its buffer alive until its work completes.
        let result = unsafe {
            shm.point_to_point_each(&transfers, &d, &alive, &mut |i, outcome| {
                told[i] = true;
                done(i, outcome);
            })
        };
        let Err(e) = result else {
            return;
        };
        if !shm.keeps_step(e.kind) {
            self.mark_broken(&e);
        }
        let Some(first) = told.iter().position(|t| !t) else {
            return;
        };
        let e = self.failed(ops[first], seqs[first], e);
        for i in (first..ops.len()).filter(|i| !told[*i]) {
            done(i, Err(e.clone()));
        }
    }
}
