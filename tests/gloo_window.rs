//! One-sided windows on the gloo backend with real processes (2, 3 and 4
//! ranks): ring puts checked byte for byte, uneven sizes, many small puts
//! under one signal, signals counted (and the wait past them timing out),
//! puts to self, out-of-bounds puts refused at the origin, map_remote,
//! register/deregister twice, and a peer killed while others wait for its
//! signal (no hang).

mod gloo_common;

use gloo_common::*;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchcomm::comm::{Comm, Op, OpOptions};
use torchcomm::error::ErrorKind;
use torchcomm::window::Window;

const TIMEOUT: Duration = Duration::from_secs(20);
const FILL: u8 = 0xee;

fn quick(ms: u64) -> OpOptions {
    OpOptions { timeout: Some(Duration::from_millis(ms)), ..OpOptions::default() }
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
    (r as u8).wrapping_mul(31).wrapping_add(i as u8).wrapping_add(1)
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
    win.put(block.as_ptr() as *const c_void, 16, next, 16 * me as usize, &OpOptions::default()).unwrap();
    // -- many small puts, one signal for all of them
    for i in 0..SMALL_N {
        let b = [small_byte(me, i)];
        win.put(b.as_ptr() as *const c_void, 1, next, SMALL_AT + i, &OpOptions::default()).unwrap();
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
        assert_eq!(*b, want, "rank {me}: byte {i} after the ring puts from rank {prev}");
    }

    // -- put to self: synchronous memcpy; a signal to self counts too
    let mine = [0x5au8; 8];
    win.put(mine.as_ptr() as *const c_void, 8, me, SELF_AT, &OpOptions::default()).unwrap();
    assert_eq!(&mem[SELF_AT..SELF_AT + 8], &mine);
    win.signal(me, &OpOptions::default()).unwrap();
    win.wait_signal(me, &OpOptions::default()).unwrap();

    // -- signals are counted: three signals satisfy three waits, a fourth
    //    times out within its timeout + 1 s
    for _ in 0..3 {
        win.signal(next, &OpOptions::default()).unwrap();
    }
    for k in 0..3 {
        win.wait_signal(prev, &OpOptions::default()).unwrap_or_else(|e| panic!("rank {me}: wait {k}: {e}"));
    }
    let start = Instant::now();
    let e = win.wait_signal(prev, &quick(400)).unwrap_err();
    let took = start.elapsed();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(took >= Duration::from_millis(390) && took < Duration::from_millis(1400), "took {took:?}");
    assert!(e.message.contains("wait_signal") && e.message.contains(&format!("rank {prev}")), "{e}");

    // -- out of bounds, refused at the origin and naming the offset; the
    //    window stays usable
    let far = first_size(next) - 4;
    let e = win.put(block.as_ptr() as *const c_void, 8, next, far, &OpOptions::default()).unwrap_err();
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
    win.put(tail.as_ptr() as *const c_void, 4, next, 240, &OpOptions::default()).unwrap();
    win.signal(next, &OpOptions::default()).unwrap();
    win.wait_signal(prev, &OpOptions::default()).unwrap();
    assert_eq!(&mem[240..244], &[0x77; 4]);
    win.deregister().unwrap();
    // After deregister the buffer is not the window's any more.
    let e = win.put(tail.as_ptr() as *const c_void, 4, next, 0, &OpOptions::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");

    // -- register again, another buffer and other sizes; a full all-to-all
    //    of puts, each rank signalling every rank
    let second = |r: i32| 8 * n as usize + r as usize;
    let mut mem2 = vec![0u8; second(me)];
    win.register(ptr(&mut mem2), mem2.len()).unwrap();
    for dst in 0..n {
        let b = [me as u8 + 1; 8];
        win.put(b.as_ptr() as *const c_void, 8, dst, 8 * me as usize, &OpOptions::default()).unwrap();
        win.signal(dst, &OpOptions::default()).unwrap();
    }
    for src in 0..n {
        win.wait_signal(src, &OpOptions::default()).unwrap();
    }
    for src in 0..n as usize {
        assert_eq!(&mem2[8 * src..8 * src + 8], &[src as u8 + 1; 8], "rank {me}: second registration, block of rank {src}");
    }
    assert!(mem2[8 * n as usize..].iter().all(|b| *b == 0));
    win.deregister().unwrap();
    // And a third time, to be sure the service restarts cleanly twice.
    win.register(ptr(&mut mem2), mem2.len()).unwrap();
    let b = [0xabu8];
    win.put(b.as_ptr() as *const c_void, 1, next, second(next) - 1, &OpOptions::default()).unwrap();
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
    let failed: Vec<String> = out.iter().filter(|o| !o.ok()).map(|o| o.describe()).collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    for o in &out {
        assert!(o.results().iter().any(|r| r.starts_with("ok")), "{}", o.describe());
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
            win.put(src.as_ptr() as *const c_void, BLOCK, 0, BLOCK * me as usize, &OpOptions::default()).unwrap();
            win.signal(0, &OpOptions::default()).unwrap();
            let small = [me as u8 + 10; 4];
            win2.put(small.as_ptr() as *const c_void, 4, 0, 4 * me as usize, &OpOptions::default()).unwrap();
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
                let ok = mem[BLOCK * r..BLOCK * (r + 1)].iter().enumerate().all(|(i, b)| *b == (i % 251) as u8 ^ r as u8);
                assert!(ok, "block of rank {r}");
                assert_eq!(&mem2[4 * r..4 * r + 4], &[r as u8 + 10; 4], "second window, rank {r}");
            }
        }
        // Around the size where a put stops travelling inside its header
        // (4064 bytes): both sides of it land whole (after rank 0 checked
        // the blocks above).
        run(&comm, Op::Barrier).unwrap();
        let edge: Vec<u8> = (0..4100).map(|i| (i % 249) as u8 ^ 0x5a ^ me as u8).collect();
        for (k, len) in [4063usize, 4064, 4065, 4100].into_iter().enumerate() {
            let at = BLOCK * me as usize + 8192 * k;
            win.put(edge.as_ptr() as *const c_void, len, 0, at, &OpOptions::default()).unwrap();
        }
        win.signal(0, &OpOptions::default()).unwrap();
        if me == 0 {
            for r in 0..n {
                win.wait_signal(r, &OpOptions::default()).unwrap();
            }
            for r in 0..n as usize {
                for (k, len) in [4063usize, 4064, 4065, 4100].into_iter().enumerate() {
                    let at = BLOCK * r + 8192 * k;
                    let ok = mem[at..at + len].iter().enumerate().all(|(i, b)| *b == (i % 249) as u8 ^ 0x5a ^ r as u8);
                    assert!(ok, "put of {len} bytes from rank {r}");
                    // The byte after it still holds the large put's data.
                    assert_eq!(mem[at + len], ((at + len - BLOCK * r) % 251) as u8 ^ r as u8, "after the put of {len} from rank {r}");
                }
            }
        }
        win2.deregister().unwrap();
        win.deregister().unwrap();
        println!("RESULT ok");
        return;
    }
    let out = launch("gloo_window_large_puts", "large", 3, &[], Duration::from_secs(90));
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
        let opts = OpOptions { timeout: Some(WAIT), ..OpOptions::default() };
        let e = win.wait_signal(2, &opts).unwrap_err();
        let took = start.elapsed();
        println!("RESULT kind={:?} ms={} msg={}", e.kind, took.as_millis(), e.message);
        assert!(matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout), "{e}");
        assert!(took < WAIT + Duration::from_secs(1), "took {took:?}: {e}");
        let b = [1u8; 4];
        let start = Instant::now();
        let e = win.put(b.as_ptr() as *const c_void, 4, 2, 0, &opts).unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout), "{e}");
        assert!(start.elapsed() < WAIT + Duration::from_secs(1), "{e}");
        let start = Instant::now();
        let _ = win.deregister();
        drop(win);
        assert!(start.elapsed() < TIMEOUT + Duration::from_secs(1));
        println!("RESULT survived");
        return;
    }
    let out = launch("gloo_window_peer_killed", "killed", 3, &[], Duration::from_secs(90));
    assert_eq!(out[2].signal(), Some(libc::SIGKILL), "{}", out[2].describe());
    for o in &out[..2] {
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert!(o.results().iter().any(|r| r == "survived"), "{}", o.describe());
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
            assert!(matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout), "{e}");
        } else {
            let start = Instant::now();
            let e = win.deregister().unwrap_err();
            let took = start.elapsed();
            println!("RESULT kind={:?} ms={} msg={}", e.kind, took.as_millis(), e.message);
            // TC_ERR_REMOTE when the other waiting rank closed its
            // connections first and Gloo's message did not name it.
            assert!(matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote), "{e}");
            assert!(e.message.contains("deregister") && e.message.contains("rank(s) 2 "), "{e}");
            assert!(took < T + Duration::from_secs(1), "took {took:?}");
            // The buffer is released: registering again is refused now that
            // the window is unusable, with a clear error, not a hang.
            let e = win.register(ptr(&mut mem), mem.len()).unwrap_err();
            assert!(matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote), "{e}");
        }
        drop(win);
        println!("RESULT done");
        return;
    }
    let out = launch("gloo_window_deregister_timeout", "late", 3, &[], Duration::from_secs(60));
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
        let opts = OpOptions { timeout: Some(T), ..OpOptions::default() };
        let start = Instant::now();
        let e = win.put(src.as_ptr() as *const c_void, src.len(), 1, 0, &opts).unwrap_err();
        let took = start.elapsed();
        println!("RESULT kind={:?} ms={} msg={}", e.kind, took.as_millis(), e.message);
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(e.message.contains("put") && e.message.contains("rank 1"), "{e}");
        assert!(took + Duration::from_millis(50) >= T && took < T + Duration::from_secs(1), "took {took:?}");
        // The window is unusable now, and says so at once.
        let start = Instant::now();
        let e = win.signal(1, &opts).unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(500), "{e}");
        drop(win);
        println!("RESULT done");
        return;
    }
    let mut stopped = false;
    let out = launch_with("gloo_window_put_to_stopped_peer", "stopped", 2, &[], Duration::from_secs(60), |t, children| {
        if !stopped && t > Duration::from_millis(800) {
            unsafe { libc::kill(children[1].id() as i32, libc::SIGSTOP) };
            stopped = true;
        }
        if t > Duration::from_secs(6) {
            let _ = children[1].kill();
        }
    });
    assert!(out[0].ok(), "{}", out[0].describe());
    assert!(out[0].results().iter().any(|r| r == "done"), "{}", out[0].describe());
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
        println!("RESULT kind={:?} ms={} msg={}", e.kind, took.as_millis(), e.message);
        assert!(matches!(e.kind, ErrorKind::Remote | ErrorKind::Timeout), "{e}");
        assert!(took < T + Duration::from_secs(1), "took {took:?}: {e}");
        drop(win);
        println!("RESULT survived");
        return;
    }
    let out = launch("gloo_window_peer_killed_during_deregister", "killed_dereg", 3, &[], Duration::from_secs(60));
    assert_eq!(out[2].signal(), Some(libc::SIGKILL), "{}", out[2].describe());
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert!(o.results().iter().any(|r| r == "survived"), "{}", o.describe());
        for r in o.results() {
            eprintln!("rank {}: {r}", o.rank);
        }
    }
}
