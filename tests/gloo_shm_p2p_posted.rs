//! Windows of non-blocking receives posted before their messages arrive,
//! through shared memory, on real processes of 2, 3 and 4 ranks: queued
//! sends and receives that the progress thread runs together, and queued
//! ones that a waiter runs itself (see `host_executor::batch` and
//! `WaitHelp`). Every dtype with several tags per peer, waited for out of
//! order or only polled; windows from every peer at once; a receive
//! relayed from its own buffer and receives into one buffer, which must
//! see issue order; a receive that completes while a later one of its
//! window still waits; receives that do not match their message failing
//! on their own work, named; a killed peer named at once on every receive
//! posted from it; an abort ending posted receives. Every byte checked.

mod gloo_common;
mod p2p_common;

use gloo_common::*;
use p2p_common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::{Comm, DType, ErrorKind, Op, Work};

const TIMEOUT: Duration = Duration::from_secs(60);
/// How long a sender lets its receivers post their window first.
const POSTING: Duration = Duration::from_millis(30);

/// The bytes rank `from` sends to rank `to` as its message `k`.
fn payload(from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(167) ^ (from * 19 + to * 23 + k * 41) ^ (k >> 8)) as u8)
        .collect()
}

/// Polls `works` until every one finished (nobody waits: the progress
/// thread must complete them).
fn poll_until_finished(works: &[Arc<dyn Work>]) {
    let began = Instant::now();
    while !works.iter().all(|w| w.status().is_finished()) {
        assert!(began.elapsed() < TIMEOUT, "posted receives never completed");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One message of a window: its dtype, element count and tag.
struct Message {
    dtype: DType,
    count: usize,
    tag: u32,
}

/// Every dtype, counts from 0 to past the largest message completed at
/// once (64 KiB), tags shared by several messages (matched in order).
fn window() -> Vec<Message> {
    let mut w = Vec::new();
    for (di, dtype) in DType::ALL.iter().enumerate() {
        for (c, bytes) in [0usize, 1, 40, 3000, (64 << 10) + 64].iter().enumerate() {
            w.push(Message {
                dtype: *dtype,
                count: bytes / dtype.size(),
                tag: ((di * 5 + c) % 7) as u32,
            });
        }
    }
    w
}

/// Each rank in turn sends a window to every other, which posted its
/// receives first: every dtype, and a receive of 11 float32 for a send of
/// 10 that fails on its own work, named, nothing written. The receivers
/// wait out of order, or (odd senders) only poll.
fn every_dtype_posted_first(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let w = window();
    for sender in 0..n {
        let key = |k: usize| sender * 1000 + k;
        if me == sender {
            std::thread::sleep(POSTING);
            let mut outs: Vec<(usize, Vec<u8>)> = Vec::new();
            for q in (0..n).filter(|q| *q != me) {
                for (k, m) in w.iter().enumerate() {
                    outs.push((q, payload(me, q, key(k), m.count * m.dtype.size())));
                }
                outs.push((q, payload(me, q, key(999), 10 * 4)));
            }
            let mut works = Vec::new();
            for (i, (q, b)) in outs.iter_mut().enumerate() {
                let (dtype, tag) = match w.get(i % (w.len() + 1)) {
                    Some(m) => (m.dtype, m.tag),
                    None => (DType::F32, 9),
                };
                works.push(isend(comm, b, dtype, *q, tag));
            }
            for s in works {
                s.wait_blocking().unwrap();
            }
        } else {
            let mut ins: Vec<Vec<u8>> = w
                .iter()
                .map(|m| vec![0xa5; m.count * m.dtype.size()])
                .collect();
            let mut odd = vec![0xeeu8; 11 * 4];
            let mut works: Vec<Arc<dyn Work>> = ins
                .iter_mut()
                .zip(&w)
                .map(|(b, m)| irecv(comm, b, m.dtype, sender, m.tag))
                .collect();
            let mismatch = irecv(comm, &mut odd, DType::F32, sender, 9);
            match sender % 2 {
                0 => {
                    for i in shuffled(works.len(), sender + me) {
                        works[i].wait_blocking().unwrap();
                    }
                }
                _ => {
                    works.push(mismatch.clone());
                    poll_until_finished(&works);
                    for w in &works[..works.len() - 1] {
                        w.wait_blocking().unwrap();
                    }
                }
            }
            let e = mismatch.wait_blocking().unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
            assert!(
                e.message.contains("11 float32") && e.message.contains("10 float32"),
                "{e}"
            );
            assert!(odd.iter().all(|x| *x == 0xee), "nothing landed");
            for (k, got) in ins.iter().enumerate() {
                assert!(
                    *got == payload(sender, me, key(k), got.len()),
                    "{} message {k} ({} bytes) from rank {sender}",
                    w[k].dtype.name(),
                    got.len()
                );
            }
        }
        run(comm, Op::Barrier).unwrap();
    }
}

/// The last rank posts, interleaved, a window of receives from every
/// other rank (uneven sizes, three tags), then the others send theirs;
/// waited for in reverse.
fn from_every_peer_at_once(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let last = n - 1;
    const M: usize = 40;
    let len = |from: usize, k: usize| (from * 131 + k * 977) % 5000;
    if me == last {
        let mut ins: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        for k in 0..M {
            for q in 0..last {
                ins.push((q, k, vec![0x5a; len(q, k)]));
            }
        }
        let works: Vec<Arc<dyn Work>> = ins
            .iter_mut()
            .map(|(q, k, b)| irecv(comm, b, DType::U8, *q, (*k % 3) as u32))
            .collect();
        for w in works.iter().rev() {
            w.wait_blocking().unwrap();
        }
        for (q, k, got) in &ins {
            assert!(
                *got == payload(*q, me, 7000 + k, got.len()),
                "message {k} from rank {q}"
            );
        }
    } else {
        std::thread::sleep(POSTING);
        let mut outs: Vec<Vec<u8>> = (0..M)
            .map(|k| payload(me, last, 7000 + k, len(me, k)))
            .collect();
        let works: Vec<Arc<dyn Work>> = outs
            .iter_mut()
            .enumerate()
            .map(|(k, b)| isend(comm, b, DType::U8, last, (k % 3) as u32))
            .collect();
        for w in works {
            w.wait_blocking().unwrap();
        }
    }
    run(comm, Op::Barrier).unwrap();
}

/// Operations that depend on an earlier one of the window keep issue
/// order: rank 1 relays back to rank 0 the buffer its receive fills (the
/// send must carry the received bytes); receives into one buffer with
/// tags 5 then 6, whose messages come 6 first, leave 6's bytes (the
/// receive of 5 sets 6 aside, then the receive of 6 takes it); three
/// receives into one buffer with one tag leave the last message's.
fn dependent_operations_in_order(comm: &Comm) {
    let me = comm.rank() as usize;
    const LEN: usize = 3000;
    if me == 1 {
        let mut relay = vec![0u8; LEN];
        let mut one = vec![0u8; LEN];
        let mut same = vec![0u8; LEN];
        let mut works = vec![
            irecv(comm, &mut relay, DType::U8, 0, 1),
            isend(comm, &mut relay, DType::U8, 0, 2),
            irecv(comm, &mut one, DType::U8, 0, 5),
            irecv(comm, &mut one, DType::U8, 0, 6),
        ];
        for _ in 0..3 {
            works.push(irecv(comm, &mut same, DType::U8, 0, 7));
        }
        for w in works.iter().rev() {
            w.wait_blocking().unwrap();
        }
        assert!(
            one == payload(0, 1, 6, LEN),
            "the receive of tag 6 came last"
        );
        assert!(same == payload(0, 1, 72, LEN), "the last message of tag 7");
    } else if me == 0 {
        std::thread::sleep(POSTING);
        let mut out = payload(0, 1, 1, LEN);
        isend(comm, &mut out, DType::U8, 1, 1);
        let mut back = vec![0u8; LEN];
        irecv(comm, &mut back, DType::U8, 1, 2)
            .wait_blocking()
            .unwrap();
        assert!(back == out, "the relayed buffer carries the received bytes");
        let mut msgs: Vec<(u32, Vec<u8>)> = vec![
            (6, payload(0, 1, 6, LEN)),
            (5, payload(0, 1, 5, LEN)),
            (7, payload(0, 1, 70, LEN)),
            (7, payload(0, 1, 71, LEN)),
            (7, payload(0, 1, 72, LEN)),
        ];
        let works: Vec<Arc<dyn Work>> = msgs
            .iter_mut()
            .map(|(tag, b)| isend(comm, b, DType::U8, 1, *tag))
            .collect();
        for w in works {
            w.wait_blocking().unwrap();
        }
    }
    run(comm, Op::Barrier).unwrap();
}

/// Rank 1 posts receives A then B from rank 0, which sends B's message
/// only once rank 1 has told it (through the store) that A completed: the
/// wait for A (or, polled, A's completion on the progress thread) must
/// not wait for B.
fn earlier_receive_completes_alone(comm: &Comm) {
    let me = comm.rank() as usize;
    let store = child_store();
    for (round, polled) in [(0, false), (1, true), (2, false)] {
        let told = format!("posted-test/a-done-{round}");
        if me == 1 {
            let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 200]);
            let wa = irecv(comm, &mut a, DType::U8, 0, 1);
            let wb = irecv(comm, &mut b, DType::U8, 0, 2);
            match polled {
                true => poll_until_finished(std::slice::from_ref(&wa)),
                false => wa.wait_blocking().unwrap(),
            }
            assert!(!wb.status().is_finished(), "B's message is not sent yet");
            store.set(&told, b"1").unwrap();
            wb.wait_blocking().unwrap();
            wa.wait_blocking().unwrap();
            assert!(a == payload(0, 1, 100 + round, 100), "message A");
            assert!(b == payload(0, 1, 200 + round, 200), "message B");
        } else if me == 0 {
            std::thread::sleep(POSTING);
            let mut a = payload(0, 1, 100 + round, 100);
            let sa = isend(comm, &mut a, DType::U8, 1, 1);
            store
                .wait(&[told.as_str()], Some(Duration::from_secs(20)))
                .expect("rank 1 saw receive A complete before B's message was sent");
            let mut b = payload(0, 1, 200 + round, 200);
            isend(comm, &mut b, DType::U8, 1, 2)
                .wait_blocking()
                .unwrap();
            sa.wait_blocking().unwrap();
        }
        run(comm, Op::Barrier).unwrap();
    }
}

