//! Shared memory as a host transport, when every rank of the comm is on
//! this host: the collectives through its [`engine`] (segments, syncs,
//! waits), point-to-point through the engine's rings unless switched off. Every collective carries its
//! fingerprint in its first sync, so ranks that call different operations
//! fail at that sync, all of them, naming the rank that differs.

mod engine;
mod families;

use super::memory::local_transfers;
use super::signature::{self, describe_fingerprint, fingerprint, FAILED_ALONE};
use crate::backends::transport::{Call, Transport};
use crate::error::{Error, ErrorKind, Result};
use crate::op::{AllToAll, Gather, P2p, Reduction, Refusal, Scatter};
use crate::util::Deadline;
pub(super) use engine::is_off;
use engine::{IntraHost, SyncAll, Transfer};

pub(super) struct SharedMemory {
    engine: IntraHost,
}

impl SharedMemory {
    /// Sets up shared memory among the comm's ranks when every rank can
    /// map every other's segment (collective through `all_gather`; see
    /// [`IntraHost::setup`]); `p2p_wanted`: this rank's choice of
    /// point-to-point through the rings. None: not every rank is on this
    /// host, or one switched it off.
    pub(super) fn setup(
        rank: usize,
        size: usize,
        label: &str,
        p2p_wanted: bool,
        all_gather: &dyn Fn(&[u64]) -> Result<Vec<u64>>,
    ) -> Result<Option<SharedMemory>> {
        let engine = IntraHost::setup(
            rank,
            size,
            label,
            p2p_wanted,
            describe_fingerprint,
            all_gather,
        )?;
        Ok(engine.map(|engine| SharedMemory { engine }))
    }

    /// Whether point-to-point goes through the rings.
    #[inline]
    pub(super) fn has_p2p(&self) -> bool {
        self.engine.has_p2p()
    }

    /// Completes `p` (a send or receive to another rank) now when no peer
    /// has to act first (see [`IntraHost::transfer_at_once`]); None, with
    /// nothing done, when it would wait.
    ///
    /// # Safety
    /// `p`'s buffer is valid for its bytes until this returns.
    pub(super) unsafe fn transfer_at_once(&self, p: &P2p) -> Option<Result<()>> {
        let mismatch = self.engine.transfer_at_once(&transfer(p))?;
        Some(match mismatch {
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(Error::invalid_usage(why)),
            Err(e) => Err(e),
        })
    }

    /// Runs `ops` (sends and receives to other ranks, each an operation of
    /// its own) together, telling `done(i, outcome)` of op `i` as soon as
    /// it completed (see [`IntraHost::point_to_point_each`]). On an
    /// error, the ops not told did not complete.
    ///
    /// # Safety
    /// Every buffer is valid for its bytes until its op is told, or until
    /// this returns.
    pub(super) unsafe fn point_to_point_each(
        &self,
        ops: &[&P2p],
        d: &Deadline,
        alive: &dyn Fn() -> Result<()>,
        done: &mut dyn FnMut(usize, Result<()>),
    ) -> Result<()> {
        let transfers: Vec<Transfer> = ops.iter().map(|p| transfer(p)).collect();
        self.engine
            .point_to_point_each(&transfers, d, alive, &mut |i, mismatch| {
                done(
                    i,
                    mismatch.map_or(Ok(()), |why| Err(Error::invalid_usage(why))),
                )
            })
    }

    /// Runs `call`'s collective with `run`, the shared-memory form of its
    /// family. Every collective has one, so every rank makes the same
    /// choice: buffers that overlap in a way the chunked copies would
    /// break go through a private copy instead.
    ///
    /// # Safety
    /// As for the family methods of [`Transport`].
    #[inline(always)]
    unsafe fn collective(
        &self,
        call: &Call,
        run: impl FnOnce(&IntraHost, &SyncAll) -> Result<()>,
    ) -> Option<Result<()>> {
        let ih = &self.engine;
        let d = call.deadline;
        // The operation's first sync publishes and checks its fingerprint
        // (a reference handed on once: nothing moved per sync).
        let fp = fingerprint(call.op);
        let first = std::cell::Cell::new(fp.as_ref());
        let sync = |what: &str| ih.sync(what, first.take(), d, call.alive);
        let result = run(ih, &sync);
        // An operation that never synced (nothing to move, or an error
        // before its first transfer) still meets the other ranks' first
        // sync, so that they stay in step and see a mismatch; an error
        // shows as a call of its own that fails every rank.
        if let Some(&fp) = first.take() {
            let fp = match result {
                Ok(()) => fp,
                Err(_) => signature::Fingerprint {
                    op: FAILED_ALONE,
                    ..Default::default()
                },
            };
            let synced = ih.sync(call.op.name(), Some(&fp), d, call.alive);
            return Some(result.and(synced));
        }
        // Memory that ran out after the first sync (chunk-sized buffers
        // only: the caller-sized ones come before it) leaves this rank out
        // of step, as any failure mid-operation.
        if let Err(e) = &result {
            if e.kind == ErrorKind::OutOfMemory {
                (call.out_of_step)(e);
            }
        }
        Some(result)
    }
}

