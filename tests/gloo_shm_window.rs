//! Windows over shared memory on the gloo backend, with real processes (2,
//! 3 and 4 ranks on one host): buffers from `tc_mem_alloc` are mapped by the
//! other ranks at registration, so `map_remote` gives a pointer every rank
//! can store through, and puts are copies. Ranks that register ordinary
//! memory stay reachable by messages, and `map_remote` of them is refused.
//! The same checks on windows over UCX (shared memory off, UCX as the host
//! transport over TCP loopback): the UCX window maps same-host peers'
//! `tc_mem_alloc` buffers alike, while its puts and signals go through UCX.

mod gloo_common;
mod ucx_common;

use gloo_common::*;
use std::ffi::c_void;
use std::time::Duration;
use torchcomm::ErrorKind;
use torchcomm::Op;
use torchcomm::Window;

const TIMEOUT: Duration = Duration::from_secs(20);

/// Size of rank r's buffer: every rank's differs, and a large put fits.
fn size_of(r: i32) -> usize {
    (1 << 20) + 4096 + 64 * r as usize
}

fn byte(origin: i32, i: usize, round: u8) -> u8 {
    (origin as u8)
        .wrapping_mul(53)
        .wrapping_add(i as u8)
        .wrapping_add(round)
        | 1
}

/// `plain_rank`: the rank that registers ordinary heap memory (or -1).
fn shm_child(plain_rank: i32) {
    let comm = child_comm("shm", TIMEOUT);
    let (me, n) = (comm.rank(), comm.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let bytes = size_of(me);
    let mut heap = Vec::new();
    let buf: *mut u8 = if me == plain_rank {
        heap.resize(bytes, 0xeeu8);
        heap.as_mut_ptr()
    } else {
        let p = comm.alloc_memory(bytes + 100).unwrap() as *mut u8;
        // tc_mem_alloc memory is zeroed; the window starts 100 bytes in.
        assert!(unsafe { std::slice::from_raw_parts(p, bytes + 100) }
            .iter()
            .all(|b| *b == 0));
        unsafe { std::ptr::write_bytes(p, 0xee, bytes + 100) };
        unsafe { p.add(100) }
    };
    let mem = unsafe { std::slice::from_raw_parts_mut(buf, bytes) };
    let win = Window::new(&comm).unwrap();
    win.register(buf as *mut c_void, bytes).unwrap();

    // map_remote: this rank's own buffer always; a shared peer's buffer as
    // a pointer into its memory; a plain peer's buffer is refused.
    assert_eq!(win.map_remote(me).unwrap(), buf as *mut c_void);
    for q in (0..n).filter(|q| *q != me) {
        match win.map_remote(q) {
            Ok(p) => {
                assert!(
                    q != plain_rank,
                    "rank {q} registered heap memory, yet was mapped"
                );
                assert!(!p.is_null());
            }
            Err(e) => {
                assert_eq!(
                    q, plain_rank,
                    "rank {q}'s shared buffer was not mapped: {e}"
                );
                assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
                assert!(e.message.contains("tc_mem_alloc"), "{e}");
            }
        }
    }

    // Round 1: a ring of puts (one small at this rank's offset, one of
    // 1 MiB after it), then a signal; checked at the target.
    let small: Vec<u8> = (0..1000).map(|i| byte(me, i, 1)).collect();
    let large: Vec<u8> = (0..1 << 20).map(|i| byte(me, i, 2)).collect();
    win.put(
        small.as_ptr() as *const c_void,
        small.len(),
        next,
        8 * me as usize,
        &Default::default(),
    )
    .unwrap();
    win.put(
        large.as_ptr() as *const c_void,
        large.len(),
        next,
        4096,
        &Default::default(),
    )
    .unwrap();
    win.signal(next, &Default::default()).unwrap();
    win.wait_signal(prev, &Default::default()).unwrap();
    let at = 8 * prev as usize;
    for i in 0..1000 {
        assert_eq!(
            mem[at + i],
            byte(prev, i, 1),
            "small put from rank {prev}, byte {i}"
        );
    }
    for (i, b) in mem[4096..4096 + (1 << 20)].iter().enumerate() {
        assert_eq!(*b, byte(prev, i, 2), "large put from rank {prev}, byte {i}");
    }
    assert!(
        mem[4096 + (1 << 20)..].iter().all(|b| *b == 0xee),
        "bytes past the large put untouched"
    );

    // Round 2: stores straight through the mapping of the next rank's
    // buffer, published by a signal.
    if let Ok(p) = win.map_remote(next) {
        let remote = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, size_of(next)) };
        for (i, b) in remote[2000..2500].iter_mut().enumerate() {
            *b = byte(me, i, 3);
        }
    } else {
        let v: Vec<u8> = (0..500).map(|i| byte(me, i, 3)).collect();
        win.put(
            v.as_ptr() as *const c_void,
            v.len(),
            next,
            2000,
            &Default::default(),
        )
        .unwrap();
    }
    win.signal(next, &Default::default()).unwrap();
    win.wait_signal(prev, &Default::default()).unwrap();
    for i in 0..500 {
        assert_eq!(
            mem[2000 + i],
            byte(prev, i, 3),
            "store from rank {prev}, byte {i}"
        );
    }

    // Nobody deregisters while another still reads its own buffer.
    torchcomm_run_barrier(&comm);
    win.deregister().unwrap();
    assert_eq!(
        win.map_remote(next).unwrap_err().kind,
        ErrorKind::InvalidUsage
    );
    if me != plain_rank {
        comm.free_memory(unsafe { buf.sub(100) } as *mut c_void)
            .unwrap();
    }
    drop(win);
    comm.finalize().unwrap();
    println!("RESULT ok");
}