/// The posted receives' entries in the flight recorder completed.
fn recorded(comm: &Comm) {
    let dump = comm.dump_flight_recorder();
    assert!(
        dump.lines()
            .any(|l| l.contains("recv") && l.contains("completed")),
        "{dump}"
    );
    assert!(
        !dump.contains("in progress"),
        "every entry finished: {dump}"
    );
}

fn child() {
    let comm = child_comm("shm-p2p-posted", TIMEOUT);
    every_dtype_posted_first(&comm);
    from_every_peer_at_once(&comm);
    dependent_operations_in_order(&comm);
    earlier_receive_completes_alone(&comm);
    recorded(&comm);
    run(&comm, Op::Barrier).unwrap();
    println!("RESULT ok");
}

fn job(test: &str, n: usize) {
    shm_p2p_job(test, "posted", n);
}

#[test]
fn gloo_shm_p2p_posted_2() {
    if role().is_some() {
        return child();
    }
    job("gloo_shm_p2p_posted_2", 2);
}

#[test]
fn gloo_shm_p2p_posted_3() {
    if role().is_some() {
        return child();
    }
    job("gloo_shm_p2p_posted_3", 3);
}

#[test]
fn gloo_shm_p2p_posted_4() {
    if role().is_some() {
        return child();
    }
    job("gloo_shm_p2p_posted_4", 4);
}

