//! Point-to-point through shared memory (gloo backend, every rank on this
//! host), with real processes of 2, 3 and 4 ranks: ring exchanges where
//! every rank sends first, sizes from 0 bytes to several times the ring,
//! many messages in flight, batches with several transfers to the same and
//! to different peers, a receive posted long before its send, a receive
//! that does not match its message, every byte checked; the same job over
//! Gloo (`TORCHCOMM_SHM_P2P=0`, and the hint `gloo.shm_p2p=0`); a peer killed in the
//! middle of transfers named at once by the survivors; a stopped peer
//! reported at the timeout.

mod gloo_common;

use gloo_common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::DType;
use torchcomm::ErrorKind;
use torchcomm::Work;
use torchcomm::{Comm, Op, OpOptions, P2p};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The ring of one pair is 1 MiB: these go through it in pieces.
const BIG: [usize; 3] = [(1 << 20) + 17, 3 << 20, (5 << 20) + 3];
const SMALL: [usize; 7] = [0, 1, 3, 4, 31, 4093, 65_536];

/// The bytes rank `from` sends to rank `to` as its message `k`.
fn payload(from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ (from * 7 + to * 13 + k * 29)) as u8)
        .collect()
}

fn send(buf: &mut [u8], peer: usize) -> Op {
    Op::send(ptr(buf), buf.len(), DType::U8, peer as i32, 0)
}

fn recv(buf: &mut [u8], peer: usize) -> Op {
    Op::recv(ptr(buf), buf.len(), DType::U8, peer as i32, 0)
}

fn start(comm: &Comm, op: Op) -> Arc<dyn Work> {
    let opts = OpOptions {
        async_op: true,
        ..Default::default()
    };
    comm.submit(op, &opts).unwrap()
}

fn transfer(is_send: bool, buf: &mut [u8], peer: usize) -> P2p {
    P2p {
        is_send,
        buf: ptr(buf),
        count: buf.len(),
        dtype: DType::U8,
        peer: peer as i32,
        tag: 0,
        source: None,
    }
}

/// Every rank sends to the next first (blocking), then receives from the
/// previous: buffered sends, and sends larger than the ring drained by a
/// receiver that is itself blocked sending.
fn ring_send_first(comm: &Comm, sizes: &[usize], round: usize) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for (k, len) in sizes.iter().enumerate() {
        let k = k + round * 100;
        let mut out = payload(me, next, k, *len);
        run(comm, send(&mut out, next)).unwrap();
        let mut got = vec![0xa5u8; *len];
        run(comm, recv(&mut got, prev)).unwrap();
        assert!(
            got == payload(prev, me, k, *len),
            "ring message {k} of {len} bytes"
        );
    }
}

/// Every rank starts many sends to every peer and many receives from
/// every peer, then waits for all: even ranks start all their sends first
/// (more than a ring holds: the receivers keep them as early messages),
/// odd ranks alternate send and receive. (Started operations run one at a
/// time in order, so each rank's order must not wait on itself.)
fn many_in_flight(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let sizes = |from: usize, to: usize, k: usize| (from * 3 + to * 5 + k * 977) % 40_000;
    const M: usize = 40;
    let mut outs: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    let mut ins: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    for k in 0..M {
        for q in (0..n).filter(|q| *q != me) {
            outs.push((q, k, payload(me, q, k, sizes(me, q, k))));
            ins.push((q, k, vec![0x5au8; sizes(q, me, k)]));
        }
    }
    let mut works = Vec::new();
    if me % 2 == 0 {
        for (q, _, b) in outs.iter_mut() {
            works.push(start(comm, send(b, *q)));
        }
        for (q, _, b) in ins.iter_mut() {
            works.push(start(comm, recv(b, *q)));
        }
    } else {
        for ((q, _, o), (p, _, i)) in outs.iter_mut().zip(ins.iter_mut()) {
            works.push(start(comm, send(o, *q)));
            works.push(start(comm, recv(i, *p)));
        }
    }
    for w in works {
        w.wait_blocking().unwrap();
    }
    for (q, k, got) in &ins {
        assert!(
            *got == payload(*q, me, *k, got.len()),
            "message {k} from {q}"
        );
    }
}

/// One batch: to every peer two sends of uneven sizes (one above the ring)
/// and from every peer two receives, receives listed first on odd ranks.
fn batches(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let len = |from: usize, to: usize, k: usize| match k {
        0 => from * 10 + to + 1,
        _ => (1 << 20) + from * 1000 + to * 7,
    };
    let mut outs: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut ins: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    for q in (0..n).filter(|q| *q != me) {
        for k in 0..2 {
            outs.push((q, payload(me, q, 500 + k, len(me, q, k))));
            ins.push((q, k, vec![0u8; len(q, me, k)]));
        }
    }
    let mut ops: Vec<P2p> = Vec::new();
    let sends: Vec<P2p> = outs
        .iter_mut()
        .map(|(q, b)| transfer(true, b, *q))
        .collect();
    let recvs: Vec<P2p> = ins
        .iter_mut()
        .map(|(q, _, b)| transfer(false, b, *q))
        .collect();
    if me % 2 == 1 {
        ops.extend(recvs);
        ops.extend(sends);
    } else {
        ops.extend(sends);
        ops.extend(recvs);
    }
    run(comm, Op::batch(ops)).unwrap();
    for (q, k, got) in &ins {
        assert!(
            *got == payload(*q, me, 500 + k, got.len()),
            "batch {k} from {q}"
        );
    }
}

