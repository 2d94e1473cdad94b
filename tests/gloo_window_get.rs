//! `Window::get` (tc_window_get) on the gloo backend with real processes (2,
//! 3 and 4 ranks), over both paths: buffers from `tc_mem_alloc` (same-host
//! peers map them: a get is a memory copy) and ordinary heap buffers (a get
//! is a request answered by the target's window service). Every rank reads
//! every rank's buffer (itself included) byte for byte, small and larger
//! than one message; reads back, without any signal, what it has just put
//! into its successor (blocking, asynchronous and large puts: a get follows
//! this rank's earlier puts to that rank); and gets bad arguments refused
//! with a message naming the argument (rank out of range, offset + bytes
//! past the end or overflowing, no buffer registered).

mod gloo_common;

use gloo_common::*;
use std::ffi::c_void;
use std::time::Duration;
use torchcomm::ErrorKind;
use torchcomm::Window;
use torchcomm::{Comm, Op, OpOptions};

const TIMEOUT: Duration = Duration::from_secs(30);
/// The base pattern [0, BASE) is written by its owner only.
const BASE: usize = 40_000;
/// Puts from rank r land at PUTS + r * PUT_SPAN.
const PUTS: usize = 40_960;
const PUT_SPAN: usize = 12_288;

fn size_of(r: i32) -> usize {
    PUTS + 4 * PUT_SPAN + 64 * r as usize + 8
}

fn base_byte(owner: i32, i: usize) -> u8 {
    (owner as u8)
        .wrapping_mul(71)
        .wrapping_add((i % 251) as u8)
        .wrapping_add((i / 251) as u8)
}

fn put_byte(origin: i32, round: usize, i: usize) -> u8 {
    (origin as u8)
        .wrapping_mul(13)
        .wrapping_add(round as u8 * 29)
        .wrapping_add(i as u8)
        | 1
}

fn async_opts() -> OpOptions {
    OpOptions {
        async_op: true,
        ..OpOptions::default()
    }
}

fn barrier(comm: &Comm) {
    run(comm, Op::Barrier).unwrap();
}

/// Reads `len` bytes at `off` of `rank`'s buffer.
fn get_vec(win: &Window, rank: i32, off: usize, len: usize, opts: &OpOptions) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let work = win
        .get(v.as_mut_ptr() as *mut c_void, len, rank, off, opts)
        .unwrap_or_else(|e| panic!("get of {len} bytes at {off} from rank {rank}: {e}"));
    work.wait_blocking().unwrap();
    v
}

fn check_bad_arguments(win: &Window, me: i32, n: i32) {
    let mut v = [0u8; 16];
    let dst = v.as_mut_ptr() as *mut c_void;
    let opts = OpOptions::default();
    for bad in [n, -1] {
        let e = win.get(dst, 4, bad, 0, &opts).map(drop).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains("'src_rank'"), "{e}");
        assert!(e.message.contains(&bad.to_string()), "{e}");
    }
    let next = (me + 1) % n;
    let size = size_of(next);
    let e = win
        .get(dst, 16, next, size - 8, &opts)
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("'src_offset'"), "{e}");
    assert!(e.message.contains(&size.to_string()), "{e}");
    assert!(e.message.contains("past the end"), "{e}");
    let e = win
        .get(dst, 16, next, usize::MAX - 7, &opts)
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains("'src_offset'"), "{e}");
    assert!(e.message.contains("overflows"), "{e}");
    // Refused asynchronous calls fail the call itself, queueing nothing.
    let e = win
        .get(dst, 16, next, size - 8, &async_opts())
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
}

