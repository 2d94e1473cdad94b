//! One-sided windows on the gloo backend with real processes (2, 3 and 4
//! ranks): ring puts checked byte for byte, uneven sizes, many small puts
//! under one signal, signals counted (and the wait past them timing out),
//! puts to self, out-of-bounds puts refused at the origin, map_remote,
//! register/deregister twice, and a peer killed while others wait for its
//! signal (no hang). Asynchronous calls (`async_op`): many mixed-size puts
//! and a signal waited out of order, deregister waiting for queued puts, an
//! asynchronous wait on a ring not holding up puts, a blocking put landing
//! after queued ones, freeing a window with queued work, and asynchronous
//! puts to a stopped or killed peer failing through their works. The comm's
//! lifecycle over them: finalize waiting for unwaited asynchronous puts,
//! signals and waits (and reporting a failed one), and the comm's abort (by
//! the application or by a failed operation) ending them with
//! TC_ERR_ABORTED while the peer is stopped.

mod gloo_common;

use gloo_common::*;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::ErrorKind;
use torchcomm::Window;
use torchcomm::{Comm, Op, OpOptions};
use torchcomm::{Work, WorkStatus};

const TIMEOUT: Duration = Duration::from_secs(20);
const FILL: u8 = 0xee;

fn quick(ms: u64) -> OpOptions {
    OpOptions {
        timeout: Some(Duration::from_millis(ms)),
        ..OpOptions::default()
    }
}

fn ptr(v: &mut [u8]) -> *mut c_void {
    v.as_mut_ptr() as *mut c_void
}

/// Size of rank r's first buffer: every rank's differs.
fn first_size(r: i32) -> usize {
    256 + 40 * r as usize
}

/// Byte i of the ring block rank r puts into its successor.
fn ring_byte(r: i32, i: usize) -> u8 {
    (r as u8)
        .wrapping_mul(31)
        .wrapping_add(i as u8)
        .wrapping_add(1)
}

/// Byte i of the small puts rank r makes into its successor.
fn small_byte(r: i32, i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(r as u8) | 1
}

const SMALL_AT: usize = 100;
const SMALL_N: usize = 100;
const SELF_AT: usize = 220;

/// The whole sequence one rank runs.
fn ring_child() {
    let comm: Arc<Comm> = child_comm("win", TIMEOUT);
    let (me, n) = (comm.rank(), comm.size());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let win = Window::new(&comm).unwrap();

    // -- uneven sizes, every rank learns every size
    let mut mem = vec![FILL; first_size(me)];
    win.register(ptr(&mut mem), mem.len()).unwrap();

    // -- ring put of a 16-byte block at this rank's own offset, then signal
    let block: Vec<u8> = (0..16).map(|i| ring_byte(me, i)).collect();
    win.put(
        block.as_ptr() as *const c_void,
        16,
        next,
        16 * me as usize,
        &OpOptions::default(),
    )
    .unwrap();
    // -- many small puts, one signal for all of them
    for i in 0..SMALL_N {
        let b = [small_byte(me, i)];
        win.put(
            b.as_ptr() as *const c_void,
            1,
            next,
            SMALL_AT + i,
            &OpOptions::default(),
        )
        .unwrap();
    }
    win.signal(next, &OpOptions::default()).unwrap();
    win.wait_signal(prev, &OpOptions::default()).unwrap();
    // Only the predecessor writes here: its block and small puts, the rest
    // untouched.
    for (i, b) in mem.iter().enumerate() {
        let want = if (16 * prev as usize..16 * prev as usize + 16).contains(&i) {
            ring_byte(prev, i - 16 * prev as usize)
        } else if (SMALL_AT..SMALL_AT + SMALL_N).contains(&i) {
            small_byte(prev, i - SMALL_AT)
        } else {
            FILL
        };
        assert_eq!(
            *b, want,
            "rank {me}: byte {i} after the ring puts from rank {prev}"
        );
    }

    // -- put to self: synchronous memcpy; a signal to self counts too
    let mine = [0x5au8; 8];
    win.put(
        mine.as_ptr() as *const c_void,
        8,
        me,
        SELF_AT,
        &OpOptions::default(),
    )
    .unwrap();
    assert_eq!(&mem[SELF_AT..SELF_AT + 8], &mine);
    win.signal(me, &OpOptions::default()).unwrap();
    win.wait_signal(me, &OpOptions::default()).unwrap();

    // -- signals are counted: three signals satisfy three waits, a fourth
    //    times out within its timeout + 1 s
    for _ in 0..3 {
        win.signal(next, &OpOptions::default()).unwrap();
    }
    for k in 0..3 {
        win.wait_signal(prev, &OpOptions::default())
            .unwrap_or_else(|e| panic!("rank {me}: wait {k}: {e}"));
    }
    let start = Instant::now();
    let e = win.wait_signal(prev, &quick(400)).map(drop).unwrap_err();
    let took = start.elapsed();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(
        took >= Duration::from_millis(390) && took < Duration::from_millis(1400),
        "took {took:?}"
    );
    assert!(
        e.message.contains("wait_signal") && e.message.contains(&format!("rank {prev}")),
        "{e}"
    );

    // -- out of bounds, refused at the origin and naming the offset; the
    //    window stays usable
    let far = first_size(next) - 4;
    let e = win
        .put(
            block.as_ptr() as *const c_void,
            8,
            next,
            far,
            &OpOptions::default(),
        )
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains(&far.to_string()), "{e}");

    // -- map_remote: own buffer, others unsupported on this backend
    assert_eq!(win.map_remote(me).unwrap(), ptr(&mut mem));
    if n > 1 {
        let e = win.map_remote(next).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
    }

    // -- a last round after the errors: the window still works (the
    //    barrier keeps the predecessor's next signal out of the timed wait)
    run(&comm, Op::Barrier).unwrap();
    let tail = [0x77u8; 4];
    win.put(
        tail.as_ptr() as *const c_void,
        4,
        next,
        240,
        &OpOptions::default(),
    )
    .unwrap();
    win.signal(next, &OpOptions::default()).unwrap();
    win.wait_signal(prev, &OpOptions::default()).unwrap();
    assert_eq!(&mem[240..244], &[0x77; 4]);
    win.deregister().unwrap();
    // After deregister the buffer is not the window's any more.
    let e = win
        .put(
            tail.as_ptr() as *const c_void,
            4,
            next,
            0,
            &OpOptions::default(),
        )
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");

    // -- register again, another buffer and other sizes; a full all-to-all
    //    of puts, each rank signalling every rank
    let second = |r: i32| 8 * n as usize + r as usize;
    let mut mem2 = vec![0u8; second(me)];
    win.register(ptr(&mut mem2), mem2.len()).unwrap();
    for dst in 0..n {
        let b = [me as u8 + 1; 8];
        win.put(
            b.as_ptr() as *const c_void,
            8,
            dst,
            8 * me as usize,
            &OpOptions::default(),
        )
        .unwrap();
        win.signal(dst, &OpOptions::default()).unwrap();
    }
    for src in 0..n {
        win.wait_signal(src, &OpOptions::default()).unwrap();
    }
    for src in 0..n as usize {
        assert_eq!(
            &mem2[8 * src..8 * src + 8],
            &[src as u8 + 1; 8],
            "rank {me}: second registration, block of rank {src}"
        );
    }
    assert!(mem2[8 * n as usize..].iter().all(|b| *b == 0));
    win.deregister().unwrap();
    // And a third time, to be sure the service restarts cleanly twice.
    win.register(ptr(&mut mem2), mem2.len()).unwrap();
    let b = [0xabu8];
    win.put(
        b.as_ptr() as *const c_void,
        1,
        next,
        second(next) - 1,
        &OpOptions::default(),
    )
    .unwrap();
    win.signal(next, &OpOptions::default()).unwrap();
    win.wait_signal(prev, &OpOptions::default()).unwrap();
    assert_eq!(mem2[second(me) - 1], 0xab);
    win.deregister().unwrap();
    drop(win);
    comm.finalize().unwrap();
    println!("RESULT ok rank {me}");
}

