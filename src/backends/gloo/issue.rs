//! Issue: one operation to the transport that serves it. Each family of
//! operations is offered, in this order, to the hierarchy (comms across
//! hosts), shared memory (every rank on this host), UCX (when chosen
//! between hosts) and Gloo over TCP; a transport that does not serve a
//! member leaves it to the next. Each is handed the operation's family,
//! never the whole `Op` (the families over Gloo are in `over_gloo.rs`).

use super::hier::Hierarchy;
use super::intra_host::{IntraHost, SyncAll};
use super::signature::tag_salt;
use super::GlooBackend;
use crate::backends::ucx::UcxTransport;
use crate::error::{Error, ErrorKind, Result};
use crate::op::{Op, P2p};
use crate::util::{lock, Deadline};

/// How one family of operations runs on each transport (`None`: this
/// transport leaves the member to the next).
struct Paths<H, S, U, G> {
    hier: H,
    shm: S,
    ucx: U,
    gloo: G,
}

impl GlooBackend {
    pub(super) fn execute(&self, op: &Op, d: &Deadline) -> Result<()> {
        // SAFETY (every family): the comm validated every pointer against its
        // count, and the caller keeps the buffers alive until completion.
        unsafe {
            match op {
                Op::Refused(refusal) => self.refuse(refusal, d),
                Op::PointToPoint(p) => self.point_to_point(op, p.transfers(), d),
                Op::Reduction(r) => self.collective(
                    op,
                    d,
                    Paths {
                        hier: |h: &Hierarchy| h.run_reduction(self, r, d),
                        shm: |ih: &IntraHost, sync: &SyncAll| self.shm_reduction(ih, r, sync),
                        ucx: |u: &UcxTransport, alive: &dyn Fn() -> Result<()>| {
                            u.reduction(r, d, alive)
                        },
                        gloo: || self.gloo_reductions(r, d),
                    },
                ),
                Op::Gather(g) => self.collective(
                    op,
                    d,
                    Paths {
                        hier: |h: &Hierarchy| h.run_gather(g, d),
                        shm: |ih: &IntraHost, sync: &SyncAll| self.shm_gather(ih, g, sync),
                        ucx: |u: &UcxTransport, alive: &dyn Fn() -> Result<()>| {
                            u.gather(g, d, alive)
                        },
                        gloo: || self.gloo_gathers(g, d),
                    },
                ),
                Op::Scatter(s) => self.collective(
                    op,
                    d,
                    Paths {
                        hier: |h: &Hierarchy| h.run_scatter(s, d),
                        shm: |ih: &IntraHost, sync: &SyncAll| self.shm_scatter(ih, s, sync),
                        ucx: |u: &UcxTransport, alive: &dyn Fn() -> Result<()>| {
                            u.scatter(s, d, alive)
                        },
                        gloo: || self.gloo_scatters(s, d),
                    },
                ),
                Op::AllToAll(a) => self.collective(
                    op,
                    d,
                    Paths {
                        // Not hierarchical: every rank's block goes to every
                        // rank.
                        hier: |_: &Hierarchy| None,
                        shm: |ih: &IntraHost, sync: &SyncAll| self.shm_all_to_all(ih, a, sync),
                        ucx: |u: &UcxTransport, alive: &dyn Fn() -> Result<()>| {
                            u.all_to_all(a, d, alive)
                        },
                        gloo: || self.gloo_all_to_alls(a, d),
                    },
                ),
                Op::Barrier => self.collective(
                    op,
                    d,
                    Paths {
                        hier: |h: &Hierarchy| Some(h.barrier(d)),
                        shm: |_: &IntraHost, sync: &SyncAll| sync("barrier"),
                        ucx: |u: &UcxTransport, alive: &dyn Fn() -> Result<()>| {
                            Some(u.barrier(d, alive))
                        },
                        gloo: || self.gloo_barrier(d),
                    },
                ),
            }
        }
    }

