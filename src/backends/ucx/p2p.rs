//! Point-to-point over UCP tag send/receive, matched on (peer, tag) as on
//! the Gloo path. Every send carries a descriptor (count, dtype, bytes):
//! up to [`PACKED_MAX`] bytes of payload travel in the same message as
//! their descriptor (one eager message), larger payloads follow as a
//! message of their own, sent from the caller's buffer (UCX picks eager or
//! rendezvous). The worker keeps the heads' send and receive buffers
//! between calls, so a small send or receive allocates nothing. A receive takes
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
/// A head's receive buffer: the descriptor and the largest packed payload.
const HEAD_BYTES: usize = DESC_BYTES + PACKED_MAX;

fn head_tag(sender: usize, tag: u32) -> u64 {
    super::tag(CLASS_P2P_HEAD, sender, tag as u64)
}

fn data_tag(sender: usize, tag: u32) -> u64 {
    super::tag(CLASS_P2P_DATA, sender, tag as u64)
}

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
    // Payloads too large for their head go straight from the caller's
    // buffer (no copy); the call waits for them before it returns.
    let mut data_sends: Vec<Request> = Vec::new();
    for o in ops.iter().filter(|o| o.is_send && !skipped(o)) {
        let bytes = o.count * o.dtype.size();
        let peer = o.peer as usize;
        let mut head = w.send_buffer();
        for word in [o.count as u64, o.dtype.to_c() as u64, bytes as u64] {
            head.extend_from_slice(&word.to_ne_bytes());
        }
        if bytes <= PACKED_MAX {
            head.extend_from_slice(std::slice::from_raw_parts(o.buf.as_u8(), bytes));
            w.send_buffered(peer, head, head_tag(me, o.tag));
        } else {
            w.send_buffered(peer, head, head_tag(me, o.tag) | HEAD_DESCRIPTOR_ONLY);
            data_sends.push(w.send(peer, o.buf.as_u8(), bytes, data_tag(me, o.tag)));
        }
    }
    let received = receive(w, ops, &skipped, d, alive);
    let sent = match received {
        Ok(_) if data_sends.is_empty() => Ok(()),
        Ok(_) => w.wait(&mut data_sends, d, alive, "point-to-point send"),
        Err(ref e) => {
            // The failed wait withdrew this comm's UCX endpoints: the
            // payload sends end there, before the caller may reuse its
            // buffers.
            w.withdraw(&mut data_sends, e);
            Ok(())
        }
    };
    let mut messages = received?;
    sent?;
    w.flush(d, alive)?;
    messages.extend(errors.drain(..).map(|(_, m)| m));
    if messages.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid_usage(messages.join("; ")))
    }
}

/// The receives of `ops` (less the `skipped` ones): the mismatch messages
/// of those whose send did not match.
///
/// # Safety
/// As for [`run`].
unsafe fn receive(
    w: &mut Worker,
    ops: &[P2p],
    skipped: &dyn Fn(&P2p) -> bool,
    d: &Deadline,
    alive: &dyn Fn() -> Result<()>,
) -> Result<Vec<String>> {
    let receiving = |o: &&P2p| !o.is_send && !skipped(o);
    let n = ops.iter().filter(receiving).count();
    let mut messages = Vec::new();
    if n > 0 {
        // A lone receive (the common call) keeps its lists on the stack:
        // no allocation on this path.
        let (one_receive, mut one_head, mut one_req);
        let (many_receives, mut many_heads, mut many_reqs);
        let (receives, heads, reqs): (&[&P2p], &mut [Vec<u8>], &mut [Request]) = if n == 1 {
            let o = ops.iter().find(receiving).unwrap_or(&ops[0]);
            one_receive = [o];
            // Kept by the worker between calls: the receive neither
            // allocates nor clears its 8 KiB head (a fresh one each call
            // cost more than the rest of the receive).
            one_head = [w.kept_buffer(HEAD_BYTES)];
            one_req = [post_head(w, o, &one_head[0])];
            (&one_receive, &mut one_head, &mut one_req)
        } else {
            many_receives = ops.iter().filter(receiving).collect::<Vec<_>>();
            many_heads = (0..n)
                .map(|_| w.kept_buffer(HEAD_BYTES))
                .collect::<Vec<_>>();
            many_reqs = many_receives
                .iter()
                .zip(&many_heads)
                .map(|(o, h)| post_head(w, o, h))
                .collect::<Vec<_>>();
            (&many_receives, &mut many_heads, &mut many_reqs)
        };
        // On failure the wait withdrew the receives: the heads are
        // dropped, not kept (UCX may hold one still).
        w.wait(reqs, d, alive, &receive_label(receives))?;
        let mut payloads = Vec::new();
        let mut scratch = Vec::new();
        for ((o, r), h) in receives.iter().zip(reqs.iter()).zip(heads.iter()) {
            let word =
                |i: usize| u64::from_ne_bytes(h[8 * i..8 * i + 8].try_into().unwrap_or_default());
            let (count, dtype, bytes) = (word(0), word(1), word(2) as usize);
            let sender = super::sender_of(r.info.sender_tag);
            o.matched_source(sender as i32);
            let matches = count == o.count as u64 && dtype == o.dtype.to_c() as u64;
            if !matches {
                messages.push(o.mismatch_with_send_from(sender as i32, count, dtype));
            }
            if r.info.sender_tag & HEAD_DESCRIPTOR_ONLY == 0 {
                if matches {
                    let packed = &h[DESC_BYTES..];
                    std::ptr::copy_nonoverlapping(
                        packed.as_ptr(),
                        o.buf.as_u8(),
                        bytes.min(packed.len()),
                    );
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
        for h in heads.iter_mut() {
            w.keep(std::mem::take(h));
        }
        if !payloads.is_empty() {
            w.wait(&mut payloads, d, alive, "point-to-point receive")?;
        }
    }
    Ok(messages)
}

/// Posts the receive of `o`'s head into `head`.
///
/// # Safety
/// `head` stays alive and unmoved (its heap buffer) until the receive
/// completed or was withdrawn.
unsafe fn post_head(w: &mut Worker, o: &P2p, head: &[u8]) -> Request {
    let (peer, t) = match o.is_any_source() {
        // Any sender's head of the tag; posted as from this rank, so that
        // the wait watches every peer (see `Worker::failure`).
        true => (
            w.rank,
            (head_tag(0, o.tag), HEAD_MASK & !super::SENDER_BITS),
        ),
        false => (
            o.peer as usize,
            (head_tag(o.peer as usize, o.tag), HEAD_MASK),
        ),
    };
    w.recv(peer, head.as_ptr() as *mut u8, HEAD_BYTES, t)
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
fn receive_label(receives: &[&P2p]) -> std::borrow::Cow<'static, str> {
    if let [o] = receives {
        if o.is_any_source() {
            return format!(
                "point-to-point receive from any source{}",
                match o.tag {
                    0 => String::new(),
                    t => format!(" with tag {t} (it takes only a send of its tag)"),
                }
            )
            .into();
        }
    }
    if receives.iter().all(|o| o.tag == 0) {
        return "point-to-point receive".into();
    }
    let mut tags: Vec<u32> = receives.iter().map(|o| o.tag).filter(|t| *t != 0).collect();
    tags.sort_unstable();
    tags.dedup();
    let list: Vec<String> = tags.iter().map(u32::to_string).collect();
    format!(
        "point-to-point receive (tags {}; a receive takes only a send of its own peer and tag)",
        list.join(", ")
    )
    .into()
}