fn ring(test: &str, n: usize) {
    if role().is_some() {
        ring_child();
        return;
    }
    let out = launch(test, "ring", n, &[], Duration::from_secs(90));
    let failed: Vec<String> = out
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.describe())
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    for o in &out {
        assert!(
            o.results().iter().any(|r| r.starts_with("ok")),
            "{}",
            o.describe()
        );
    }
}

#[test]
fn gloo_window_ring_1() {
    ring("gloo_window_ring_1", 1);
}

#[test]
fn gloo_window_ring_2() {
    ring("gloo_window_ring_2", 2);
}

#[test]
fn gloo_window_ring_3() {
    ring("gloo_window_ring_3", 3);
}

#[test]
fn gloo_window_ring_4() {
    ring("gloo_window_ring_4", 4);
}

/// Large puts (several MiB, more than a socket buffer) from every rank into
/// rank 0, each at its own offset, then checked; meanwhile a second window
/// of the same comm carries small puts and signals, waited for on another
/// thread of rank 0 (windows are independent; waits do not block puts).
#[test]
fn gloo_window_large_puts() {
    const BLOCK: usize = 3 << 20;
    if role().is_some() {
        let comm = child_comm("large", TIMEOUT);
        let (me, n) = (comm.rank(), comm.size());
        let win = Window::new(&comm).unwrap();
        let win2 = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; if me == 0 { BLOCK * n as usize } else { 1 }];
        let mut mem2 = vec![0u8; 4 * n as usize];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        win2.register(ptr(&mut mem2), mem2.len()).unwrap();
        let src: Vec<u8> = (0..BLOCK).map(|i| (i % 251) as u8 ^ me as u8).collect();
        std::thread::scope(|s| {
            let waiter = (me == 0).then(|| {
                s.spawn(|| {
                    for r in 0..n {
                        win2.wait_signal(r, &OpOptions::default()).unwrap();
                    }
                })
            });
            win.put(
                src.as_ptr() as *const c_void,
                BLOCK,
                0,
                BLOCK * me as usize,
                &OpOptions::default(),
            )
            .unwrap();
            win.signal(0, &OpOptions::default()).unwrap();
            let small = [me as u8 + 10; 4];
            win2.put(
                small.as_ptr() as *const c_void,
                4,
                0,
                4 * me as usize,
                &OpOptions::default(),
            )
            .unwrap();
            win2.signal(0, &OpOptions::default()).unwrap();
            if let Some(w) = waiter {
                w.join().unwrap();
            }
        });
        if me == 0 {
            for r in 0..n {
                win.wait_signal(r, &OpOptions::default()).unwrap();
            }
            for r in 0..n as usize {
                let ok = mem[BLOCK * r..BLOCK * (r + 1)]
                    .iter()
                    .enumerate()
                    .all(|(i, b)| *b == (i % 251) as u8 ^ r as u8);
                assert!(ok, "block of rank {r}");
                assert_eq!(
                    &mem2[4 * r..4 * r + 4],
                    &[r as u8 + 10; 4],
                    "second window, rank {r}"
                );
            }
        }
        // Around the size where a put stops travelling inside its header
        // (4064 bytes): both sides of it land whole (after rank 0 checked
        // the blocks above).
        run(&comm, Op::Barrier).unwrap();
        let edge: Vec<u8> = (0..4100)
            .map(|i| (i % 249) as u8 ^ 0x5a ^ me as u8)
            .collect();
        for (k, len) in [4063usize, 4064, 4065, 4100].into_iter().enumerate() {
            let at = BLOCK * me as usize + 8192 * k;
            win.put(
                edge.as_ptr() as *const c_void,
                len,
                0,
                at,
                &OpOptions::default(),
            )
            .unwrap();
        }
        win.signal(0, &OpOptions::default()).unwrap();
        if me == 0 {
            for r in 0..n {
                win.wait_signal(r, &OpOptions::default()).unwrap();
            }
            for r in 0..n as usize {
                for (k, len) in [4063usize, 4064, 4065, 4100].into_iter().enumerate() {
                    let at = BLOCK * r + 8192 * k;
                    let ok = mem[at..at + len]
                        .iter()
                        .enumerate()
                        .all(|(i, b)| *b == (i % 249) as u8 ^ 0x5a ^ r as u8);
                    assert!(ok, "put of {len} bytes from rank {r}");
                    // The byte after it still holds the large put's data.
                    assert_eq!(
                        mem[at + len],
                        ((at + len - BLOCK * r) % 251) as u8 ^ r as u8,
                        "after the put of {len} from rank {r}"
                    );
                }
            }
        }
        win2.deregister().unwrap();
        win.deregister().unwrap();
        println!("RESULT ok");
        return;
    }
    let out = launch(
        "gloo_window_large_puts",
        "large",
        3,
        &[],
        Duration::from_secs(90),
    );
    assert_all_ok(&out);
}