    /// A collective `op` on the first transport that serves its member.
    ///
    /// # Safety
    /// As for [`GlooBackend::execute`].
    #[inline(always)]
    unsafe fn collective<H, S, U, G>(
        &self,
        op: &Op,
        d: &Deadline,
        paths: Paths<H, S, U, G>,
    ) -> Result<()>
    where
        H: FnOnce(&Hierarchy) -> Option<Result<()>>,
        S: FnOnce(&IntraHost, &SyncAll) -> Result<()>,
        U: FnOnce(&UcxTransport, &dyn Fn() -> Result<()>) -> Option<Result<()>>,
        G: FnOnce() -> Result<()>,
    {
        if self.check_collectives {
            self.check_collective(op, d)?;
        }
        if let Some(h) = &self.hier {
            if let Some(result) = (paths.hier)(h) {
                // A failed step leaves this rank out of step with the others.
                return self.broken_unless_in_step(result, false);
            }
        }
        if let Some(ih) = &self.intra {
            let result = self.intra_host_op(ih, op, d, paths.shm);
            return self.broken_unless_in_step(result, true);
        }
        if let Some(u) = &self.ucx {
            let alive = || self.check_not_broken();
            if let Some(result) = (paths.ucx)(u, &alive) {
                return self.broken_unless_in_step(result, false);
            }
        }
        lock(&self.seqs).salt = tag_salt(op);
        let result = (paths.gloo)();
        lock(&self.seqs).salt = 0;
        match result {
            Err(e) if e.kind == ErrorKind::OutOfMemory => Err(self.refuse_out_of_memory(op, e, d)),
            result => result,
        }
    }

    /// Send, receive and batch on the first transport that carries them
    /// (never hierarchical).
    ///
    /// # Safety
    /// As for [`GlooBackend::execute`].
    unsafe fn point_to_point(&self, op: &Op, transfers: &[P2p], d: &Deadline) -> Result<()> {
        if self.check_collectives {
            self.check_collective(op, d)?;
        }
        if let Some(ih) = &self.intra {
            if ih.has_p2p() {
                let result = self.shm_p2p(ih, transfers, d);
                return self.broken_unless_in_step(result, true);
            }
        }
        if let Some(u) = &self.ucx {
            let alive = || self.check_not_broken();
            let result = u.point_to_point(transfers, d, &alive);
            return self.broken_unless_in_step(result, false);
        }
        lock(&self.seqs).salt = tag_salt(op);
        let result = self.p2p(transfers, d);
        lock(&self.seqs).salt = 0;
        result.inspect_err(|e| {
            if e.kind == ErrorKind::OutOfMemory {
                // A peer's matching call would wait until its timeout.
                self.mark_broken(e)
            }
        })
    }

    /// `result` of a transport, marking the backend broken when it failed
    /// in a way that leaves this rank out of step with the others. Argument
    /// errors stay in step; on `shared` memory so do caller-sized
    /// allocations and unsupported calls, which come before any sync, and
    /// calls that differ, which all ranks find at the same sync (see
    /// `intra_host_op`).
    fn broken_unless_in_step(&self, result: Result<()>, shared: bool) -> Result<()> {
        result.inspect_err(|e| {
            let in_step = match e.kind {
                ErrorKind::InvalidUsage | ErrorKind::InvalidArgument => true,
                ErrorKind::Unsupported | ErrorKind::OutOfMemory => shared,
                _ => false,
            };
            if !in_step {
                self.mark_broken(e)
            }
        })
    }

    /// A collective whose scratch memory ran out on this rank over Gloo:
    /// the peers wait only for its messages, so it is told to them as a
    /// refusal (see [`GlooBackend::refuse`]): they fail within about a
    /// second naming this rank and the allocation, never pairing this call
    /// with this rank's next one.
    #[cold]
    fn refuse_out_of_memory(&self, op: &Op, error: Error, d: &Deadline) -> Error {
        let error = error.context(op.name());
        let refusal = crate::op::Refusal {
            call: op.name(),
            rank: self.rank,
            error: error.clone(),
        };
        match self.refuse(&refusal, d) {
            Ok(()) => error,
            Err(told) => Error::new(
                error.kind,
                format!(
                    "{}; telling the other ranks failed: {}",
                    error.message, told.message
                ),
            ),
        }
    }
}