fn get_child(shared: bool) {
    let comm = child_comm("get", TIMEOUT);
    let (me, n) = (comm.rank(), comm.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let bytes = size_of(me);
    let mut heap = Vec::new();
    let buf: *mut u8 = if shared {
        comm.alloc_memory(bytes).unwrap() as *mut u8
    } else {
        heap.resize(bytes, 0u8);
        heap.as_mut_ptr()
    };
    let mem = unsafe { std::slice::from_raw_parts_mut(buf, bytes) };
    for (i, b) in mem.iter_mut().enumerate() {
        *b = base_byte(me, i);
    }
    let win = Window::new(&comm).unwrap();

    // Before registration: refused, naming what is missing.
    let mut v = [0u8; 4];
    let e = win
        .get(
            v.as_mut_ptr() as *mut c_void,
            4,
            me,
            0,
            &OpOptions::default(),
        )
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    assert!(e.message.contains("tc_window_register"), "{e}");

    win.register(buf as *mut c_void, bytes).unwrap();
    // The path taken: a peer's buffer is mapped (copies) exactly when it
    // lies in shared memory.
    for q in (0..n).filter(|q| *q != me) {
        assert_eq!(
            win.map_remote(q).is_ok(),
            shared,
            "rank {q}'s buffer mapped here"
        );
    }

    // -- every rank's base pattern, small and large (more than one message)
    for q in 0..n {
        let small = get_vec(&win, q, 100 + q as usize, 37, &OpOptions::default());
        for (i, b) in small.iter().enumerate() {
            assert_eq!(
                *b,
                base_byte(q, 100 + q as usize + i),
                "small get from rank {q}, byte {i}"
            );
        }
        let large = get_vec(&win, q, 0, BASE, &async_opts());
        for (i, b) in large.iter().enumerate() {
            assert_eq!(*b, base_byte(q, i), "large get from rank {q}, byte {i}");
        }
    }

    // -- a get follows this rank's earlier puts to that rank, with no signal
    let at = PUTS + me as usize * PUT_SPAN;
    let block: Vec<u8> = (0..64).map(|i| put_byte(me, 1, i)).collect();
    win.put(
        block.as_ptr() as *const c_void,
        64,
        next,
        at,
        &OpOptions::default(),
    )
    .unwrap();
    assert_eq!(get_vec(&win, next, at, 64, &OpOptions::default()), block);
    // Many asynchronous small puts, then an asynchronous get of them all.
    let smalls: Vec<[u8; 8]> = (0..40)
        .map(|k| std::array::from_fn(|i| put_byte(me, 2, 8 * k + i)))
        .collect();
    let works: Vec<_> = smalls
        .iter()
        .enumerate()
        .map(|(k, s)| {
            win.put(
                s.as_ptr() as *const c_void,
                8,
                next,
                at + 8 * k,
                &async_opts(),
            )
            .unwrap()
        })
        .collect();
    let all = get_vec(&win, next, at, 320, &async_opts());
    for w in &works {
        assert!(w.status().is_finished(), "a put completed after the get");
        w.wait_blocking().unwrap();
    }
    assert_eq!(all, smalls.concat());
    // A put larger than one message, then a blocking get of it.
    let large: Vec<u8> = (0..10_000).map(|i| put_byte(me, 3, i)).collect();
    win.put(
        large.as_ptr() as *const c_void,
        large.len(),
        next,
        at,
        &async_opts(),
    )
    .unwrap();
    assert_eq!(
        get_vec(&win, next, at, large.len(), &OpOptions::default()),
        large
    );
    // Into this rank's own buffer from itself: memmove semantics.
    let _ = get_vec(&win, me, 0, 0, &OpOptions::default());
    // (This rank's own span of its buffer: nobody else reads or writes it.)
    for i in 0..101 {
        mem[at + i] = i as u8;
    }
    win.get(
        buf.wrapping_add(at + 1) as *mut c_void,
        100,
        me,
        at,
        &OpOptions::default(),
    )
    .unwrap();
    assert!((0..100).all(|i| mem[at + 1 + i] == i as u8));

    check_bad_arguments(&win, me, n);

    // The predecessor's puts, as its signal publishes them.
    win.signal(next, &OpOptions::default()).unwrap();
    win.wait_signal(prev, &OpOptions::default()).unwrap();
    let theirs = PUTS + prev as usize * PUT_SPAN;
    for i in 0..10_000 {
        assert_eq!(
            mem[theirs + i],
            put_byte(prev, 3, i),
            "put from rank {prev}, byte {i}"
        );
    }

    // Nobody deregisters while another still reads its buffer.
    barrier(&comm);
    win.deregister().unwrap();
    let e = win
        .get(
            v.as_mut_ptr() as *mut c_void,
            4,
            next,
            0,
            &OpOptions::default(),
        )
        .map(drop)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    drop(win);
    if shared {
        comm.free_memory(buf as *mut c_void).unwrap();
    }
    comm.finalize().unwrap();
    println!("RESULT ok");
}

fn get_test(test: &str, n: usize, shared: bool) {
    if role().is_some() {
        get_child(shared);
        return;
    }
    let out = launch(test, "get", n, &[], Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
    }
}

#[test]
fn gloo_window_get_messages_2() {
    get_test("gloo_window_get_messages_2", 2, false);
}

#[test]
fn gloo_window_get_messages_3() {
    get_test("gloo_window_get_messages_3", 3, false);
}

#[test]
fn gloo_window_get_messages_4() {
    get_test("gloo_window_get_messages_4", 4, false);
}

#[test]
fn gloo_window_get_shared_2() {
    get_test("gloo_window_get_shared_2", 2, true);
}

#[test]
fn gloo_window_get_shared_3() {
    get_test("gloo_window_get_shared_3", 3, true);
}

/// A get from a stopped process (SIGSTOP; heap buffers, so the get is a
/// request its service never answers) fails with TC_ERR_TIMEOUT within the
/// comm's timeout (no per-call timeout given), naming the get and the
/// peer; the window then refuses calls at once, saying why.
#[test]
fn gloo_window_get_from_stopped_peer() {
    const T: Duration = Duration::from_millis(2000);
    if role().is_some() {
        let comm = child_comm("get-stopped", T);
        let me = comm.rank();
        let win = Window::new(&comm).unwrap();
        let mut mem = vec![0u8; 1 << 16];
        win.register(mem.as_mut_ptr() as *mut c_void, mem.len())
            .unwrap();
        println!("RESULT registered");
        if me == 1 {
            // Stopped by the parent; then killed.
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        std::thread::sleep(Duration::from_millis(1500));
        let mut dst = vec![0u8; 1 << 16];
        let start = std::time::Instant::now();
        let work = win
            .get(
                dst.as_mut_ptr() as *mut c_void,
                dst.len(),
                1,
                0,
                &async_opts(),
            )
            .unwrap();
        let e = work.wait_blocking().unwrap_err();
        let took = start.elapsed();
        println!(
            "RESULT kind={:?} ms={} msg={}",
            e.kind,
            took.as_millis(),
            e.message
        );
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(
            e.message.contains("get") && e.message.contains("rank 1"),
            "{e}"
        );
        assert!(took + Duration::from_millis(50) >= T, "took {took:?}");
        assert!(took < T + Duration::from_secs(5), "took {took:?}");
        let e = win
            .get(
                dst.as_mut_ptr() as *mut c_void,
                8,
                1,
                0,
                &OpOptions::default(),
            )
            .map(drop)
            .unwrap_err();
        assert!(
            e.message.contains("unusable after an earlier failure"),
            "{e}"
        );
        drop(win);
        println!("RESULT done");
        return;
    }
    let mut stopped = false;
    let out = launch_with(
        "gloo_window_get_from_stopped_peer",
        "get-stopped",
        2,
        &[],
        Duration::from_secs(60),
        |t, children| {
            if !stopped && t > Duration::from_millis(800) {
                unsafe { libc::kill(children[1].id() as i32, libc::SIGSTOP) };
                stopped = true;
            }
            if t > Duration::from_secs(8) {
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
