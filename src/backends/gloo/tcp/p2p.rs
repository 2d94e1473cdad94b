//! Point-to-point: sends, receives and batches over Gloo's unbound
//! buffers. Each send is buffered and carries a descriptor (count, dtype,
//! bytes) ahead of its payload; its receive takes the descriptor first and
//! posts the payload at the announced size, so that a size mismatch fails
//! cleanly on the receiver instead of terminating the process, and a send
//! never waits for its receive (see [`super::buffered_sends`]).
//!
//! Tags map onto Gloo's slots: Gloo matches a receive with a send of the
//! same (peer, slot), in posting order, and a payload's slot holds its tag
//! and its number among the transfers of that (peer, direction, tag). So a
//! receive only ever meets a send of its own tag, and the transfers of one
//! batch, posted together, match whatever their order on either side.
//! A descriptor's slot holds its tag only (number 0): every sender's
//! descriptors of one tag share it, so that a receive from any source
//! takes the first that comes from any rank (Gloo's receive from a set of
//! ranks, as torch's gloo does); Gloo's in-order matching of equal slots
//! keeps each sender's order. Its payload then comes from that sender.

use super::buffered_sends::{DESC_BYTES, DESC_WORDS};
use super::{shim, GlooTcp, SLOT_KIND_DATA, SLOT_KIND_DESC, SLOT_KIND_TAGGED, SLOT_PREFIX_P2P};
use crate::backends::gloo::memory::{local_transfers, Scratch};
use crate::error::{Error, Result};
use crate::op::P2p;
use crate::util::{lock, Deadline};
use std::ffi::c_void;

impl GlooTcp {
    /// The Gloo slot of transfer `seq` of one (peer, direction, tag). Tag 0
    /// keeps 48 bits of sequence; other tags take 32 of them (kinds of their
    /// own, so they never meet a tag-0 slot), leaving 16 bits of sequence:
    /// a slot comes back only after 65,536 transfers of its (peer,
    /// direction, tag), and Gloo pairs equal slots in order anyway.
    pub(super) fn slot(kind: u64, tag: u32, seq: u64) -> u64 {
        if tag == 0 {
            return (SLOT_PREFIX_P2P << 56) | (kind << 48) | (seq & 0xffff_ffff_ffff);
        }
        (SLOT_PREFIX_P2P << 56)
            | ((kind + SLOT_KIND_TAGGED) << 48)
            | ((tag as u64) << 16)
            | (seq & 0xffff)
    }

    /// Each remote transfer's number among those of its (peer, direction,
    /// tag), counting on from earlier operations.
    fn next_seqs(&self, remote: &[&P2p]) -> Vec<u64> {
        let mut s = lock(&self.seqs);
        remote
            .iter()
            .map(|o| {
                let counter = if o.tag != 0 {
                    s.tagged.entry((o.is_send, o.peer, o.tag)).or_insert(0)
                } else if o.is_send {
                    &mut s.send[o.peer as usize]
                } else {
                    &mut s.recv[o.peer as usize]
                };
                let q = *counter;
                *counter += 1;
                q
            })
            .collect()
    }

    /// Point-to-point transfers issued together. Sends are buffered (see
    /// [`super::buffered_sends`]): each posts a descriptor (count, dtype,
    /// bytes) and its payload and completes. Receives first take their
    /// descriptors, all together, then post their payloads at the size the
    /// sender announced: a receive whose descriptor disagrees fails with
    /// `TC_ERR_INVALID_USAGE` naming both sides, its payload is taken into
    /// scratch memory (the pair stays in step, nothing lands), and the
    /// other transfers complete.
    pub(super) unsafe fn p2p(&self, ops: &[P2p], d: &Deadline) -> Result<()> {
        let me = self.rank;
        let mut errors: Vec<String> = Vec::new();
        local_transfers(self.rank, ops, &mut errors);
        if let [o] = ops {
            if o.is_any_source() {
                self.check_open()?;
                self.receive_any(o, d, &mut errors)?;
                return match errors.is_empty() {
                    true => Ok(()),
                    false => Err(Error::invalid_usage(errors.join("; "))),
                };
            }
        }
        let remote: Vec<&P2p> = ops.iter().filter(|o| o.peer != me).collect();
        if !remote.is_empty() {
            self.check_open()?;
            let seqs = self.next_seqs(&remote);
            let mut receives = Vec::new();
            for (o, seq) in remote.iter().zip(seqs) {
                if !o.is_send {
                    receives.push((*o, seq));
                    continue;
                }
                let bytes = o.count * o.dtype.size();
                let desc = [o.count as u64, o.dtype.to_c() as u64, bytes as u64];
                let slots = (
                    Self::slot(SLOT_KIND_DESC, o.tag, 0),
                    Self::slot(SLOT_KIND_DATA, o.tag, seq),
                );
                self.buffered_send(o.peer, desc, o.buf.as_u8(), slots, d)?;
            }
            if !receives.is_empty() {
                self.receive(&receives, d, &mut errors)?;
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid_usage(errors.join("; ")))
        }
    }

