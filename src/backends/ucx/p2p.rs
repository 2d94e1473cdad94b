//! Point-to-point over UCP tag send/receive, matched on (peer, tag) as on
//! the Gloo path. Every send carries a descriptor (count, dtype, bytes):
//! up to [`PACKED_MAX`] bytes of payload travel in the same message as
//! their descriptor (one eager message), larger payloads follow as a
//! message of their own (UCX picks eager or rendezvous). A receive takes
//! the head first and so learns the sender's size before any payload lands:
//! a mismatch fails the receive with `TC_ERR_INVALID_USAGE` naming both
//! sides, the payload goes to scratch, and the pair stays in step.
//!
//! A receive from any source posts its head receive with a mask that
//! ignores the sender's bits of the tag (UCX matches the first head of its
//! tag from any peer, each peer's in order) and learns the sender from the
//! completed head's tag; its payload, if separate, is then received from
//! that sender. It is posted as from this rank, so that the wait fails
//! when any peer fails.
//!
//! A call returns once UCX completed its sends too: an eager one (a head)
//! at once, a rendezvous one when the peer posted its receive. Between
//! calls nothing progresses the worker (there is no service thread), so a
//! send left pending would never move. Unlike the Gloo path, where sends
//! complete once posted, a blocking send of more than [`PACKED_MAX`] bytes
//! followed by a receive on both sides waits for the timeout: issue such
//! pairs as one batch (the receives of a batch are posted before its sends
//! are waited for).

use super::worker::{Request, Worker};
use super::{CLASS_P2P_DATA, CLASS_P2P_HEAD, HEAD_DESCRIPTOR_ONLY, HEAD_MASK};
use crate::error::{Error, Result};
use crate::op::P2p;
use crate::util::Deadline;

/// The descriptor: count, dtype code, bytes.
const DESC_BYTES: usize = 24;
/// The largest payload sent in its head.
const PACKED_MAX: usize = 8192;

fn head_tag(sender: usize, tag: u32) -> u64 {
    super::tag(CLASS_P2P_HEAD, sender, tag as u64)
}

fn data_tag(sender: usize, tag: u32) -> u64 {
    super::tag(CLASS_P2P_DATA, sender, tag as u64)
}

/// The sender's bits of a tag.
const SENDER_BITS: u64 = ((super::MAX_RANKS as u64) - 1) << 44;

