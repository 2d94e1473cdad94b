//! One-sided windows over UCX (UCP remote memory access) with real
//! processes over TCP loopback (shared memory off, `UCX_TLS=tcp,self`,
//! UCX as the host transport), 2, 3 and 4 ranks: every rank puts to and
//! gets from every other at 0 bytes, a few bytes and more than 8 KiB (UCX's
//! rendezvous), signals and waits, everything checked byte by byte, then a
//! second registration; a put then a signal seen in order; a killed peer
//! failing the survivors' window calls, naming it, well before the
//! timeout; bad arguments refused naming the argument; a target that makes
//! no call still served; asynchronous calls on a ring, then the comm's
//! abort ending a pending wait and failing the peers' waits. Each test
//! checks that its windows went over UCX (the INFO line of a UCX window),
//! so that a silent fallback to the Gloo windows fails it, a hierarchical
//! comm's too (whose same-host peers map each other's `tc_mem_alloc`
//! buffers). Every test says SKIPPED (and passes) where libucp.so.0 is
//! missing.

mod gloo_common;
mod ucx_common;

use gloo_common::*;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::{Comm, ErrorKind, OpOptions, Window};
use ucx_common::*;

const TIMEOUT: Duration = Duration::from_secs(30);
const FILL: u8 = 0xee;
/// Each origin's area in a target's buffer.
const SLOT: usize = 32 * 1024;
const SMALL: usize = 13;
/// Past UCX's 8 KiB rendezvous threshold.
const LARGE: usize = 20_000;
/// What every rank's log must say: its windows went over UCX.
const UCX_WINDOW_LINE: &str = "(UCP remote memory access)";

fn opts() -> OpOptions {
    OpOptions::default()
}

fn cptr(v: &[u8]) -> *const c_void {
    v.as_ptr() as *const c_void
}

fn mptr(v: &mut [u8]) -> *mut c_void {
    v.as_mut_ptr() as *mut c_void
}

/// Byte i of what `origin` puts into `target` in round `round`.
fn byte(origin: usize, target: usize, round: usize, i: usize) -> u8 {
    ((origin * 37 + target * 11 + round * 101 + i * 7 + i / 251) % 251) as u8 + 1
}

fn launch_ucx(test: &str, role: &str, size: usize, limit: Duration) -> Vec<Outcome> {
    let mut env = LOOPBACK_ENV.to_vec();
    env.push(("TORCHCOMM_DEBUG", "INFO"));
    launch(test, role, size, &env, limit)
}

/// Every rank succeeded, printed `RESULT done`, and made its windows over
/// UCX.
fn assert_done_over_ucx(out: &[Outcome]) {
    assert_all_ok(out);
    for o in out {
        assert!(o.results().iter().any(|r| r == "done"), "{}", o.describe());
        assert!(
            o.stderr.contains(UCX_WINDOW_LINE),
            "rank {}'s window did not go over UCX: {}",
            o.rank,
            o.describe()
        );
    }
}