    /// A receive from any source (alone): the first descriptor of its tag
    /// from any other rank, then the payload from that rank, numbered as
    /// that rank's next receive of the tag.
    unsafe fn receive_any(&self, o: &P2p, d: &Deadline, errors: &mut Vec<String>) -> Result<()> {
        let label = match o.tag {
            0 => "point-to-point receive from any source".to_string(),
            t => format!(
                "point-to-point receive from any source with tag {t} (it takes only a send of \
                 its tag)"
            ),
        };
        let others: Vec<i32> = (0..self.size).filter(|q| *q != self.rank).collect();
        let mut desc = [u64::MAX; DESC_WORDS];
        let sender = {
            let ub = shim::UnboundBuffer::new(self.ctx(), desc.as_mut_ptr() as *mut u8, DESC_BYTES)
                .map_err(|e| self.fail(&label, e))?;
            ub.recv_any(&others, Self::slot(SLOT_KIND_DESC, o.tag, 0), 0, DESC_BYTES)
                .map_err(|e| self.fail(&label, e))?;
            // A failed wait closes the context (see `fail`), which ends the
            // posted receive before its buffer goes.
            match ub.wait_recv(Some(d.left()?)) {
                Ok(shim::Waited::Done(q)) if q >= 0 && q < self.size => q,
                Ok(other) => {
                    let e = Error::internal(format!("gloo {label}: the wait ended with {other:?}"));
                    self.close(&e);
                    return Err(e);
                }
                Err(e) => return Err(self.fail(&label, e)),
            }
        };
        o.matched_source(sender);
        let mut named = o.clone();
        named.peer = sender;
        let seq = self.next_seqs(&[&named])[0];
        let [count, dtype, bytes] = desc;
        let mut buf = o.buf.0;
        let mut scratch = None;
        if count != o.count as u64 || dtype != o.dtype.to_c() as u64 {
            errors.push(o.mismatch_with_send_from(sender, count, dtype));
            let mut s = Scratch::new(bytes as usize)?;
            buf = s.ptr() as *mut c_void;
            scratch = Some(s);
        }
        if bytes > 0 {
            let payload = [shim::Transfer {
                peer: sender,
                is_send: 0,
                buf,
                nbytes: bytes as usize,
                slot: Self::slot(SLOT_KIND_DATA, o.tag, seq),
            }];
            self.ctx()
                .p2p(&payload, d.left()?)
                .map_err(|e| self.fail("point-to-point receive", e))?;
        }
        drop(scratch);
        Ok(())
    }

    /// The receives of one operation (with their sequence numbers): their
    /// descriptors, then their payloads.
    unsafe fn receive(
        &self,
        receives: &[(&P2p, u64)],
        d: &Deadline,
        errors: &mut Vec<String>,
    ) -> Result<()> {
        let mut descs = vec![[u64::MAX; DESC_WORDS]; receives.len()];
        let transfers: Vec<shim::Transfer> = receives
            .iter()
            .zip(descs.iter_mut())
            .map(|((o, _), desc)| shim::Transfer {
                peer: o.peer,
                is_send: 0,
                buf: desc.as_mut_ptr() as *mut c_void,
                nbytes: DESC_BYTES,
                slot: Self::slot(SLOT_KIND_DESC, o.tag, 0),
            })
            .collect();
        let tagged: Vec<&P2p> = receives.iter().map(|(o, _)| *o).collect();
        self.ctx()
            .p2p(&transfers, d.left()?)
            .map_err(|e| self.fail(&descriptor_label(&tagged), e))?;
        let mut scratch = Vec::new();
        let mut payloads = Vec::with_capacity(receives.len());
        for ((o, seq), [count, dtype, bytes]) in receives.iter().zip(descs) {
            let mut buf = o.buf.0;
            if count != o.count as u64 || dtype != o.dtype.to_c() as u64 {
                errors.push(o.mismatch_with_send(count, dtype));
                let mut s = Scratch::new(bytes as usize)?;
                buf = s.ptr() as *mut c_void;
                scratch.push(s);
            }
            if bytes > 0 {
                payloads.push(shim::Transfer {
                    peer: o.peer,
                    is_send: 0,
                    buf,
                    nbytes: bytes as usize,
                    slot: Self::slot(SLOT_KIND_DATA, o.tag, *seq),
                });
            }
        }
        if !payloads.is_empty() {
            self.ctx()
                .p2p(&payloads, d.left()?)
                .map_err(|e| self.fail("point-to-point receive", e))?;
        }
        Ok(())
    }
}

/// What the descriptor receive is called in errors: with the tags in use, since
/// a receive waiting for a tag its peer does not send fails only at the
/// timeout.
fn descriptor_label(remote: &[&P2p]) -> String {
    let mut tags: Vec<u32> = remote.iter().map(|o| o.tag).filter(|t| *t != 0).collect();
    if tags.is_empty() {
        return "point-to-point receive of the sender's size".into();
    }
    tags.sort_unstable();
    tags.dedup();
    let list: Vec<String> = tags.iter().map(u32::to_string).collect();
    format!(
        "point-to-point receive of the sender's size for tagged transfers (tags {}; a receive \
         takes only a send of its own peer and tag, and operations run in issue order)",
        list.join(", ")
    )
}