/// Transfers issued together (a send, a receive or a batch).
///
/// # Safety
/// Every buffer is valid for its count until this returns.
pub(super) unsafe fn run(
    w: &mut Worker,
    ops: &[P2p],
    d: &Deadline,
    alive: &dyn Fn() -> Result<()>,
) -> Result<()> {
    let me = w.rank;
    let mut errors = unmatched_self_transfers(ops, me as i32);
    let skipped = |o: &P2p| o.peer == me as i32 && errors.iter().any(|(tag, _)| *tag == o.tag);
    for o in ops.iter().filter(|o| o.is_send && !skipped(o)) {
        let bytes = o.count * o.dtype.size();
        let peer = o.peer as usize;
        let desc = [o.count as u64, o.dtype.to_c() as u64, bytes as u64];
        let mut head: Vec<u8> = desc.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let payload = std::slice::from_raw_parts(o.buf.as_u8() as *const u8, bytes);
        if bytes <= PACKED_MAX {
            head.extend_from_slice(payload);
            w.send_buffered(peer, head, head_tag(me, o.tag));
        } else {
            w.send_buffered(peer, head, head_tag(me, o.tag) | HEAD_DESCRIPTOR_ONLY);
            w.send_buffered(peer, payload.to_vec(), data_tag(me, o.tag));
        }
    }
    let receives: Vec<&P2p> = ops.iter().filter(|o| !o.is_send && !skipped(o)).collect();
    let mut messages = Vec::new();
    if !receives.is_empty() {
        let mut heads = vec![vec![0u64; (DESC_BYTES + PACKED_MAX) / 8]; receives.len()];
        let mut reqs: Vec<Request> = receives
            .iter()
            .zip(heads.iter_mut())
            .map(|(o, h)| {
                let (peer, t) = match o.is_any_source() {
                    true => (me, (head_tag(0, o.tag), HEAD_MASK & !SENDER_BITS)),
                    false => (
                        o.peer as usize,
                        (head_tag(o.peer as usize, o.tag), HEAD_MASK),
                    ),
                };
                w.recv(peer, h.as_mut_ptr() as *mut u8, h.len() * 8, t)
            })
            .collect();
        w.wait(&mut reqs, d, alive, &receive_label(&receives))?;
        let mut payloads = Vec::new();
        let mut scratch = Vec::new();
        for ((o, r), h) in receives.iter().zip(&reqs).zip(&heads) {
            let (count, dtype, bytes) = (h[0], h[1], h[2] as usize);
            let sender = ((r.info.sender_tag & SENDER_BITS) >> 44) as usize;
            o.matched_source(sender as i32);
            let matches = count == o.count as u64 && dtype == o.dtype.to_c() as u64;
            if !matches {
                messages.push(o.mismatch_with_send_from(sender as i32, count, dtype));
            }
            if r.info.sender_tag & HEAD_DESCRIPTOR_ONLY == 0 {
                if matches {
                    let src = (h.as_ptr() as *const u8).add(DESC_BYTES);
                    std::ptr::copy_nonoverlapping(src, o.buf.as_u8(), bytes);
                }
                continue;
            }
            let dst = if matches {
                o.buf.as_u8()
            } else {
                scratch.push(vec![0u8; bytes]);
                scratch
                    .last_mut()
                    .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr())
            };
            payloads.push(w.recv(sender, dst, bytes, (data_tag(sender, o.tag), !0)));
        }
        if !payloads.is_empty() {
            w.wait(&mut payloads, d, alive, "point-to-point receive")?;
        }
    }
    w.flush(d, alive)?;
    messages.extend(errors.drain(..).map(|(_, m)| m));
    if messages.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid_usage(messages.join("; ")))
    }
}

/// The tags whose transfers to self do not pair up in this batch (a send
/// to self needs its receive in the same call), with the error of each:
/// those transfers are left out, as on the Gloo path.
fn unmatched_self_transfers(ops: &[P2p], me: i32) -> Vec<(u32, String)> {
    let mut tags: Vec<u32> = ops.iter().filter(|o| o.peer == me).map(|o| o.tag).collect();
    tags.sort_unstable();
    tags.dedup();
    tags.into_iter()
        .filter_map(|tag| {
            let n = |send: bool| {
                ops.iter()
                    .filter(|o| o.peer == me && o.tag == tag && o.is_send == send)
                    .count()
            };
            let (sends, recvs) = (n(true), n(false));
            let tagged = match tag {
                0 => String::new(),
                t => format!(" with tag {t}"),
            };
            (sends != recvs).then(|| {
                let m = format!(
                    "{sends} sends to self but {recvs} receives from self{tagged} in one batch"
                );
                (tag, m)
            })
        })
        .collect()
}

/// What the head receive is called in errors: with the tags in use, since a
/// receive waiting for a tag its peer does not send fails only at the
/// timeout.
fn receive_label(receives: &[&P2p]) -> String {
    let mut tags: Vec<u32> = receives.iter().map(|o| o.tag).filter(|t| *t != 0).collect();
    if let [o] = receives {
        if o.is_any_source() {
            return format!(
                "point-to-point receive from any source{}",
                match o.tag {
                    0 => String::new(),
                    t => format!(" with tag {t} (it takes only a send of its tag)"),
                }
            );
        }
    }
    if tags.is_empty() {
        return "point-to-point receive".into();
    }
    tags.sort_unstable();
    tags.dedup();
    let list: Vec<String> = tags.iter().map(u32::to_string).collect();
    format!(
        "point-to-point receive (tags {}; a receive takes only a send of its own peer and tag)",
        list.join(", ")
    )
}
