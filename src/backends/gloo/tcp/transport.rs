//! Gloo over TCP as a host transport, the last of the comm's table: it
//! carries every operation (one rank alone: locally), and refusals
//! through the comm's store. Each Gloo tag of a collective carries the
//! hash of its signature (see [`tag_salt`]), set around the call.

use super::GlooTcp;
use crate::backends::gloo::signature::tag_salt;
use crate::backends::host_executor::on_progress_thread;
use crate::backends::transport::{Call, Transport};
use crate::error::{Error, ErrorKind, Result};
use crate::op::{AllToAll, Gather, P2p, Reduction, Refusal, Scatter};
use crate::util::lock;

impl Transport for GlooTcp {
    fn name(&self) -> &'static str {
        "gloo"
    }

    fn carries(&self) -> String {
        match self.size {
            1 => "every operation (one rank: locally)".into(),
            _ => "every operation (Gloo over TCP)".into(),
        }
    }

    /// A failure that leaves the context out of step closes it (see
    /// `GlooTcp::fail`); every other failure came before any message.
    fn keeps_step(&self, _: ErrorKind) -> bool {
        self.is_open()
    }

    unsafe fn reduction(&self, r: &Reduction, call: &Call) -> Option<Result<()>> {
        Some(self.collective(call, || self.gloo_reductions(r, call.deadline)))
    }

    unsafe fn gather(&self, g: &Gather, call: &Call) -> Option<Result<()>> {
        Some(self.collective(call, || self.gloo_gathers(g, call.deadline)))
    }

    unsafe fn scatter(&self, s: &Scatter, call: &Call) -> Option<Result<()>> {
        Some(self.collective(call, || self.gloo_scatters(s, call.deadline)))
    }

    unsafe fn all_to_all(&self, a: &AllToAll, call: &Call) -> Option<Result<()>> {
        Some(self.collective(call, || self.gloo_all_to_alls(a, call.deadline)))
    }

    fn barrier(&self, call: &Call) -> Option<Result<()>> {
        Some(self.collective(call, || self.gloo_barrier(call.deadline)))
    }

    unsafe fn point_to_point(&self, transfers: &[P2p], call: &Call) -> Option<Result<()>> {
        let result = self.salted(call, || self.p2p(transfers, call.deadline));
        Some(result.inspect_err(|e| {
            if e.kind == ErrorKind::OutOfMemory {
                // A peer's matching call would wait until its timeout.
                (call.out_of_step)(e)
            }
        }))
    }

    fn refuse(&self, refusal: &Refusal, call: &Call) -> Option<Result<()>> {
        Some(self.refuse_through_store(refusal, call))
    }

    /// Closes the context, which fails the peers' transfers with this rank.
    fn abort(&self, why: &Error) {
        self.close(why);
    }
}

impl GlooTcp {
    /// `run` with the tag salt of `call`'s operation set, and Gloo's
    /// network thread under SCHED_BATCH while the operation runs on its
    /// caller's thread: woken by a peer's reply while that thread still
    /// held the pair's lock mid-send, a network thread on the same CPU
    /// took it, found the lock taken (Gloo then skips the socket's events,
    /// which epoll reports again at once) and polled until its time slice
    /// ended (3.6 ms a small collective, ranks bound one per core). On the
    /// progress thread the default policy: there the network thread's
    /// wake-ups must preempt the application's computation, or wait for
    /// a time slice each.
    fn salted(&self, call: &Call, run: impl FnOnce() -> Result<()>) -> Result<()> {
        if let Some(ctx) = &self.ctx {
            ctx.network_thread_batch(!on_progress_thread());
        }
        lock(&self.seqs).salt = tag_salt(call.op);
        let result = run();
        lock(&self.seqs).salt = 0;
        result
    }

    /// A collective over Gloo: scratch memory that ran out on this rank is
    /// told to the peers as a refusal.
    fn collective(&self, call: &Call, run: impl FnOnce() -> Result<()>) -> Result<()> {
        match self.salted(call, run) {
            Err(e) if e.kind == ErrorKind::OutOfMemory => Err(self.refuse_out_of_memory(call, e)),
            result => result,
        }
    }

    /// A collective whose scratch memory ran out on this rank over Gloo:
    /// the peers wait only for its messages, so it is told to them as a
    /// refusal (see [`GlooTcp::refuse_through_store`]): they fail within
    /// about a second naming this rank and the allocation, never pairing
    /// this call with this rank's next one.
    #[cold]
    fn refuse_out_of_memory(&self, call: &Call, error: Error) -> Error {
        let error = error.context(call.op.name());
        let refusal = Refusal {
            call: call.op.name(),
            rank: self.rank,
            error: error.clone(),
        };
        match self.refuse_through_store(&refusal, call) {
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

    /// A refusal told through the comm's store (see
    /// [`crate::backends::gloo::failure::FailureReports::refuse`]); a
    /// partial one closes the context and breaks the comm.
    fn refuse_through_store(&self, refusal: &Refusal, call: &Call) -> Result<()> {
        let close = |e: &Error| {
            self.close(e);
            (call.out_of_step)(e)
        };
        self.reports.refuse(refusal, call.deadline, &close)
    }
}