fn torchcomm_run_barrier(comm: &torchcomm::Comm) {
    run(comm, Op::Barrier).unwrap();
}

fn shm(test: &str, n: usize, plain_rank: i32) {
    if role().is_some() {
        shm_child(plain_rank);
        return;
    }
    let out = launch(test, "shm", n, &[], Duration::from_secs(60));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
    }
}

/// [`shm`] on windows over UCX; each rank's log must show its window went
/// over UCX (not a silent fallback to the Gloo window).
fn shm_over_ucx(test: &str, n: usize, plain_rank: i32) {
    if role().is_some() {
        shm_child(plain_rank);
        return;
    }
    if ucx_common::ucx_missing() {
        return;
    }
    let mut env = ucx_common::LOOPBACK_ENV.to_vec();
    env.push(("TORCHCOMM_DEBUG", "INFO"));
    let out = launch(test, "shm", n, &env, Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
        assert!(
            o.stderr.contains("(UCP remote memory access)"),
            "not a window over UCX: {}",
            o.describe()
        );
    }
}

#[test]
fn ucx_shm_window_2() {
    shm_over_ucx("ucx_shm_window_2", 2, -1);
}

#[test]
fn ucx_shm_window_3_one_plain() {
    shm_over_ucx("ucx_shm_window_3_one_plain", 3, 1);
}

#[test]
fn gloo_shm_window_2() {
    shm("gloo_shm_window_2", 2, -1);
}

#[test]
fn gloo_shm_window_3_one_plain() {
    shm("gloo_shm_window_3_one_plain", 3, 1);
}

#[test]
fn gloo_shm_window_4() {
    shm("gloo_shm_window_4", 4, -1);
}

/// Freeing memory that was not allocated, or twice, names the pointer.
#[test]
fn gloo_mem_free_checks_its_pointer() {
    if role().is_some() {
        let comm = child_comm("shm-free", TIMEOUT);
        let p = comm.alloc_memory(4096).unwrap();
        let mut other = [0u8; 8];
        let e = comm
            .free_memory(other.as_mut_ptr() as *mut c_void)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains("not allocated by tc_mem_alloc"), "{e}");
        comm.free_memory(p).unwrap();
        assert_eq!(
            comm.free_memory(p).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        comm.finalize().unwrap();
        println!("RESULT ok");
        return;
    }
    let out = launch(
        "gloo_mem_free_checks_its_pointer",
        "shm-free",
        1,
        &[],
        Duration::from_secs(30),
    );
    assert_all_ok(&out);
    assert_eq!(out[0].results(), ["ok"], "{}", out[0].describe());
}

/// Signals between shared-memory peers are counted (three signals satisfy
/// three waits, a fourth times out on time), and a peer that dies while
/// another waits for its signal fails that wait promptly instead of letting
/// it run to its timeout.
#[test]
fn gloo_shm_signals_counted_and_peer_death_seen() {
    if role().is_some() {
        let comm = child_comm("shm-signals", TIMEOUT);
        let me = comm.rank();
        let bytes = 4096;
        let buf = comm.alloc_memory(bytes).unwrap();
        let win = Window::new(&comm).unwrap();
        win.register(buf, bytes).unwrap();
        assert!(
            win.map_remote(1 - me).is_ok(),
            "the peer's buffer is shared"
        );
        let quick = |ms| torchcomm::OpOptions {
            timeout: Some(Duration::from_millis(ms)),
            ..Default::default()
        };
        if me == 1 {
            for _ in 0..3 {
                win.signal(0, &Default::default()).unwrap();
            }
            // Wait for rank 0 to have counted them, then die mid-window.
            win.wait_signal(0, &Default::default()).unwrap();
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        for _ in 0..3 {
            win.wait_signal(1, &Default::default()).unwrap();
        }
        let t = std::time::Instant::now();
        let e = win.wait_signal(1, &quick(300)).map(drop).unwrap_err();
        let took = t.elapsed();
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(
            took >= Duration::from_millis(290) && took < Duration::from_millis(1500),
            "{took:?}"
        );
        win.signal(1, &Default::default()).unwrap();
        let t = std::time::Instant::now();
        let e = win.wait_signal(1, &quick(15_000)).map(drop).unwrap_err();
        let took = t.elapsed();
        assert!(
            matches!(e.kind, ErrorKind::Remote | ErrorKind::Aborted),
            "{e}"
        );
        assert!(
            took < Duration::from_secs(5),
            "the death was seen after {took:?}: {e}"
        );
        println!("RESULT ok {}ms", took.as_millis());
        return;
    }
    let out = launch(
        "gloo_shm_signals_counted_and_peer_death_seen",
        "shm-signals",
        2,
        &[],
        Duration::from_secs(60),
    );
    out[1].assert_killed();
    assert!(out[0].ok(), "{}", out[0].describe());
    assert!(
        out[0]
            .results()
            .first()
            .is_some_and(|r| r.starts_with("ok")),
        "{}",
        out[0].describe()
    );
    eprintln!("rank 0: {:?}", out[0].results());
}
