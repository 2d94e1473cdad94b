//! Non-blocking point-to-point through shared memory that completes on the
//! caller's thread (a send that fits its ring, a receive whose message is
//! already there; see `engine::p2p::at_once`), mixed with the ones that
//! still go through the progress thread, on real processes of 2, 3 and 4
//! ranks: every dtype, sizes around the largest message completed at once
//! (64 KiB) and around the ring's alignment, many outstanding sends and
//! receives in both directions waited for out of order, messages wrapping
//! at the ring's end, matching on (peer, tag) in order with early messages
//! of other tags, and receives that do not match their message failing on
//! their work; every byte checked.

mod gloo_common;
mod p2p_common;

use gloo_common::*;
use p2p_common::*;
use std::sync::Arc;
use std::time::Duration;
use torchcomm::{Comm, DType, ErrorKind, Op, Work};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The largest message completed at once (the engine's `AT_ONCE_MAX`).
const AT_ONCE_MAX: usize = 64 << 10;

/// The bytes rank `from` sends to rank `to` as its message `k`.
fn payload(from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(151) ^ (from * 11 + to * 17 + k * 37) ^ (k >> 8)) as u8)
        .collect()
}

fn peers(comm: &Comm) -> Vec<usize> {
    let me = comm.rank() as usize;
    (0..comm.size() as usize).filter(|q| *q != me).collect()
}

/// For every dtype: to every peer, messages of element counts around the
/// alignment (32 bytes) and around the largest message completed at once,
/// each with its own tag; the receives posted in the opposite order (so
/// the front message often has another tag), after a barrier for half the
/// dtypes (every message there: receives at once) and at once for the
/// others (receives ahead of their sends); waits in a shuffled order.
fn every_dtype_around_the_threshold(comm: &Comm) {
    let me = comm.rank() as usize;
    for (di, dtype) in DType::ALL.iter().enumerate() {
        let es = dtype.size();
        let counts = [
            0,
            1,
            31 / es,
            32 / es,
            32 / es + 1,
            AT_ONCE_MAX / es - 1,
            AT_ONCE_MAX / es,
            AT_ONCE_MAX / es + 1,
        ];
        let key = |c: usize| di * 100 + c;
        let mut outs: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        let mut ins: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        for q in peers(comm) {
            for (c, n) in counts.iter().enumerate() {
                outs.push((q, c, payload(me, q, key(c), n * es)));
                ins.push((q, c, vec![0xa5; n * es]));
            }
        }
        let mut works = Vec::new();
        for (q, c, b) in outs.iter_mut() {
            works.push(isend(comm, b, *dtype, *q, *c as u32));
        }
        if di % 2 == 0 {
            run(comm, Op::Barrier).unwrap();
        }
        for (q, c, b) in ins.iter_mut().rev() {
            works.push(irecv(comm, b, *dtype, *q, *c as u32));
        }
        for i in shuffled(works.len(), di + me) {
            works[i].wait_blocking().unwrap();
        }
        for (q, c, got) in &ins {
            assert!(
                *got == payload(*q, me, key(*c), got.len()),
                "{} message of {} bytes from rank {q}",
                dtype.name(),
                got.len()
            );
        }
    }
}

