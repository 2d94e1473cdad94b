//! The neighbour check of every collective (`fingerprint.rs` says what it
//! compares), carried so that a latency-bound collective pays no message
//! of its own for it.
//!
//! Each rank sends its right-hand neighbour one check message per
//! collective: its fingerprint, followed, when the collective's first step
//! sends that neighbour at most [`FOLD_MAX`] bytes, by that step's number
//! and message, which then travels nowhere else. On 2 ranks recursive
//! doubling's exchange goes that way, and on any number of ranks every
//! ring's first step (all_gather, reduce_scatter) and the dissemination
//! barrier's first round, so those pay no extra message. The check message
//! is the fingerprint alone (one more small message) only where no
//! first-step message goes to the right-hand neighbour (recursive doubling
//! on the odd ranks of more than 2, a broadcast's or reduce's tree beyond
//! 2 ranks, gather and scatter on most ranks), where that message is
//! larger than [`FOLD_MAX`] (copying it would cost more than the message
//! saved), and in a collective without steps (nothing to send).
//!
//! The check message has a tag of its own (the collective's number, step
//! [`STEP_CHECK`]) whatever the operation, so it always meets the
//! neighbour's receive, posted into the [`Inbox`] (room for the largest)
//! as the collective starts. A rank sends its check message in its first
//! step, before it waits for anything, and compares its left-hand
//! neighbour's before it posts any receive of its first step: a pair of
//! neighbours whose calls differ is seen by the right one whatever else
//! the calls do, and with every pair agreeing every rank called the same.
//! The receiver learns from the message itself whether a payload came and
//! for which step, then hands it to that step's receive from the left-hand
//! neighbour, so the ranks need no rule in common about which steps fold;
//! a folded payload of another length than that receive, or one that no
//! step takes, fails the call as a size mismatch.

use super::{copy, Ctx, Fingerprint, Request, FINGERPRINT_BYTES};
use crate::error::{Error, Result};

/// The largest first-step message folded into the check message: up to
/// here a copy of it on each side costs less than the message it saves
/// (over TCP loopback a 2-rank all_reduce of 16 KiB took 18.5 µs folded
/// against 28 µs not, of 64 KiB 68 against 75 µs).
pub(super) const FOLD_MAX: usize = 64 << 10;
/// A folded check message's header: the fingerprint, then the step's
/// number (u64, little-endian); the payload follows.
pub(super) const FOLD_HEADER: usize = FINGERPRINT_BYTES + 8;
/// Step number of the check message.
pub(super) const STEP_CHECK: u64 = 0xf_fff2;

/// Where the left-hand neighbour's check message lands: room for the
/// largest (8-byte aligned), kept by the transport from call to call.
pub(crate) struct Inbox(Box<[u64]>);

impl Inbox {
    pub fn new() -> Inbox {
        Inbox(vec![0u64; (FOLD_HEADER + FOLD_MAX).div_ceil(8)].into_boxed_slice())
    }

    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the words' bytes, read as bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.0.len() * 8) }
    }
}

/// This rank's side of one collective's check.
pub(super) struct Check<'a> {
    mine: Fingerprint,
    /// The check message is still to send (by the first step, else by
    /// [`Ctx::finish_check`]).
    unsent: bool,
    /// The left-hand neighbour's check message on its way, until compared.
    pending: Option<Request>,
    /// Compared and equal, with a payload no step took yet: its step's
    /// number and length (it lies in the inbox after the header).
    folded: Option<(u64, usize)>,
    inbox: &'a mut Inbox,
}