/// Rank 0 streams 1500 small messages to rank 1, which receives them as
/// they come: through Gloo, more sends than are ever buffered at once
/// (1024), so later sends first wait for the oldest (received by then);
/// every message checked.
fn stream(comm: &Comm) {
    const COUNT: usize = 1500;
    match comm.rank() {
        0 => {
            for k in 0..COUNT {
                let mut out = payload(0, 1, 2000 + k, 12);
                run(comm, send(&mut out, 1)).unwrap();
            }
        }
        1 => {
            for k in 0..COUNT {
                let mut got = vec![0u8; 12];
                run(comm, recv(&mut got, 0)).unwrap();
                assert!(got == payload(0, 1, 2000 + k, 12), "stream message {k}");
            }
        }
        _ => {}
    }
}

/// Rank 0 receives from the last rank long before that rank sends; the
/// receive that does not match its message fails on the receiver, the pair
/// stays usable.
fn late_send_and_mismatch(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let last = n - 1;
    if me == 0 {
        let mut got = vec![0u8; 777];
        let w = start(comm, recv(&mut got, last));
        w.wait_blocking().unwrap();
        assert!(got == payload(last, 0, 900, 777));
    } else if me == last {
        std::thread::sleep(Duration::from_millis(300));
        let mut out = payload(last, 0, 900, 777);
        run(comm, send(&mut out, 0)).unwrap();
    }
    let mut f = vec![1.5f32; 12];
    if me == 0 {
        let op = Op::send(ptr(&mut f), 10, DType::F32, last as i32, 0);
        run(comm, op).unwrap();
    } else if me == last {
        let op = Op::recv(ptr(&mut f), 12, DType::F32, 0, 0);
        let e = run(comm, op).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(
            e.message.contains("12 float32") && e.message.contains("10 float32"),
            "{e}"
        );
        assert!(f.iter().all(|x| *x == 1.5), "nothing landed");
    }
    ring_send_first(comm, &[5, 70_000], 9);
}

/// The comm of the exchanges: with `TC_TEST_P2P_HINT_OFF=1`, point-to-point
/// is kept on Gloo by the comm's hint `gloo.shm_p2p=0` (else by the
/// environment, or not at all).
fn exchanges_comm() -> Arc<Comm> {
    if std::env::var("TC_TEST_P2P_HINT_OFF").as_deref() != Ok("1") {
        return child_comm("shm-p2p", TIMEOUT);
    }
    let opts = torchcomm::CommOptions {
        name: Some("shm-p2p".into()),
        timeout: Some(TIMEOUT),
        abort_on_error: Some(false),
        rank: Some(rank()),
        world_size: Some(size()),
        store: Some(child_store()),
        hints: vec![("gloo.shm_p2p".into(), "0".into())],
    };
    Comm::new("gloo", torchcomm::Device::Cpu, opts).unwrap()
}

/// The same job on both paths: through Gloo too, every rank sends first
/// (its sends are buffered, see `gloo::buffered_sends`), and a receive
/// that does not match its message fails on the receiver alone.
fn exchanges_child() {
    let comm = exchanges_comm();
    ring_send_first(&comm, &SMALL, 0);
    ring_send_first(&comm, &BIG, 1);
    many_in_flight(&comm);
    batches(&comm);
    stream(&comm);
    late_send_and_mismatch(&comm);
    run(&comm, Op::Barrier).unwrap();
    println!("RESULT ok");
}

fn exchanges(test: &str, n: usize, shm: bool) {
    exchanges_with(test, n, shm, &[]);
}

fn exchanges_with(test: &str, n: usize, shm: bool, extra: &[(&str, &str)]) {
    let mut env = vec![("TORCHCOMM_DEBUG", "INFO")];
    if extra.is_empty() {
        env.push(("TORCHCOMM_SHM_P2P", if shm { "1" } else { "0" }));
    }
    env.extend_from_slice(extra);
    let out = launch(test, "exchanges", n, &env, Duration::from_secs(240));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
        let on = o.stderr.contains("point-to-point too");
        assert_eq!(on, shm, "rank {}: {}", o.rank, o.describe());
    }
}