/// Many non-blocking sends and receives in flight in both directions with
/// every peer, small and uneven (the rings wrap many times over the
/// rounds), posted in an order that depends on the rank, waited for in a
/// shuffled order; one tag per round, so matching is by order alone.
fn many_outstanding_both_directions(comm: &Comm) {
    let me = comm.rank() as usize;
    const M: usize = 150;
    let len = |from: usize, to: usize, k: usize| (from * 31 + to * 7 + k * 389) % 3001;
    for round in 0..12 {
        let tag = round as u32;
        let mut outs: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        let mut ins: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        for k in 0..M {
            for q in peers(comm) {
                let kk = round * 1000 + k;
                outs.push((q, kk, payload(me, q, kk, len(me, q, kk))));
                ins.push((q, kk, vec![0x5a; len(q, me, kk)]));
            }
        }
        let mut works = Vec::new();
        match (me + round) % 3 {
            0 => {
                for (q, _, b) in outs.iter_mut() {
                    works.push(isend(comm, b, DType::U8, *q, tag));
                }
                for (q, _, b) in ins.iter_mut() {
                    works.push(irecv(comm, b, DType::U8, *q, tag));
                }
            }
            // The receive first from a lower rank (which sends first to
            // this one: started operations run in order, so two ranks
            // that both receive from each other first would wait forever).
            1 => {
                for ((q, _, o), (p, _, i)) in outs.iter_mut().zip(ins.iter_mut()) {
                    if *p < me {
                        works.push(irecv(comm, i, DType::U8, *p, tag));
                        works.push(isend(comm, o, DType::U8, *q, tag));
                    } else {
                        works.push(isend(comm, o, DType::U8, *q, tag));
                        works.push(irecv(comm, i, DType::U8, *p, tag));
                    }
                }
            }
            _ => {
                for ((q, _, o), (p, _, i)) in outs.iter_mut().zip(ins.iter_mut()) {
                    works.push(isend(comm, o, DType::U8, *q, tag));
                    works.push(irecv(comm, i, DType::U8, *p, tag));
                }
            }
        }
        for i in shuffled(works.len(), round * 7 + me) {
            works[i].wait_blocking().unwrap();
        }
        for (q, k, got) in &ins {
            assert!(
                *got == payload(*q, me, *k, got.len()),
                "round {round}: message {k} ({} bytes) from rank {q}",
                got.len()
            );
        }
    }
}

/// Rounds of sends to the next rank, then a barrier, then the receives
/// from the previous one, all at once: over 2.5 MiB per pair, so that
/// messages straddle the 1 MiB ring's end (a body that wraps), every one
/// received at once.
fn wrapping_at_the_ring_end(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let len = |k: usize| 1000 + (k % 7) * 13 + k % 3;
    for round in 0..40 {
        let keys: Vec<usize> = (0..64).map(|i| 5000 + round * 64 + i).collect();
        let mut outs: Vec<Vec<u8>> = keys
            .iter()
            .map(|k| payload(me, next, *k, len(*k)))
            .collect();
        let sends: Vec<Arc<dyn Work>> = outs
            .iter_mut()
            .map(|b| isend(comm, b, DType::U8, next, 0))
            .collect();
        run(comm, Op::Barrier).unwrap();
        let mut ins: Vec<Vec<u8>> = keys.iter().map(|k| vec![0; len(*k)]).collect();
        let recvs: Vec<Arc<dyn Work>> = ins
            .iter_mut()
            .map(|b| irecv(comm, b, DType::U8, prev, 0))
            .collect();
        for w in sends.iter().chain(&recvs) {
            w.wait_blocking().unwrap();
        }
        for (k, got) in keys.iter().zip(&ins) {
            assert!(
                *got == payload(prev, me, *k, got.len()),
                "message {k} from rank {prev}"
            );
        }
    }
}

/// Each rank sends to the next messages with tags 1, 2, 1, 2, 3, 1 (then
/// a barrier: all are there); the receiver asks for tag 3 first, then the
/// 2s, then the 1s: each tag's messages in their order, the others kept
/// aside as early messages and taken from there at once.
fn tags_in_order(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let tags = [1u32, 2, 1, 2, 3, 1];
    for early in [true, false] {
        let mut outs: Vec<Vec<u8>> = (0..tags.len())
            .map(|k| payload(me, next, 3000 + k, 40 + k * 8))
            .collect();
        let mut works: Vec<Arc<dyn Work>> = outs
            .iter_mut()
            .zip(tags)
            .map(|(b, t)| isend(comm, b, DType::U8, next, t))
            .collect();
        if early {
            run(comm, Op::Barrier).unwrap();
        }
        let mut order: Vec<usize> = (0..tags.len()).collect();
        order.sort_by_key(|k| std::cmp::Reverse(tags[*k]));
        let mut ins: Vec<(usize, Vec<u8>)> =
            order.iter().map(|k| (*k, vec![0; 40 + k * 8])).collect();
        for (k, b) in ins.iter_mut() {
            works.push(irecv(comm, b, DType::U8, prev, tags[*k]));
        }
        for w in works.iter().rev() {
            w.wait_blocking().unwrap();
        }
        for (k, got) in &ins {
            assert!(
                *got == payload(prev, me, 3000 + k, got.len()),
                "message {k} (tag {}) from rank {prev}, early {early}",
                tags[*k]
            );
        }
    }
}