/// Rank 2 dies after registering; ranks 0 and 1 wait for its signal and
/// fail (TC_ERR_REMOTE or TC_ERR_TIMEOUT) within the timeout + 1 s; a put
/// to the dead rank fails too; freeing the window does not hang.
#[test]
fn gloo_window_peer_killed() {
    const WAIT: Duration = Duration::from_secs(4);
    if role().is_some() {
        // Rust programs start with SIGPIPE ignored, C programs do not: a
        // write to the dead peer must not kill this process either way.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let comm = child_comm("killed", TIMEOUT);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; 64];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        if me == 2 {
            std::thread::sleep(Duration::from_millis(300));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let start = Instant::now();
        let opts = OpOptions {
            timeout: Some(WAIT),
            ..OpOptions::default()
        };
        let e = win.wait_signal(2, &opts).map(drop).unwrap_err();
        let took = start.elapsed();
        println!(
            "RESULT kind={:?} ms={} msg={}",
            e.kind,
            took.as_millis(),
            e.message
        );
        assert!(
            matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout),
            "{e}"
        );
        assert!(took < WAIT + Duration::from_secs(1), "took {took:?}: {e}");
        let b = [1u8; 4];
        let start = Instant::now();
        let e = win
            .put(b.as_ptr() as *const c_void, 4, 2, 0, &opts)
            .map(drop)
            .unwrap_err();
        assert!(
            matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout),
            "{e}"
        );
        assert!(start.elapsed() < WAIT + Duration::from_secs(1), "{e}");
        // Asynchronously: the call itself succeeds (its arguments are
        // fine), and its work reports the failure.
        let start = Instant::now();
        let w = win
            .put(
                b.as_ptr() as *const c_void,
                4,
                2,
                0,
                &OpOptions {
                    async_op: true,
                    ..opts.clone()
                },
            )
            .unwrap();
        let e = w.wait_blocking().unwrap_err();
        assert!(
            matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout),
            "{e}"
        );
        assert!(
            matches!(w.status(), WorkStatus::Error | WorkStatus::TimedOut),
            "{:?}",
            w.status()
        );
        assert!(start.elapsed() < WAIT + Duration::from_secs(1), "{e}");
        let start = Instant::now();
        let _ = win.deregister();
        drop(win);
        assert!(start.elapsed() < TIMEOUT + Duration::from_secs(1));
        println!("RESULT survived");
        return;
    }
    let out = launch(
        "gloo_window_peer_killed",
        "killed",
        3,
        &[],
        Duration::from_secs(90),
    );
    out[2].assert_killed();
    for o in &out[..2] {
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert!(
            o.results().iter().any(|r| r == "survived"),
            "{}",
            o.describe()
        );
    }
}

/// Rank 2 is late to deregister: the others' deregister fails with
/// TC_ERR_TIMEOUT naming rank 2, within the timeout + 1 s; their failure
/// closes the window's connections, so rank 2's own late deregister fails
/// (TC_ERR_REMOTE) instead of hanging.
#[test]
fn gloo_window_deregister_timeout() {
    const T: Duration = Duration::from_secs(2);
    if role().is_some() {
        let comm = child_comm("late", T);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; 32];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        if me == 2 {
            std::thread::sleep(T + Duration::from_secs(2));
            let e = win.deregister().unwrap_err();
            println!("RESULT late kind={:?} msg={}", e.kind, e.message);
            assert!(
                matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout),
                "{e}"
            );
        } else {
            let start = Instant::now();
            let e = win.deregister().unwrap_err();
            let took = start.elapsed();
            println!(
                "RESULT kind={:?} ms={} msg={}",
                e.kind,
                took.as_millis(),
                e.message
            );
            // TC_ERR_REMOTE when the other waiting rank closed its
            // connections first and Gloo's message did not name it.
            assert!(
                matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote),
                "{e}"
            );
            assert!(
                e.message.contains("deregister") && e.message.contains("rank(s) 2 "),
                "{e}"
            );
            assert!(took < T + Duration::from_secs(1), "took {took:?}");
            // The buffer is released: registering again is refused now that
            // the window is unusable, with a clear error, not a hang.
            let e = win.register(ptr(&mut mem), mem.len()).unwrap_err();
            assert!(
                matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote),
                "{e}"
            );
        }
        drop(win);
        println!("RESULT done");
        return;
    }
    let out = launch(
        "gloo_window_deregister_timeout",
        "late",
        3,
        &[],
        Duration::from_secs(60),
    );
    for o in &out {
        assert!(o.ok(), "{}", o.describe());
        assert!(o.results().iter().any(|r| r == "done"), "{}", o.describe());
    }
}