/// Ranks 0 and 1 post windows of receives from rank 2, which sends the
/// first half and is killed: those complete, and every other one fails
/// with TC_ERR_REMOTE naming rank 2 well before the 30 s timeout.
#[test]
fn gloo_shm_p2p_posted_dead_peer_named() {
    const LONG: Duration = Duration::from_secs(30);
    const M: usize = 16;
    if role().is_some() {
        let comm = child_comm("shm-p2p-posted-dead", LONG);
        run(&comm, Op::Barrier).unwrap();
        let me = comm.rank() as usize;
        if me == 2 {
            std::thread::sleep(POSTING);
            let mut outs: Vec<Vec<u8>> = (0..M / 2).map(|k| payload(2, 0, k, 64)).collect();
            for q in [0, 1] {
                for b in outs.iter_mut() {
                    run(&comm, Op::send(ptr(b), b.len(), DType::U8, q, 0)).unwrap();
                }
            }
            std::thread::sleep(Duration::from_millis(300));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut ins: Vec<Vec<u8>> = (0..M).map(|_| vec![0u8; 64]).collect();
        let works: Vec<Arc<dyn Work>> = ins
            .iter_mut()
            .map(|b| irecv(&comm, b, DType::U8, 2, 0))
            .collect();
        let began = Instant::now();
        for (k, w) in works.iter().enumerate() {
            let r = w.wait_blocking();
            if k < M / 2 {
                r.unwrap();
                continue;
            }
            // The first to fail found the peer gone; the others failed
            // with it, or with the comm it aborted, naming the peer.
            let e = r.unwrap_err();
            let kinds = match k == M / 2 {
                true => &[ErrorKind::Remote][..],
                false => &[ErrorKind::Remote, ErrorKind::Aborted][..],
            };
            assert!(kinds.contains(&e.kind), "receive {k}: {e}");
            assert!(
                e.message.contains("rank 2's process exited"),
                "receive {k}: {e}"
            );
        }
        let took = began.elapsed();
        println!("RESULT ms={}", took.as_millis());
        assert!(took < Duration::from_secs(5), "seen after {took:?}");
        for (k, got) in ins[..M / 2].iter().enumerate() {
            assert!(*got == payload(2, 0, k, 64), "message {k}");
        }
        return;
    }
    let out = launch(
        "gloo_shm_p2p_posted_dead_peer_named",
        "dead",
        3,
        &[],
        Duration::from_secs(90),
    );
    out[2].assert_killed();
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

/// Rank 0 posts receives from rank 1, which never sends, and aborts the
/// comm from another thread: every receive fails at once with the abort,
/// none at the 30 s timeout, and the flight recorder shows them failed.
#[test]
fn gloo_shm_p2p_posted_abort() {
    const LONG: Duration = Duration::from_secs(30);
    if role().is_some() {
        let comm = child_comm("shm-p2p-posted-abort", LONG);
        run(&comm, Op::Barrier).unwrap();
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_secs(3));
            println!("RESULT idle");
            return;
        }
        let mut ins: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 64]).collect();
        let works: Vec<Arc<dyn Work>> = ins
            .iter_mut()
            .map(|b| irecv(&comm, b, DType::U8, 1, 0))
            .collect();
        let aborter = {
            let comm = comm.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                comm.abort();
            })
        };
        let began = Instant::now();
        for w in works.iter().rev() {
            let e = w.wait_blocking().unwrap_err();
            assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
        }
        let took = began.elapsed();
        aborter.join().unwrap();
        assert!(took < Duration::from_secs(5), "ended after {took:?}");
        let dump = comm.dump_flight_recorder();
        let receives: Vec<&str> = dump.lines().filter(|l| l.contains("recv")).collect();
        assert_eq!(receives.len(), 16, "{dump}");
        assert!(receives.iter().all(|l| l.contains("failed")), "{dump}");
        println!("RESULT ms={}", took.as_millis());
        return;
    }
    let out = launch(
        "gloo_shm_p2p_posted_abort",
        "abort",
        2,
        &[],
        Duration::from_secs(90),
    );
    assert_all_ok(&out);
    assert!(
        out[0].results()[0].starts_with("ms="),
        "{}",
        out[0].describe()
    );
}