#[test]
fn gloo_shm_p2p_exchanges_2() {
    if role().is_some() {
        return exchanges_child();
    }
    exchanges("gloo_shm_p2p_exchanges_2", 2, true);
}

#[test]
fn gloo_shm_p2p_exchanges_3() {
    if role().is_some() {
        return exchanges_child();
    }
    exchanges("gloo_shm_p2p_exchanges_3", 3, true);
}

#[test]
fn gloo_shm_p2p_exchanges_4() {
    if role().is_some() {
        return exchanges_child();
    }
    exchanges("gloo_shm_p2p_exchanges_4", 4, true);
}

/// Every exchange above over Gloo (`TORCHCOMM_SHM_P2P=0`): the switch is
/// honoured and both paths give the same bytes, ranks that all send first
/// included.
#[test]
fn gloo_shm_p2p_off_uses_gloo() {
    if role().is_some() {
        return exchanges_child();
    }
    exchanges("gloo_shm_p2p_off_uses_gloo", 3, false);
}

/// Both-send-first exchanges over Gloo chosen by the comm's hint
/// `gloo.shm_p2p=0`, 2 processes (before buffered sends: every rank's
/// first send waited for a receive that its peer, itself sending, never
/// posted, until the timeout).
#[test]
fn gloo_p2p_hint_off_sends_first_2() {
    if role().is_some() {
        return exchanges_child();
    }
    let hint = [("TC_TEST_P2P_HINT_OFF", "1")];
    exchanges_with("gloo_p2p_hint_off_sends_first_2", 2, false, &hint);
}

/// The same with 3 processes.
#[test]
fn gloo_p2p_hint_off_sends_first_3() {
    if role().is_some() {
        return exchanges_child();
    }
    let hint = [("TC_TEST_P2P_HINT_OFF", "1")];
    exchanges_with("gloo_p2p_hint_off_sends_first_3", 3, false, &hint);
}

/// Rank 2 is killed while it receives from rank 0 and sends to rank 1 in a
/// loop of 4 MiB messages: both survivors fail with TC_ERR_REMOTE naming
/// it well before their 30 s timeout.
#[test]
fn gloo_shm_p2p_dead_peer_named() {
    const LONG: Duration = Duration::from_secs(30);
    if role().is_some() {
        let comm = child_comm("shm-p2p-dead", LONG);
        run(&comm, Op::Barrier).unwrap();
        let me = comm.rank();
        if me == 2 {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(500));
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
        }
        let mut buf = vec![7u8; 4 << 20];
        let started = Instant::now();
        let (e, last) = loop {
            let last = Instant::now();
            let op = match me {
                0 => send(&mut buf, 2),
                1 => recv(&mut buf, 2),
                _ => {
                    run(&comm, recv(&mut buf, 0)).unwrap();
                    send(&mut buf, 1)
                }
            };
            if let Err(e) = run(&comm, op) {
                break (e, last);
            }
            assert!(started.elapsed() < LONG, "the transfers never failed");
        };
        let took = last.elapsed();
        println!(
            "RESULT kind={:?} ms={} msg={}",
            e.kind,
            took.as_millis(),
            e.message
        );
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        assert!(e.message.contains("rank 2's process exited"), "{e}");
        assert!(took < Duration::from_secs(5), "seen after {took:?}: {e}");
        return;
    }
    let out = launch(
        "gloo_shm_p2p_dead_peer_named",
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

/// A stopped receiver (SIGSTOP): a send larger than the ring fails with
/// TC_ERR_TIMEOUT naming it at the comm's timeout, not before, not never.
#[test]
fn gloo_shm_p2p_stopped_peer_times_out() {
    const SHORT: Duration = Duration::from_secs(3);
    if role().is_some() {
        let comm = child_comm("shm-p2p-stopped", SHORT);
        run(&comm, Op::Barrier).unwrap();
        if comm.rank() == 1 {
            unsafe { libc::raise(libc::SIGSTOP) };
            return;
        }
        let mut buf = vec![1u8; 4 << 20];
        let began = Instant::now();
        let e = run(&comm, send(&mut buf, 1)).unwrap_err();
        let took = began.elapsed();
        println!(
            "RESULT kind={:?} ms={} msg={}",
            e.kind,
            took.as_millis(),
            e.message
        );
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(e.message.contains("rank(s) 1 did not complete"), "{e}");
        assert!(took >= SHORT, "failed early ({took:?}): {e}");
        return;
    }
    let out = launch_with(
        "gloo_shm_p2p_stopped_peer_times_out",
        "stopped",
        2,
        &[],
        Duration::from_secs(90),
        |_, children| {
            // Once rank 0 is done, the stopped rank goes.
            if let Ok(Some(_)) = children[0].try_wait() {
                let _ = children[1].kill();
            }
        },
    );
    assert!(out[0].ok(), "{}", out[0].describe());
    assert_eq!(out[0].results().len(), 1, "{}", out[0].describe());
}