impl<'a> Ctx<'a> {
    /// The collective `seq` (the same number on every rank), checked against
    /// the neighbours' calls: posts the receive of the left-hand
    /// neighbour's check message (with more than one rank).
    pub fn new(
        w: &'a mut super::Worker,
        seq: u32,
        (d, alive, what): (
            &'a crate::util::Deadline,
            &'a dyn Fn() -> Result<()>,
            &'static str,
        ),
        mine: Fingerprint,
        (inbox, spare): (&'a mut Inbox, &'a mut super::Spare),
    ) -> Ctx<'a> {
        let (me, n) = (w.rank, w.size);
        let mut ctx = Ctx {
            w,
            seq,
            d,
            alive,
            what,
            check: Check {
                mine,
                unsent: n > 1,
                pending: None,
                folded: None,
                inbox,
            },
            spare,
        };
        if n > 1 {
            let left = (me + n - 1) % n;
            let t = (ctx.tag(left, STEP_CHECK), !0);
            let buf = ctx.check.inbox.ptr();
            let len = ctx.check.inbox.0.len() * 8;
            // SAFETY: the inbox outlives the receive: the transport keeps it,
            // and the call waits for (or withdraws) the receive before it
            // returns.
            ctx.check.pending = Some(unsafe { ctx.w.recv(left, buf, len, t) });
        }
        ctx
    }

    /// In the collective's first step (`step`, sending `sends`): sends the
    /// check message to the right-hand neighbour, with the step's message
    /// to it folded in when there is one of at most [`FOLD_MAX`] bytes;
    /// returns that message's index in `sends` (the step sends it no
    /// more). Nothing after the first call.
    ///
    /// # Safety
    /// Every send's buffer is valid for reads of its length.
    pub(super) unsafe fn send_check(
        &mut self,
        step: u64,
        sends: &[(usize, *const u8, usize)],
    ) -> Option<usize> {
        if !std::mem::take(&mut self.check.unsent) {
            return None;
        }
        let (me, n) = (self.w.rank, self.w.size);
        let right = (me + 1) % n;
        let fold = sends
            .iter()
            .position(|&(peer, _, len)| peer == right && len <= FOLD_MAX);
        let extra = fold.map_or(0, |i| 8 + sends[i].2);
        let mut msg = self.w.send_buffer();
        msg.reserve(FINGERPRINT_BYTES + extra);
        self.check.mine.append_to(&mut msg);
        if let Some(i) = fold {
            let (_, buf, len) = sends[i];
            msg.extend_from_slice(&step.to_le_bytes());
            if len > 0 {
                msg.extend_from_slice(std::slice::from_raw_parts(buf, len));
            }
        }
        let t = self.tag(me, STEP_CHECK);
        self.w.send_buffered(right, msg, t);
        fold
    }

    /// Waits for the left-hand neighbour's check message and compares it,
    /// if no step did yet. On a difference (or a failed wait) withdraws
    /// `reqs` with everything else, telling every rank.
    pub(super) fn await_check(&mut self, reqs: &mut [Request]) -> Result<()> {
        let Some(r) = self.check.pending.take() else {
            return Ok(());
        };
        let mut first = [r];
        let checked = self.w.wait(&mut first, self.d, self.alive, self.what);
        if let Err(e) = checked.and_then(|()| self.compare(first[0].info.length)) {
            self.w.withdraw(reqs, &e);
            return Err(e);
        }
        Ok(())
    }

    /// Step `step`'s receive of `len` bytes from `peer` into `buf`, when
    /// the left-hand neighbour folded it into its check message: copied
    /// (`Some(Ok)`), or the size error when the lengths differ (the caller
    /// withdraws); `None` when it comes as a message of its own.
    ///
    /// # Safety
    /// `buf` is valid for writes of `len` bytes.
    pub(super) unsafe fn take_folded(
        &mut self,
        step: u64,
        (peer, buf, len): (usize, *mut u8, usize),
    ) -> Option<Result<()>> {
        let (me, n) = (self.w.rank, self.w.size);
        match self.check.folded {
            Some((s, got)) if s == step && peer == (me + n - 1) % n => {
                self.check.folded = None;
                if got != len {
                    return Some(Err(self.size_mismatch(peer, got, len)));
                }
                copy(buf, self.check.inbox.ptr().add(FOLD_HEADER), len);
                Some(Ok(()))
            }
            _ => None,
        }
    }

    /// At the end of the collective: sends the check message if no step
    /// did (a collective without steps) and compares the neighbour's if no
    /// step did; when the call succeeded (`ok`), a folded payload that no
    /// step took is a mismatch, and the check message, which may carry the
    /// first step's data, is complete (as a step's own sends are) before
    /// the call returns.
    pub fn finish_check(&mut self, ok: bool) -> Result<()> {
        // SAFETY: no sends, nothing read.
        unsafe { self.send_check(STEP_CHECK, &[]) };
        self.await_check(&mut [])?;
        if ok {
            self.w.flush(self.d, self.alive)?;
        }
        match self.check.folded.take() {
            Some((_, len)) if ok => {
                let (me, n) = (self.w.rank, self.w.size);
                let e = Error::invalid_usage(format!(
                    "ucx {} on rank {me}: rank {} sent {len} bytes that this rank's call does \
                     not receive (the ranks called different operations or sizes)",
                    self.what,
                    (me + n - 1) % n
                ));
                self.w.withdraw(&mut [], &e);
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Compares the left-hand neighbour's check message (`len` bytes in
    /// the inbox) with this rank's call, noting a folded payload; the
    /// error (the caller withdraws, telling every rank) when the neighbour
    /// called something else.
    fn compare(&mut self, len: usize) -> Result<()> {
        let (me, n) = (self.w.rank, self.w.size);
        let bytes = self.check.inbox.bytes();
        let theirs = Fingerprint::from_bytes(bytes);
        let well_formed = len == FINGERPRINT_BYTES || len >= FOLD_HEADER;
        if well_formed && theirs == self.check.mine {
            if len >= FOLD_HEADER {
                let mut step = [0u8; 8];
                step.copy_from_slice(&bytes[FINGERPRINT_BYTES..FOLD_HEADER]);
                self.check.folded = Some((u64::from_le_bytes(step), len - FOLD_HEADER));
            }
            return Ok(());
        }
        let mine = &self.check.mine;
        Err(Error::invalid_usage(format!(
            "ucx {} on rank {me}: the ranks called different collectives: rank {} called {} \
             where rank {me} called {} (the {} differs); every rank fails this call",
            self.what,
            (me + n - 1) % n,
            theirs.describe(),
            mine.describe(),
            theirs.differing_field(mine),
        )))
    }
}