/// `p` as the engine takes it.
fn transfer(p: &P2p) -> Transfer {
    Transfer {
        is_send: p.is_send,
        peer: match p.is_any_source() {
            true => engine::ANY,
            false => p.peer as usize,
        },
        source: p
            .source
            .as_ref()
            .map_or(std::ptr::null(), |s| s as *const _),
        tag: p.tag,
        buf: p.buf.as_u8(),
        count: p.count,
        dtype: p.dtype,
    }
}

impl Transport for SharedMemory {
    fn name(&self) -> &'static str {
        "shared memory"
    }

    fn carries(&self) -> String {
        match self.engine.has_p2p() {
            true => "every operation".into(),
            false => "every collective (point-to-point switched off)".into(),
        }
    }

    /// Caller-sized allocations and unsupported calls fail before any sync,
    /// and calls that differ fail at the same sync on every rank: all leave
    /// the ranks in step.
    fn keeps_step(&self, kind: ErrorKind) -> bool {
        matches!(
            kind,
            ErrorKind::InvalidUsage
                | ErrorKind::InvalidArgument
                | ErrorKind::Unsupported
                | ErrorKind::OutOfMemory
        )
    }

    #[inline(always)]
    unsafe fn reduction(&self, r: &Reduction, call: &Call) -> Option<Result<()>> {
        self.collective(call, |ih, sync| families::reduction(ih, r, sync))
    }

    #[inline(always)]
    unsafe fn gather(&self, g: &Gather, call: &Call) -> Option<Result<()>> {
        self.collective(call, |ih, sync| families::gather(ih, g, sync))
    }

    #[inline(always)]
    unsafe fn scatter(&self, s: &Scatter, call: &Call) -> Option<Result<()>> {
        self.collective(call, |ih, sync| families::scatter(ih, s, sync))
    }

    #[inline(always)]
    unsafe fn all_to_all(&self, a: &AllToAll, call: &Call) -> Option<Result<()>> {
        self.collective(call, |ih, sync| families::all_to_all(ih, a, sync))
    }

    #[inline(always)]
    fn barrier(&self, call: &Call) -> Option<Result<()>> {
        // SAFETY: a barrier moves no caller memory.
        unsafe { self.collective(call, |_, sync| sync("barrier")) }
    }

    /// Through the rings (see `engine::p2p`); transfers to self as on
    /// every transport.
    unsafe fn point_to_point(&self, ops: &[P2p], call: &Call) -> Option<Result<()>> {
        let ih = &self.engine;
        if !ih.has_p2p() {
            return None;
        }
        let me = ih.rank() as i32;
        let mut errors: Vec<String> = Vec::new();
        local_transfers(me, ops, &mut errors);
        // A single send or receive (the latency-bound case) allocates nothing.
        let (one, many): ([Transfer; 1], Vec<Transfer>);
        let remote: &[Transfer] = match ops {
            [o] if o.peer != me => {
                one = [transfer(o)];
                &one
            }
            _ => {
                many = ops.iter().filter(|o| o.peer != me).map(transfer).collect();
                &many
            }
        };
        if !remote.is_empty() {
            if let Err(e) = (call.alive)() {
                return Some(Err(e));
            }
            match ih.point_to_point(remote, call.deadline, call.alive) {
                Ok(found) => errors.extend(found),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(match errors.is_empty() {
            true => Ok(()),
            false => Err(Error::invalid_usage(errors.join("; "))),
        })
    }

    /// One sync that fails every other rank's call with the reason, all
    /// ranks staying in step.
    fn refuse(&self, refusal: &Refusal, call: &Call) -> Option<Result<()>> {
        let told = refusal.told();
        let result = self.engine.refuse(&told, call.deadline, call.alive);
        if let Err(e) = &result {
            (call.out_of_step)(e);
        }
        Some(result)
    }

    fn abort(&self, _why: &Error) {
        self.engine.wake_self();
    }
}