/// A put to a stopped process (SIGSTOP) fails with TC_ERR_TIMEOUT naming
/// the put and the peer, within the timeout + 1 s.
#[test]
fn gloo_window_put_to_stopped_peer() {
    const T: Duration = Duration::from_millis(1500);
    if role().is_some() {
        let comm = child_comm("stopped", TIMEOUT);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; 1 << 16];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        println!("RESULT registered");
        if me == 1 {
            // Stopped by the parent; then killed.
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        // Let the parent stop rank 1 first.
        std::thread::sleep(Duration::from_millis(1500));
        let src = vec![3u8; 1 << 16];
        let opts = OpOptions {
            timeout: Some(T),
            ..OpOptions::default()
        };
        let start = Instant::now();
        let e = win
            .put(src.as_ptr() as *const c_void, src.len(), 1, 0, &opts)
            .map(drop)
            .unwrap_err();
        let took = start.elapsed();
        println!(
            "RESULT kind={:?} ms={} msg={}",
            e.kind,
            took.as_millis(),
            e.message
        );
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(
            e.message.contains("put") && e.message.contains("rank 1"),
            "{e}"
        );
        assert!(
            took + Duration::from_millis(50) >= T && took < T + Duration::from_secs(1),
            "took {took:?}"
        );
        // The window is unusable now, and says so at once.
        let start = Instant::now();
        let e = win.signal(1, &opts).map(drop).unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(500), "{e}");
        drop(win);
        println!("RESULT done");
        return;
    }
    let mut stopped = false;
    let out = launch_with(
        "gloo_window_put_to_stopped_peer",
        "stopped",
        2,
        &[],
        Duration::from_secs(60),
        |t, children| {
            if !stopped && t > Duration::from_millis(800) {
                unsafe { libc::kill(children[1].id() as i32, libc::SIGSTOP) };
                stopped = true;
            }
            if t > Duration::from_secs(6) {
                let _ = children[1].kill();
            }
        },
    );
    assert!(out[0].ok(), "{}", out[0].describe());
    assert!(
        out[0].results().iter().any(|r| r == "done"),
        "{}",
        out[0].describe()
    );
}

/// Rank 2 dies while ranks 0 and 1 are deregistering (they wait for its
/// STOP): they fail with TC_ERR_REMOTE (at once where the dead connection
/// names rank 2) or TC_ERR_TIMEOUT, within the timeout + 1 s, no hang.
#[test]
fn gloo_window_peer_killed_during_deregister() {
    const T: Duration = Duration::from_secs(3);
    if role().is_some() {
        // Rust programs start with SIGPIPE ignored, C programs do not: a
        // write to the dead peer must not kill this process either way.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let comm = child_comm("killed_dereg", T);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; 64];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        if me == 2 {
            std::thread::sleep(Duration::from_millis(500));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let start = Instant::now();
        let e = win.deregister().unwrap_err();
        let took = start.elapsed();
        println!(
            "RESULT kind={:?} ms={} msg={}",
            e.kind,
            took.as_millis(),
            e.message
        );
        assert!(
            matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout),
            "{e}"
        );
        assert!(took < T + Duration::from_secs(1), "took {took:?}: {e}");
        drop(win);
        println!("RESULT survived");
        return;
    }
    let out = launch(
        "gloo_window_peer_killed_during_deregister",
        "killed_dereg",
        3,
        &[],
        Duration::from_secs(60),
    );
    out[2].assert_killed();
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert!(
            o.results().iter().any(|r| r == "survived"),
            "{}",
            o.describe()
        );
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
}

// ---- asynchronous calls (async_op) ------------------------------------------

fn async_opts() -> OpOptions {
    OpOptions {
        async_op: true,
        ..OpOptions::default()
    }
}

fn async_quick(ms: u64) -> OpOptions {
    OpOptions {
        async_op: true,
        ..quick(ms)
    }
}

/// Sizes of the asynchronous puts: inline ones (up to 4064 bytes, inside
/// their header message) mixed with large ones (1 MiB).
const ASYNC_SIZES: [usize; 14] = [
    1,
    4064,
    1 << 20,
    100,
    4065,
    3000,
    1 << 20,
    7,
    65536,
    4064,
    1 << 20,
    513,
    4096,
    2,
];
/// Untouched bytes between two puts.
const GAP: usize = 8;

/// (offset, length) of each asynchronous put in the target's buffer.
fn async_layout() -> Vec<(usize, usize)> {
    let mut at = GAP;
    ASYNC_SIZES
        .iter()
        .map(|len| {
            let p = (at, *len);
            at += len + GAP;
            p
        })
        .collect()
}

/// Byte i of put k of round `round` from rank r.
fn async_byte(r: i32, round: usize, k: usize, i: usize) -> u8 {
    ((i * 131 + (i >> 8) * 7 + k * 17 + r as usize * 59 + round * 101) % 251) as u8 + 1
}

/// Checks that `mem` holds round `round` of rank `src`'s puts, and FILL in
/// the gaps.
fn check_async_round(mem: &[u8], me: i32, src: i32, round: usize) {
    let layout = async_layout();
    let mut covered = vec![false; mem.len()];
    for (k, (off, len)) in layout.iter().enumerate() {
        for i in 0..*len {
            let want = async_byte(src, round, k, i);
            assert_eq!(mem[off + i], want, "rank {me}, round {round}: byte {i} of put {k} ({len} bytes at {off}) from rank {src}");
            covered[off + i] = true;
        }
    }
    for (i, b) in mem.iter().enumerate() {
        if !covered[i] {
            assert_eq!(
                *b, FILL,
                "rank {me}, round {round}: byte {i} is outside every put"
            );
        }
    }
}