/// The same with blocking calls (a blocking send that fits its ring and a
/// blocking receive whose message is there complete at once too): tags
/// 1, 2, 1 and a message that the receive does not match, all there
/// before the receives; tag 2 first, then the 1s in order.
fn blocking_calls_in_order(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let tags = [1u32, 2, 1];
    for (k, t) in tags.iter().enumerate() {
        let mut out = payload(me, next, 6000 + k, 24 + k);
        let op = Op::send(ptr(&mut out), out.len(), DType::U8, next as i32, *t);
        run(comm, op).unwrap();
    }
    let mut odd = vec![0u8; 8 * 2];
    let op = Op::send(ptr(&mut odd), 8, DType::F16, next as i32, 4);
    run(comm, op).unwrap();
    run(comm, Op::Barrier).unwrap();
    for k in [1, 0, 2] {
        let mut got = vec![0u8; 24 + k];
        let op = Op::recv(ptr(&mut got), got.len(), DType::U8, prev as i32, tags[k]);
        run(comm, op).unwrap();
        assert!(
            got == payload(prev, me, 6000 + k, 24 + k),
            "blocking message {k}"
        );
    }
    let mut got = vec![0xeeu8; 9 * 2];
    let op = Op::recv(ptr(&mut got), 9, DType::F16, prev as i32, 4);
    let e = run(comm, op).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    assert!(got.iter().all(|x| *x == 0xee), "nothing landed");
}

/// Receives that do not match their message fail on their own work with
/// TC_ERR_INVALID_USAGE naming both, nothing written, the pair usable:
/// one taken at once from the ring, one from the early messages.
fn mismatches(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mut f = vec![0u8; 10 * 4];
    let mut a = vec![0u8; 5 * 4];
    let mut b = vec![0u8; 3 * 4];
    let sends = [
        isend(comm, &mut f, DType::F32, next, 7),
        isend(comm, &mut a, DType::I32, next, 8),
        isend(comm, &mut b, DType::I32, next, 9),
    ];
    run(comm, Op::Barrier).unwrap();
    let mut got_f = vec![0xeeu8; 12 * 4];
    let e = irecv(comm, &mut got_f, DType::F32, prev, 7)
        .wait_blocking()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    assert!(
        e.message.contains("12 float32") && e.message.contains("10 float32"),
        "{e}"
    );
    assert!(got_f.iter().all(|x| *x == 0xee), "nothing landed");
    // Tag 9 first: tag 8's message is set aside, then taken (mismatched).
    let mut got_b = vec![0u8; 3 * 4];
    irecv(comm, &mut got_b, DType::I32, prev, 9)
        .wait_blocking()
        .unwrap();
    let mut got_a = vec![0xeeu8; 6 * 4];
    let e = irecv(comm, &mut got_a, DType::I32, prev, 8)
        .wait_blocking()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    assert!(
        e.message.contains("6 int32") && e.message.contains("5 int32"),
        "{e}"
    );
    assert!(got_a.iter().all(|x| *x == 0xee), "nothing landed");
    for s in sends {
        s.wait_blocking().unwrap();
    }
    // The pair is still usable.
    let mut out = payload(me, next, 4000, 100);
    let s = isend(comm, &mut out, DType::U8, next, 7);
    let mut got = vec![0u8; 100];
    irecv(comm, &mut got, DType::U8, prev, 7)
        .wait_blocking()
        .unwrap();
    s.wait_blocking().unwrap();
    assert!(got == payload(prev, me, 4000, 100));
}

fn child() {
    let comm = child_comm("shm-p2p-at-once", TIMEOUT);
    every_dtype_around_the_threshold(&comm);
    many_outstanding_both_directions(&comm);
    wrapping_at_the_ring_end(&comm);
    tags_in_order(&comm);
    blocking_calls_in_order(&comm);
    mismatches(&comm);
    run(&comm, Op::Barrier).unwrap();
    println!("RESULT ok");
}

fn job(test: &str, n: usize) {
    shm_p2p_job(test, "at-once", n);
}

#[test]
fn gloo_shm_p2p_at_once_2() {
    if role().is_some() {
        return child();
    }
    job("gloo_shm_p2p_at_once_2", 2);
}

#[test]
fn gloo_shm_p2p_at_once_3() {
    if role().is_some() {
        return child();
    }
    job("gloo_shm_p2p_at_once_3", 3);
}

#[test]
fn gloo_shm_p2p_at_once_4() {
    if role().is_some() {
        return child();
    }
    job("gloo_shm_p2p_at_once_4", 4);
}