/// Runs 3 ranks of `test` in `role`, rank 2 of which kills itself: it must
/// die by SIGKILL, and the other two succeed over UCX (their results
/// printed for the log).
fn survivors_of_rank_2_killed(test: &str, role: &str) {
    let out = launch_ucx(test, role, 3, Duration::from_secs(120));
    out[2].assert_killed();
    for o in &out[..2] {
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
    assert_done_over_ucx(&out[..2]);
}

/// What `origin` wrote into `target`'s slot in `round`: SMALL bytes at the
/// slot's start, LARGE bytes from 64 on.
fn expected_slot(origin: usize, target: usize, round: usize) -> Vec<u8> {
    let mut v = vec![FILL; SLOT];
    for (i, b) in v[..SMALL].iter_mut().enumerate() {
        *b = byte(origin, target, round, i);
    }
    for (i, b) in v[64..64 + LARGE].iter_mut().enumerate() {
        *b = byte(origin, target, round, i + 1000);
    }
    v
}

/// One round on a registered buffer of `n` slots: every rank puts (0,
/// small and large) into every other's slot of its own, signals it, waits
/// for every peer's signal, checks its whole buffer byte by byte, then gets
/// back what it wrote into every peer (and a 0-byte get) and checks it.
fn all_pairs_round(win: &Window, mem: &mut [u8], me: usize, n: usize, round: usize) {
    let o = opts();
    for t in (0..n).filter(|t| *t != me) {
        let want = expected_slot(me, t, round);
        let at = me * SLOT;
        win.put(cptr(&want), 0, t as i32, at, &o).unwrap();
        win.put(cptr(&want[..SMALL]), SMALL, t as i32, at, &o)
            .unwrap();
        win.put(cptr(&want[64..64 + LARGE]), LARGE, t as i32, at + 64, &o)
            .unwrap();
        win.signal(t as i32, &o).unwrap();
    }
    for s in (0..n).filter(|s| *s != me) {
        win.wait_signal(s as i32, &o).unwrap();
    }
    for s in 0..n {
        let slot = &mem[s * SLOT..(s + 1) * SLOT];
        let want = match s == me {
            true => vec![FILL; SLOT],
            false => expected_slot(s, me, round),
        };
        for (i, (g, w)) in slot.iter().zip(&want).enumerate() {
            assert_eq!(
                g, w,
                "rank {me} round {round}: byte {i} of rank {s}'s slot differs"
            );
        }
    }
    for t in (0..n).filter(|t| *t != me) {
        let want = expected_slot(me, t, round);
        let mut got = vec![0u8; SLOT];
        win.get(mptr(&mut got), SLOT, t as i32, me * SLOT, &o)
            .unwrap();
        assert!(got == want, "rank {me} round {round}: get from rank {t}");
        let mut small = [0u8; SMALL];
        win.get(mptr(&mut small), SMALL, t as i32, me * SLOT, &o)
            .unwrap();
        assert_eq!(&small[..], &want[..SMALL], "rank {me}: small get from {t}");
        win.get(mptr(&mut small), 0, t as i32, 0, &o).unwrap();
    }
    // Nobody changes a buffer while a peer may still read it.
    win.signal(((me + 1) % n) as i32, &o).unwrap();
    win.wait_signal(((me + n - 1) % n) as i32, &o).unwrap();
}

fn all_pairs_child() {
    let comm: Arc<Comm> = child_comm("ucxwin", TIMEOUT);
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let win = Window::new(&comm).unwrap();
    for round in 0..2 {
        // A registration each round, the second at another address.
        let mut mem = vec![FILL; n * SLOT + 8 * round];
        win.register(mptr(&mut mem), mem.len()).unwrap();
        all_pairs_round(&win, &mut mem, me, n, round);
        win.deregister().unwrap();
    }
    drop(win);
    comm.finalize().unwrap();
    println!("RESULT done");
}

fn all_pairs(test: &str, n: usize) {
    if role().is_some() {
        return all_pairs_child();
    }
    if ucx_missing() {
        return;
    }
    assert_done_over_ucx(&launch_ucx(test, "child", n, Duration::from_secs(240)));
}

#[test]
fn ucx_window_all_pairs_2() {
    all_pairs("ucx_window_all_pairs_2", 2);
}

#[test]
fn ucx_window_all_pairs_3() {
    all_pairs("ucx_window_all_pairs_3", 3);
}

#[test]
fn ucx_window_all_pairs_4() {
    all_pairs("ucx_window_all_pairs_4", 4);
}

/// Rank 0 puts a large block then signals, many rounds, each with new
/// bytes; rank 1 checks each round's block as the signal comes, then
/// answers so that the next round may overwrite it.
#[test]
fn ucx_window_put_then_signal_in_order() {
    const ROUNDS: usize = 50;
    if role().is_some() {
        let comm = child_comm("ordered", TIMEOUT);
        let me = comm.rank() as usize;
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![FILL; LARGE];
        win.register(mptr(&mut mem), LARGE).unwrap();
        let o = opts();
        for round in 0..ROUNDS {
            if me == 0 {
                let block: Vec<u8> = (0..LARGE).map(|i| byte(0, 1, round, i)).collect();
                win.put(cptr(&block), LARGE, 1, 0, &o).unwrap();
                win.signal(1, &o).unwrap();
                win.wait_signal(1, &o).unwrap();
            } else {
                win.wait_signal(0, &o).unwrap();
                for (i, b) in mem.iter().enumerate() {
                    assert_eq!(
                        *b,
                        byte(0, 1, round, i),
                        "round {round}: byte {i} not landed before the signal"
                    );
                }
                win.signal(0, &o).unwrap();
            }
        }
        win.deregister().unwrap();
        drop(win);
        comm.finalize().unwrap();
        println!("RESULT done");
        return;
    }
    if ucx_missing() {
        return;
    }
    assert_done_over_ucx(&launch_ucx(
        "ucx_window_put_then_signal_in_order",
        "ordered",
        2,
        Duration::from_secs(120),
    ));
}

/// Rank 2 dies after registering: the survivors' wait for its signal and
/// their put and signal to it fail with TC_ERR_REMOTE naming rank 2, well
/// before the 30 s timeout.
#[test]
fn ucx_window_peer_killed() {
    const WAIT: Duration = Duration::from_secs(30);
    const SOON: Duration = Duration::from_secs(10);
    if role().is_some() {
        let comm = child_comm("killed", TIMEOUT);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; 64];
        win.register(mptr(&mut mem), mem.len()).unwrap();
        if me == 2 {
            std::thread::sleep(Duration::from_millis(300));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let o = OpOptions {
            timeout: Some(WAIT),
            ..OpOptions::default()
        };
        let start = Instant::now();
        let e = win.wait_signal(2, &o).map(drop).unwrap_err();
        println!(
            "RESULT wait kind={:?} ms={} msg={}",
            e.kind,
            start.elapsed().as_millis(),
            e.message
        );
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        assert!(e.message.contains("rank 2"), "{e}");
        assert!(start.elapsed() < SOON, "took {:?}: {e}", start.elapsed());
        let b = [1u8; 4];
        let start = Instant::now();
        let e = win
            .put(cptr(&b), 4, 2, 0, &o)
            .and_then(|_| win.signal(2, &o))
            .map(drop)
            .unwrap_err();
        println!("RESULT put kind={:?} msg={}", e.kind, e.message);
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        assert!(e.message.contains("rank 2"), "{e}");
        assert!(start.elapsed() < SOON, "took {:?}: {e}", start.elapsed());
        let _ = win.deregister();
        drop(win);
        println!("RESULT done");
        return;
    }
    if ucx_missing() {
        return;
    }
    survivors_of_rank_2_killed("ucx_window_peer_killed", "killed");
}

/// Out-of-range offsets and sizes, and ranks that are not the comm's, are
/// refused with TC_ERR_INVALID_ARGUMENT naming the argument; the window
/// works afterwards.
#[test]
fn ucx_window_bad_arguments() {
    if role().is_some() {
        let comm = child_comm("bad", TIMEOUT);
        let (me, n) = (comm.rank(), comm.size());
        let peer = (me + 1) % n;
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![FILL; 1024];
        win.register(mptr(&mut mem), mem.len()).unwrap();
        let o = opts();
        let b = vec![7u8; 2048];
        let mut d = vec![0u8; 2048];
        let refused = |r: torchcomm::Result<Arc<dyn torchcomm::Work>>, arg: &str| {
            let e = r.map(drop).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{arg}: {e}");
            assert!(e.message.contains(arg), "{arg} not named: {e}");
        };
        refused(win.put(cptr(&b), 8, n, 0, &o), "dst_rank");
        refused(win.put(cptr(&b), 8, -1, 0, &o), "dst_rank");
        refused(win.put(cptr(&b), 8, peer, 1020, &o), "dst_offset");
        refused(win.put(cptr(&b), 2048, peer, 0, &o), "dst_offset");
        refused(win.put(cptr(&b), 8, peer, usize::MAX - 2, &o), "dst_offset");
        refused(win.get(mptr(&mut d), 8, n + 3, 0, &o), "src_rank");
        refused(win.get(mptr(&mut d), 8, peer, 1017, &o), "src_offset");
        refused(win.get(mptr(&mut d), 1025, peer, 0, &o), "src_offset");
        refused(win.signal(n, &o), "peer");
        refused(win.wait_signal(-2, &o), "peer");
        // Still usable: one put and signal around the ring.
        win.put(cptr(&b), 8, peer, 1016, &o).unwrap();
        win.signal(peer, &o).unwrap();
        win.wait_signal((me + n - 1) % n, &o).unwrap();
        assert_eq!(&mem[1016..], &[7u8; 8]);
        win.deregister().unwrap();
        drop(win);
        comm.finalize().unwrap();
        println!("RESULT done");
        return;
    }
    if ucx_missing() {
        return;
    }
    assert_done_over_ucx(&launch_ucx(
        "ucx_window_bad_arguments",
        "bad",
        2,
        Duration::from_secs(120),
    ));
}

/// Rank 1 makes no call for 2 s after registering: rank 0's gets, puts
/// and signals to it still complete at once (over TCP, UCX emulates them
/// with messages that rank 1's comm progresses while it is idle).
#[test]
fn ucx_window_idle_target() {
    const IDLE: Duration = Duration::from_secs(2);
    if role().is_some() {
        let comm = child_comm("idle", TIMEOUT);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem: Vec<u8> = (0..LARGE).map(|i| byte(1, 0, 0, i)).collect();
        win.register(mptr(&mut mem), LARGE).unwrap();
        let o = opts();
        if me == 1 {
            let cpu = || {
                let mut u: libc::rusage = unsafe { std::mem::zeroed() };
                unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
                let us = |t: libc::timeval| t.tv_sec * 1_000_000 + t.tv_usec;
                us(u.ru_utime) + us(u.ru_stime)
            };
            let before = cpu();
            std::thread::sleep(IDLE);
            // What the comm's idle progress cost this rank meanwhile.
            println!("RESULT idle cpu_ms={}", (cpu() - before) / 1000);
            win.wait_signal(0, &o).unwrap();
            assert!(mem[..SMALL].iter().all(|b| *b == 9), "the put landed");
        } else {
            let start = Instant::now();
            let mut got = vec![0u8; LARGE];
            for _ in 0..10 {
                win.get(mptr(&mut got), LARGE, 1, 0, &o).unwrap();
            }
            let want: Vec<u8> = (0..LARGE).map(|i| byte(1, 0, 0, i)).collect();
            assert!(got == want, "the get read rank 1's buffer");
            win.put(cptr(&[9u8; SMALL]), SMALL, 1, 0, &o).unwrap();
            win.signal(1, &o).unwrap();
            let took = start.elapsed();
            println!("RESULT took ms={}", took.as_millis());
            assert!(took < IDLE / 2, "took {took:?} while rank 1 was idle");
        }
        win.deregister().unwrap();
        drop(win);
        comm.finalize().unwrap();
        println!("RESULT done");
        return;
    }
    if ucx_missing() {
        return;
    }
    let out = launch_ucx(
        "ucx_window_idle_target",
        "idle",
        2,
        Duration::from_secs(120),
    );
    for o in &out {
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
    assert_done_over_ucx(&out);
}

/// Asynchronous calls on 3 ranks: a ring of 20 rounds, each an
/// asynchronous wait for the predecessor's signal posted first, then a put
/// (64 or 20000 bytes, blocking or asynchronous) and a signal to the
/// successor, each round's bytes checked. Then rank 0 aborts its comm
/// while an asynchronous wait for rank 1 is pending: the wait ends within
/// 1 s, and ranks 1 and 2, waiting for rank 0's signal (30 s timeout),
/// fail within 5 s.
#[test]
fn ucx_window_async_ring_then_abort() {
    const ROUNDS: usize = 20;
    const REGION: usize = 32 * 1024;
    if role().is_some() {
        let comm = child_comm("async_abort", TIMEOUT);
        let (me, n) = (comm.rank() as usize, comm.size() as usize);
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![FILL; ROUNDS * REGION];
        win.register(mptr(&mut mem), mem.len()).unwrap();
        let len = |round: usize| if round % 2 == 0 { 64 } else { LARGE };
        let data = |r: usize, round: usize| -> Vec<u8> {
            (0..len(round)).map(|i| byte(r, 0, round, i)).collect()
        };
        let srcs: Vec<Vec<u8>> = (0..ROUNDS).map(|round| data(me, round)).collect();
        let asynchronous = OpOptions {
            async_op: true,
            ..OpOptions::default()
        };
        let mut works = Vec::new();
        for round in 0..ROUNDS {
            let wait = win.wait_signal(prev as i32, &asynchronous).unwrap();
            let o = match round % 3 {
                0 => opts(),
                _ => asynchronous.clone(),
            };
            works.push(
                win.put(
                    cptr(&srcs[round]),
                    len(round),
                    next as i32,
                    round * REGION,
                    &o,
                )
                .unwrap(),
            );
            works.push(win.signal(next as i32, &o).unwrap());
            wait.wait_blocking()
                .unwrap_or_else(|e| panic!("rank {me}, round {round}: the wait failed: {e}"));
            let at = round * REGION;
            assert!(
                mem[at..at + len(round)] == data(prev, round)[..],
                "rank {me}, round {round}"
            );
            assert!(mem[at + len(round)..at + REGION].iter().all(|b| *b == FILL));
        }
        for w in &works {
            w.wait_blocking().unwrap();
        }
        // Every rank is past the ring before rank 0 aborts.
        win.signal(next as i32, &opts()).unwrap();
        win.wait_signal(prev as i32, &opts()).unwrap();
        let long = OpOptions {
            timeout: Some(Duration::from_secs(30)),
            ..asynchronous.clone()
        };
        if me == 0 {
            let w = win.wait_signal(1, &long).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            let start = Instant::now();
            comm.abort();
            let e = w.wait_blocking().map(drop).unwrap_err();
            println!(
                "RESULT abort kind={:?} ms={} msg={}",
                e.kind,
                start.elapsed().as_millis(),
                e.message
            );
            assert!(start.elapsed() < Duration::from_secs(1), "{e}");
        } else {
            let start = Instant::now();
            let e = win
                .wait_signal(0, &long)
                .and_then(|w| w.wait_blocking().map(|_| w))
                .map(drop)
                .unwrap_err();
            println!(
                "RESULT peer kind={:?} ms={} msg={}",
                e.kind,
                start.elapsed().as_millis(),
                e.message
            );
            assert!(start.elapsed() < Duration::from_secs(5), "{e}");
        }
        drop(win);
        println!("RESULT done");
        return;
    }
    if ucx_missing() {
        return;
    }
    let out = launch_ucx(
        "ucx_window_async_ring_then_abort",
        "async_abort",
        3,
        Duration::from_secs(120),
    );
    for o in &out {
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
    assert_done_over_ucx(&out);
}

/// Rank 2 dies after registering, and ranks 0 and 1 deregister (collective,
/// 30 s timeout): both fail naming rank 2 within 10 s.
#[test]
fn ucx_window_peer_killed_before_deregister() {
    if role().is_some() {
        let comm = child_comm("killed_dereg", TIMEOUT);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; 64];
        win.register(mptr(&mut mem), mem.len()).unwrap();
        if me == 2 {
            std::thread::sleep(Duration::from_millis(300));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(600));
        let start = Instant::now();
        let e = win.deregister().unwrap_err();
        println!(
            "RESULT deregister kind={:?} ms={} msg={}",
            e.kind,
            start.elapsed().as_millis(),
            e.message
        );
        assert!(e.message.contains("rank 2"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(10), "{e}");
        drop(win);
        println!("RESULT done");
        return;
    }
    if ucx_missing() {
        return;
    }
    survivors_of_rank_2_killed("ucx_window_peer_killed_before_deregister", "killed_dereg");
}

/// A hierarchical comm (2 hosts of 2 ranks, told apart by
/// `TORCHCOMM_HOST_ID`) over UCX between hosts makes its windows over UCX
/// too: every pair's puts, signals and gets are right; `map_remote` maps
/// the `tc_mem_alloc` buffer of the peer on this rank's host (stores
/// through it, published by a signal, land there) and refuses the other
/// host's ranks, naming why.
#[test]
fn ucx_window_hierarchical_comm_maps_same_host_peers() {
    if role().is_some() {
        std::env::set_var("TORCHCOMM_HOST_ID", format!("host-{}", rank() / 2));
        let comm: Arc<Comm> = child_comm("hierwin", TIMEOUT);
        let (me, n) = (comm.rank() as usize, comm.size() as usize);
        let win = Window::new(&comm).unwrap();
        let bytes = n * SLOT;
        let buf = comm.alloc_memory(bytes).unwrap() as *mut u8;
        let mem = unsafe { std::slice::from_raw_parts_mut(buf, bytes) };
        mem.fill(FILL);
        win.register(buf as *mut c_void, bytes).unwrap();
        all_pairs_round(&win, mem, me, n, 0);
        // Every rank done reading its buffer before stores land there.
        run(&comm, torchcomm::Op::Barrier).unwrap();
        let neighbour = me ^ 1; // the other rank of this host
        for q in (0..n).filter(|q| *q != me) {
            match win.map_remote(q as i32) {
                Ok(p) => {
                    assert_eq!(q, neighbour, "rank {q} is on another host, yet mapped");
                    // A store through the mapping, published by a signal.
                    let at = unsafe { (p as *mut u8).add(me * SLOT) };
                    unsafe { std::ptr::write_bytes(at, 0x5a, 64) };
                    // A put to the mapped peer is a copy through the
                    // mapping: in the peer's memory when it returns (over
                    // UCX it would still be on its way: the peer's worker
                    // has not progressed since).
                    let put = [0xa5u8; 64];
                    win.put(cptr(&put), 64, q as i32, me * SLOT + 64, &opts())
                        .unwrap();
                    let landed = unsafe { std::slice::from_raw_parts(at.add(64), 64) };
                    assert!(
                        landed == put,
                        "a put to the mapped same-host peer was not in its memory on return"
                    );
                    let mut got = [0u8; 128];
                    win.get(mptr(&mut got), 128, q as i32, me * SLOT, &opts())
                        .unwrap();
                    assert!(
                        got[..64].iter().all(|b| *b == 0x5a) && got[64..] == put,
                        "a get from the mapped same-host peer"
                    );
                }
                Err(e) => {
                    assert_ne!(q, neighbour, "the same-host peer was not mapped: {e}");
                    assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
                    assert!(e.message.contains("tc_mem_alloc"), "{e}");
                }
            }
        }
        win.signal(neighbour as i32, &opts()).unwrap();
        win.wait_signal(neighbour as i32, &opts()).unwrap();
        let from = &mem[neighbour * SLOT..neighbour * SLOT + 128];
        assert!(
            from[..64].iter().all(|b| *b == 0x5a) && from[64..].iter().all(|b| *b == 0xa5),
            "the neighbour's stores and put did not land"
        );
        run(&comm, torchcomm::Op::Barrier).unwrap();
        win.deregister().unwrap();
        drop(win);
        comm.free_memory(buf as *mut c_void).unwrap();
        comm.finalize().unwrap();
        println!("RESULT done");
        return;
    }
    if ucx_missing() {
        return;
    }
    let env = [
        ("TORCHCOMM_HOST_TRANSPORT", "ucx"),
        ("UCX_TLS", "tcp,self"),
        ("TORCHCOMM_DEBUG", "INFO"),
    ];
    let test = "ucx_window_hierarchical_comm_maps_same_host_peers";
    let out = launch(test, "child", 4, &env, Duration::from_secs(240));
    assert_all_ok(&out);
    for o in &out {
        assert!(o.results().iter().any(|r| r == "done"), "{}", o.describe());
        assert!(
            o.stderr.contains("hierarchical collectives on"),
            "{}",
            o.describe()
        );
        assert!(o.stderr.contains(UCX_WINDOW_LINE), "{}", o.describe());
    }
}