fn async_puts_child() {
    let comm = child_comm("async", TIMEOUT);
    let (me, n) = (comm.rank(), comm.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let win = Window::new(&comm).unwrap();
    let layout = async_layout();
    let total = layout.last().map(|(o, l)| o + l + GAP).unwrap();
    let mut mem = vec![FILL; total];
    win.register(ptr(&mut mem), mem.len()).unwrap();

    // -- round 0: every put and the signal asynchronous, and an
    //    asynchronous wait for the predecessor's signal
    let srcs: Vec<Vec<u8>> = layout
        .iter()
        .enumerate()
        .map(|(k, (_, len))| (0..*len).map(|i| async_byte(me, 0, k, i)).collect())
        .collect();
    let puts: Vec<Arc<dyn Work>> = layout
        .iter()
        .zip(&srcs)
        .map(|((off, len), src)| {
            win.put(
                src.as_ptr() as *const c_void,
                *len,
                next,
                *off,
                &async_opts(),
            )
            .unwrap()
        })
        .collect();
    let sig = win.signal(next, &async_opts()).unwrap();
    let wait = win.wait_signal(prev, &async_opts()).unwrap();
    // Waited in another order than issued: the signal first. It completes
    // after every put issued before it, so they are all complete then.
    sig.wait_blocking().unwrap();
    assert_eq!(sig.status(), WorkStatus::Completed);
    for (k, w) in puts.iter().enumerate() {
        assert_eq!(
            w.status(),
            WorkStatus::Completed,
            "rank {me}: put {k} not complete when the signal issued after it was"
        );
    }
    wait.wait_blocking().unwrap();
    assert_eq!(wait.status(), WorkStatus::Completed);
    for w in puts.iter().rev() {
        w.wait_blocking().unwrap();
    }
    check_async_round(&mem, me, prev, 0);

    // -- round 1: asynchronous puts, no signal, not waited for: deregister
    //    waits for them (every put lands before deregistration ends)
    run(&comm, Op::Barrier).unwrap();
    let srcs1: Vec<Vec<u8>> = layout
        .iter()
        .enumerate()
        .map(|(k, (_, len))| (0..*len).map(|i| async_byte(me, 1, k, i)).collect())
        .collect();
    let puts1: Vec<Arc<dyn Work>> = layout
        .iter()
        .zip(&srcs1)
        .map(|((off, len), src)| {
            win.put(
                src.as_ptr() as *const c_void,
                *len,
                next,
                *off,
                &async_opts(),
            )
            .unwrap()
        })
        .collect();
    win.deregister().unwrap();
    for (k, w) in puts1.iter().enumerate() {
        assert_eq!(
            w.status(),
            WorkStatus::Completed,
            "rank {me}: put {k} of round 1 not complete after deregister"
        );
    }
    check_async_round(&mem, me, prev, 1);
    drop(win);
    comm.finalize().unwrap();
    println!("RESULT ok rank {me}");
}

fn async_puts(test: &str, n: usize) {
    if role().is_some() {
        async_puts_child();
        return;
    }
    let out = launch(test, "async", n, &[], Duration::from_secs(90));
    assert_all_ok(&out);
    for o in &out {
        assert!(
            o.results().iter().any(|r| r.starts_with("ok")),
            "{}",
            o.describe()
        );
    }
}

#[test]
fn gloo_window_async_puts_2() {
    async_puts("gloo_window_async_puts_2", 2);
}

#[test]
fn gloo_window_async_puts_3() {
    async_puts("gloo_window_async_puts_3", 3);
}

#[test]
fn gloo_window_async_puts_4() {
    async_puts("gloo_window_async_puts_4", 4);
}

/// On a ring of 3, every rank first issues an asynchronous wait for its
/// predecessor's signal, then puts and signals to its successor (blocking
/// in even rounds, asynchronous in odd ones): the outstanding wait must not
/// hold up the puts (else every rank waits for a signal never sent and the
/// waits time out). 20 rounds, each into its own region, checked.
#[test]
fn gloo_window_async_wait_ring_3() {
    const ROUNDS: usize = 20;
    const REGION: usize = 8192;
    if role().is_some() {
        let comm = child_comm("async_ring", TIMEOUT);
        let (me, n) = (comm.rank(), comm.size());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![FILL; ROUNDS * REGION];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        let len = |round: usize| if round % 2 == 0 { 64 } else { 5000 };
        let data = |r: i32, round: usize| -> Vec<u8> {
            (0..len(round))
                .map(|i| async_byte(r, round, 0, i))
                .collect()
        };
        let srcs: Vec<Vec<u8>> = (0..ROUNDS).map(|round| data(me, round)).collect();
        let mut works = Vec::new();
        let start = Instant::now();
        for round in 0..ROUNDS {
            let wait = win.wait_signal(prev, &async_quick(5000)).unwrap();
            let src = srcs[round].as_ptr() as *const c_void;
            let opts = if round % 2 == 0 {
                quick(5000)
            } else {
                async_quick(5000)
            };
            works.push(
                win.put(src, len(round), next, round * REGION, &opts)
                    .unwrap(),
            );
            works.push(win.signal(next, &opts).unwrap());
            wait.wait_blocking()
                .unwrap_or_else(|e| panic!("rank {me}, round {round}: the wait failed: {e}"));
            assert_eq!(
                &mem[round * REGION..round * REGION + len(round)],
                &data(prev, round)[..],
                "rank {me}, round {round}"
            );
            assert!(mem[round * REGION + len(round)..(round + 1) * REGION]
                .iter()
                .all(|b| *b == FILL));
        }
        for w in &works {
            w.wait_blocking().unwrap();
        }
        let took = start.elapsed();
        println!("RESULT ok ms={}", took.as_millis());
        assert!(
            took < Duration::from_secs(5),
            "{ROUNDS} rounds took {took:?}"
        );
        win.deregister().unwrap();
        return;
    }
    let out = launch(
        "gloo_window_async_wait_ring_3",
        "async_ring",
        3,
        &[],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
    for o in &out {
        assert!(
            o.results().iter().any(|r| r.starts_with("ok")),
            "{}",
            o.describe()
        );
    }
}

/// Eight 1 MiB asynchronous puts into the same region of the successor,
/// each with its own byte, then two blocking puts overlapping that region
/// (one inline, one large): the blocking ones wait for the queued ones and
/// land after them, so the final bytes are theirs where they overlap and
/// the last asynchronous put's elsewhere.
#[test]
fn gloo_window_sync_put_after_async() {
    const BIG: usize = 1 << 20;
    const K: usize = 8;
    if role().is_some() {
        let comm = child_comm("sync_after", TIMEOUT);
        let (me, n) = (comm.rank(), comm.size());
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; BIG + 64];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        let srcs: Vec<Vec<u8>> = (0..K).map(|k| vec![k as u8 + 1; BIG]).collect();
        let works: Vec<Arc<dyn Work>> = srcs
            .iter()
            .map(|s| {
                win.put(s.as_ptr() as *const c_void, BIG, next, 0, &async_opts())
                    .unwrap()
            })
            .collect();
        let unfinished = works.iter().filter(|w| !w.status().is_finished()).count();
        let inline = [0x11u8; 8];
        let large = vec![0x22u8; 5000];
        win.put(
            inline.as_ptr() as *const c_void,
            8,
            next,
            10,
            &OpOptions::default(),
        )
        .unwrap();
        // The blocking put returned after every put queued before it.
        for (k, w) in works.iter().enumerate() {
            assert_eq!(
                w.status(),
                WorkStatus::Completed,
                "rank {me}: async put {k} not complete after a later blocking put returned"
            );
        }
        win.put(
            large.as_ptr() as *const c_void,
            large.len(),
            next,
            BIG / 2,
            &OpOptions::default(),
        )
        .unwrap();
        win.signal(next, &OpOptions::default()).unwrap();
        win.wait_signal(prev, &OpOptions::default()).unwrap();
        for (i, b) in mem.iter().enumerate() {
            let want = if (10..18).contains(&i) {
                0x11
            } else if (BIG / 2..BIG / 2 + 5000).contains(&i) {
                0x22
            } else if i < BIG {
                K as u8
            } else {
                0
            };
            assert_eq!(*b, want, "rank {me}: byte {i}");
        }
        println!("RESULT ok unfinished_at_issue={unfinished}");
        // The asynchronous calls returned before their puts were done.
        assert!(
            unfinished >= 1,
            "all {K} asynchronous 1 MiB puts were finished as soon as issued"
        );
        win.deregister().unwrap();
        return;
    }
    let out = launch(
        "gloo_window_sync_put_after_async",
        "sync_after",
        2,
        &[],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
    for o in &out {
        assert!(
            o.results().iter().any(|r| r.starts_with("ok")),
            "{}",
            o.describe()
        );
    }
}

/// Launches 2 ranks of `test`; rank 1 stops itself (SIGSTOP) after a
/// barrier and is killed once rank 0 has exited. Returns rank 0's outcome.
fn with_stopped_rank_1(test: &str, role: &str) -> Outcome {
    let mut killed = false;
    let mut out = launch_with(
        test,
        role,
        2,
        &[],
        Duration::from_secs(60),
        |_, children| {
            if !killed && matches!(children[0].try_wait(), Ok(Some(_))) {
                let _ = children[1].kill();
                killed = true;
            }
        },
    );
    out.swap_remove(0)
}

/// Rank 1's part in the stopped-peer tests: registers, then stops.
fn stopped_child(comm: &Arc<Comm>, win: &Window) {
    let mut mem = vec![0u8; 8 << 20];
    win.register(ptr(&mut mem), mem.len()).unwrap();
    run(comm, Op::Barrier).unwrap();
    if comm.rank() == 1 {
        unsafe { libc::raise(libc::SIGSTOP) };
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3);
    }
    // Let rank 1 stop.
    std::thread::sleep(Duration::from_millis(300));
    std::mem::forget(mem); // still registered when the window is freed
}

/// Rank 1 is stopped; rank 0 queues a 4 MiB put (in flight, never taken),
/// more puts and a signal behind it, and a wait for rank 1's signal, then
/// frees the window: no hang (well within the comm's 20 s timeout), every
/// work finished, the queued ones with Aborted saying the window was freed,
/// the in-flight put and the wait with Aborted (or, for the put, the
/// connection's failure).
#[test]
fn gloo_window_free_with_queued_work() {
    if role().is_some() {
        let comm = child_comm("free_queued", TIMEOUT);
        let win = Window::new(&comm).unwrap();
        stopped_child(&comm, &win);
        let big = vec![1u8; 4 << 20];
        let small = [2u8; 16];
        let first = win
            .put(
                big.as_ptr() as *const c_void,
                big.len(),
                1,
                0,
                &async_opts(),
            )
            .unwrap();
        let queued = [
            win.put(small.as_ptr() as *const c_void, 16, 1, 0, &async_opts())
                .unwrap(),
            win.put(
                big.as_ptr() as *const c_void,
                big.len(),
                1,
                0,
                &async_opts(),
            )
            .unwrap(),
            win.signal(1, &async_opts()).unwrap(),
        ];
        let wait = win.wait_signal(1, &async_opts()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(first.status(), WorkStatus::InProgress);
        assert_eq!(wait.status(), WorkStatus::InProgress);
        for (k, w) in queued.iter().enumerate() {
            assert_eq!(w.status(), WorkStatus::NotStarted, "queued call {k}");
        }
        let start = Instant::now();
        drop(win);
        let took = start.elapsed();
        let e = first.wait_blocking().unwrap_err();
        println!(
            "RESULT free_ms={} first={:?} {}",
            took.as_millis(),
            e.kind,
            e.message
        );
        assert!(took < Duration::from_secs(2), "freeing took {took:?}");
        assert!(
            matches!(e.kind, ErrorKind::Aborted | ErrorKind::Remote),
            "{e}"
        );
        assert_eq!(first.status(), WorkStatus::Error);
        for (k, w) in queued.iter().enumerate() {
            assert_eq!(w.status(), WorkStatus::Error, "queued call {k}");
            let e = w.wait_blocking().unwrap_err();
            assert_eq!(e.kind, ErrorKind::Aborted, "queued call {k}: {e}");
            assert!(e.message.contains("freed"), "queued call {k}: {e}");
        }
        let e = wait.wait_blocking().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
        assert_eq!(wait.status(), WorkStatus::Error);
        println!("RESULT done");
        return;
    }
    let o = with_stopped_rank_1("gloo_window_free_with_queued_work", "free_queued");
    for r in o.results() {
        eprintln!("rank 0: {r}");
    }
    assert!(o.ok(), "{}", o.describe());
    assert!(o.results().iter().any(|r| r == "done"), "{}", o.describe());
}

/// An asynchronous put to a stopped peer under a 1.5 s timeout: the call
/// returns at once, and its work reports TIMED_OUT (TC_ERR_TIMEOUT naming
/// the put and the peer) within the timeout + 1 s. The window is unusable
/// after: a later asynchronous signal's work fails at once.
#[test]
fn gloo_window_async_put_to_stopped_peer() {
    const T: u64 = 1500;
    if role().is_some() {
        let comm = child_comm("async_stopped", TIMEOUT);
        let win = Window::new(&comm).unwrap();
        stopped_child(&comm, &win);
        let src = vec![3u8; 1 << 16];
        let start = Instant::now();
        let w = win
            .put(
                src.as_ptr() as *const c_void,
                src.len(),
                1,
                0,
                &async_quick(T),
            )
            .unwrap();
        let issued = start.elapsed();
        assert!(!w.status().is_finished(), "{:?}", w.status());
        let e = w.wait_blocking().unwrap_err();
        let took = start.elapsed();
        println!(
            "RESULT issued_us={} ms={} kind={:?} msg={}",
            issued.as_micros(),
            took.as_millis(),
            e.kind,
            e.message
        );
        assert!(
            issued < Duration::from_millis(100),
            "the asynchronous call took {issued:?}"
        );
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert_eq!(w.status(), WorkStatus::TimedOut);
        assert!(
            e.message.contains("put") && e.message.contains("rank 1"),
            "{e}"
        );
        let t = Duration::from_millis(T);
        assert!(
            took + Duration::from_millis(50) >= t && took < t + Duration::from_secs(1),
            "took {took:?}"
        );
        let start = Instant::now();
        let s = win.signal(1, &async_quick(T)).unwrap();
        let e = s.wait_blocking().unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(500), "{e}");
        assert!(
            matches!(s.status(), WorkStatus::Error | WorkStatus::TimedOut),
            "{:?}",
            s.status()
        );
        drop(win);
        println!("RESULT done");
        return;
    }
    let o = with_stopped_rank_1("gloo_window_async_put_to_stopped_peer", "async_stopped");
    for r in o.results() {
        eprintln!("rank 0: {r}");
    }
    assert!(o.ok(), "{}", o.describe());
    assert!(o.results().iter().any(|r| r == "done"), "{}", o.describe());
}

// ---- the comm's lifecycle over its windows' asynchronous calls -------------

/// A barrier of the children through the raw store (no comm needed, so it
/// also works after finalize).
fn store_barrier(store: &torchcomm::store::StoreRef, key: &str, n: i64) {
    let all = format!("{key}/all");
    if store.add(key, 1).unwrap() == n {
        store.set(&all, b"1").unwrap();
    }
    store.wait(&[&all], Some(Duration::from_secs(30))).unwrap();
}

/// 2 ranks: each queues six asynchronous 1 MiB puts into the other, an
/// asynchronous signal behind them and an asynchronous wait for the
/// other's signal, then finalizes the comm without waiting for any of those
/// works. Finalize returns only once every one is complete (all COMPLETED
/// the moment it returns, and some were not when it began), and the other
/// rank's bytes are all in the buffer (its puts landed before its signal,
/// which this rank's completed wait consumed). Then, on a comm of one rank:
/// an asynchronous wait that times out makes finalize fail with
/// TC_ERR_TIMEOUT naming the wait, and a window freed with a failed wait
/// before finalize is not reported.
#[test]
fn gloo_window_finalize_waits_for_async_work() {
    const BIG: usize = 1 << 20;
    const K: usize = 6;
    const ROUND: usize = 2;
    if role().is_some() {
        let store = child_store();
        let comm = child_comm_on(store.clone(), "fin_async", rank(), size(), TIMEOUT).unwrap();
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; K * BIG];
        win.register(ptr(&mut mem), mem.len()).unwrap();
        run(&comm, Op::Barrier).unwrap();
        let srcs: Vec<Vec<u8>> = (0..K)
            .map(|k| (0..BIG).map(|i| async_byte(me, ROUND, k, i)).collect())
            .collect();
        let mut works: Vec<Arc<dyn Work>> = srcs
            .iter()
            .enumerate()
            .map(|(k, s)| {
                win.put(
                    s.as_ptr() as *const c_void,
                    BIG,
                    peer,
                    k * BIG,
                    &async_opts(),
                )
                .unwrap()
            })
            .collect();
        works.push(win.signal(peer, &async_opts()).unwrap());
        works.push(win.wait_signal(peer, &async_opts()).unwrap());
        let unfinished = works.iter().filter(|w| !w.status().is_finished()).count();
        let start = Instant::now();
        comm.finalize().unwrap();
        let took = start.elapsed();
        let statuses: Vec<WorkStatus> = works.iter().map(|w| w.status()).collect();
        println!("RESULT rank={me} unfinished_at_finalize={unfinished} finalize_us={} statuses={statuses:?}", took.as_micros());
        for (k, s) in statuses.iter().enumerate() {
            assert_eq!(
                *s,
                WorkStatus::Completed,
                "rank {me}: work {k} of {} when finalize returned",
                works.len()
            );
        }
        for k in 0..K {
            let ok = mem[k * BIG..(k + 1) * BIG]
                .iter()
                .enumerate()
                .all(|(i, b)| *b == async_byte(peer, ROUND, k, i));
            assert!(
                ok,
                "rank {me}: put {k} from rank {peer} incomplete after finalize"
            );
        }
        assert!(
            unfinished >= 1,
            "rank {me}: every work was finished before finalize began: the test proves nothing"
        );
        // The window is still registered (deregister needs an active comm);
        // freeing it resets its connections, which could drop the signal
        // this rank sent before the peer has read it: free it once both
        // ranks are past finalize.
        store_barrier(&store, "fin_async_done", 2);
        drop(win);

        // -- a failed asynchronous call of a live window fails finalize; one
        //    of a window freed before finalize does not
        let solo = child_comm_on(store.clone(), &format!("fin_fail{me}"), 0, 1, TIMEOUT).unwrap();
        let freed = Window::new(&solo).unwrap();
        let live = Window::new(&solo).unwrap();
        let mut m1 = [0u8; 8];
        let mut m2 = [0u8; 8];
        freed.register(ptr(&mut m1), 8).unwrap();
        live.register(ptr(&mut m2), 8).unwrap();
        let w1 = freed.wait_signal(0, &async_quick(100)).unwrap();
        assert_eq!(w1.wait_blocking().unwrap_err().kind, ErrorKind::Timeout);
        drop(freed);
        let w2 = live.wait_signal(0, &async_quick(300)).unwrap();
        let start = Instant::now();
        let e = solo.finalize().unwrap_err();
        let took = start.elapsed();
        println!(
            "RESULT solo ms={} kind={:?} msg={}",
            took.as_millis(),
            e.kind,
            e.message
        );
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(
            e.message.contains("window")
                && e.message.contains("wait_signal")
                && e.message.contains("300 ms"),
            "{e}"
        );
        assert_eq!(w2.status(), WorkStatus::TimedOut);
        assert!(
            took >= Duration::from_millis(200),
            "finalize took {took:?}: it did not wait for the pending wait"
        );
        drop(live);
        println!("RESULT ok");
        return;
    }
    let out = launch(
        "gloo_window_finalize_waits_for_async_work",
        "fin_async",
        2,
        &[],
        Duration::from_secs(90),
    );
    for o in &out {
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
    assert_all_ok(&out);
    for o in &out {
        assert!(o.results().iter().any(|r| r == "ok"), "{}", o.describe());
    }
}

/// Queues on `win` (whose peer, rank 1, is stopped) a 4 MiB put (in
/// flight, never taken), two puts and a signal behind it, and a wait for
/// rank 1's signal; checks that they are in progress or queued.
fn queue_stuck_work(
    win: &Window,
    big: &[u8],
    small: &[u8; 16],
) -> Vec<(&'static str, Arc<dyn Work>)> {
    let works = vec![
        (
            "in-flight put",
            win.put(
                big.as_ptr() as *const c_void,
                big.len(),
                1,
                0,
                &async_opts(),
            )
            .unwrap(),
        ),
        (
            "queued put",
            win.put(small.as_ptr() as *const c_void, 16, 1, 0, &async_opts())
                .unwrap(),
        ),
        (
            "queued large put",
            win.put(
                big.as_ptr() as *const c_void,
                big.len(),
                1,
                0,
                &async_opts(),
            )
            .unwrap(),
        ),
        ("queued signal", win.signal(1, &async_opts()).unwrap()),
        ("pending wait", win.wait_signal(1, &async_opts()).unwrap()),
    ];
    std::thread::sleep(Duration::from_millis(300));
    for (what, w) in &works {
        let want = if what.starts_with("queued") {
            WorkStatus::NotStarted
        } else {
            WorkStatus::InProgress
        };
        assert_eq!(w.status(), want, "{what} before the abort");
    }
    works
}

/// Every work ends with TC_ERR_ABORTED whose message contains `needle`;
/// returns when the last one did.
fn expect_all_aborted(works: &[(&'static str, Arc<dyn Work>)], needle: &str) {
    for (what, w) in works {
        let e = w.wait_blocking().unwrap_err();
        println!("RESULT {what}: {:?} {}", e.kind, e.message);
        assert_eq!(e.kind, ErrorKind::Aborted, "{what}: {e}");
        assert!(e.message.contains(needle), "{what}: {e}");
        assert_eq!(w.status(), WorkStatus::Error, "{what}");
    }
}

/// Rank 1 stops itself (SIGSTOP) after registering two windows, one on
/// each of two comms. Rank 0 queues on the first a 4 MiB put (in flight,
/// never taken), more puts and a signal behind it, and a wait for rank 1's
/// signal, then calls `abort` on its comm: the call returns within 1 s and
/// every work ends with TC_ERR_ABORTED naming the application's abort
/// within 1 s of it; later calls are refused, finalize reports the abort,
/// freeing the window does not hang. The same with the second comm aborted
/// by a failure (a barrier timing out at 1 s): its window's works end with
/// TC_ERR_ABORTED naming that failure within 1 s of the barrier's error,
/// long before their own 20 s timeout.
#[test]
fn gloo_window_comm_abort_ends_async_work() {
    const PROMPT: Duration = Duration::from_secs(1);
    if role().is_some() {
        let store = child_store();
        let app = child_comm_on(store.clone(), "abort_app", rank(), size(), TIMEOUT).unwrap();
        let failing = child_comm_on(store, "abort_fail", rank(), size(), TIMEOUT).unwrap();
        let (wa, wf) = (Window::new(&app).unwrap(), Window::new(&failing).unwrap());
        let (mut ma, mut mf) = (vec![0u8; 8 << 20], vec![0u8; 8 << 20]);
        wa.register(ptr(&mut ma), ma.len()).unwrap();
        wf.register(ptr(&mut mf), mf.len()).unwrap();
        run(&app, Op::Barrier).unwrap();
        if rank() == 1 {
            unsafe { libc::raise(libc::SIGSTOP) };
            std::thread::sleep(Duration::from_secs(60));
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(300)); // let rank 1 stop
        let big = vec![1u8; 4 << 20];
        let small = [2u8; 16];

        // -- the application's abort
        let works = queue_stuck_work(&wa, &big, &small);
        let start = Instant::now();
        app.abort();
        let abort_took = start.elapsed();
        expect_all_aborted(&works, "comm 'abort_app' was aborted by the application");
        let all_took = start.elapsed();
        println!(
            "RESULT app abort_us={} all_ended_us={}",
            abort_took.as_micros(),
            all_took.as_micros()
        );
        assert!(abort_took < PROMPT, "abort took {abort_took:?}");
        assert!(
            all_took < PROMPT,
            "the works ended {all_took:?} after the abort began"
        );
        let e = wa
            .put(small.as_ptr() as *const c_void, 16, 1, 0, &async_opts())
            .map(drop)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
        assert_eq!(app.finalize().unwrap_err().kind, ErrorKind::Aborted);
        let start = Instant::now();
        drop(wa);
        assert!(
            start.elapsed() < PROMPT,
            "freeing took {:?}",
            start.elapsed()
        );

        // -- the comm aborted by a failure of its own operation
        let works = queue_stuck_work(&wf, &big, &small);
        let e = failing
            .submit(Op::Barrier, &quick(1000))
            .map(drop)
            .unwrap_err();
        let start = Instant::now();
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        expect_all_aborted(&works, "comm 'abort_fail' was aborted: barrier");
        let all_took = start.elapsed();
        println!("RESULT failure all_ended_us={}", all_took.as_micros());
        assert!(
            all_took < PROMPT,
            "the works ended {all_took:?} after the barrier failed"
        );
        let start = Instant::now();
        drop(wf);
        assert!(
            start.elapsed() < PROMPT,
            "freeing took {:?}",
            start.elapsed()
        );
        println!("RESULT done");
        return;
    }
    let o = with_stopped_rank_1("gloo_window_comm_abort_ends_async_work", "abort_async");
    for r in o.results() {
        eprintln!("rank 0: {r}");
    }
    assert!(o.ok(), "{}", o.describe());
    assert!(o.results().iter().any(|r| r == "done"), "{}", o.describe());
}
