//! Shared memory when the ranks share one CPU: every rank pins itself to
//! CPU 0 after creating its comm (what the scheduler does when it puts the
//! ranks together on a machine of several CPUs; the comm was made seeing
//! them all, so its waits would busy poll). The waits must then yield to
//! the peer they wait for (see `shared_memory/engine/wait.rs`): real processes of 2,
//! 3 and 4 ranks run every dtype under every reduce op the dtype takes,
//! small counts, all_reduce, reduce to the last rank, broadcast and
//! barrier, then many back-to-back calls; every rank's result bytes are
//! gathered and must be identical on every rank (and, for the integer sums,
//! equal the sum computed here). A rank killed while the others wait on the
//! shared CPU is named at once. No timing is asserted beyond the test's
//! own timeouts.

mod gloo_common;

use gloo_common::*;
use std::time::{Duration, Instant};
use torchcomm::ErrorKind;
use torchcomm::{Comm, Op};
use torchcomm::{DType, PremulFactor, RedKind, ReduceOp};

/// Pins this process to CPU 0 (the comm exists already).
fn share_cpu_0() {
    // SAFETY: a zeroed set with one CPU, for this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// Every rank's `bytes`, in rank order (an all_gather of the bytes).
fn gathered(comm: &Comm, bytes: &mut [u8]) -> Vec<Vec<u8>> {
    let n = comm.size() as usize;
    let mut all = vec![0u8; bytes.len() * n];
    run(
        comm,
        Op::all_gather_single(ptr(&mut all), ptr(bytes), bytes.len(), DType::U8),
    )
    .unwrap();
    all.chunks(bytes.len().max(1)).map(|c| c.to_vec()).collect()
}

/// Whether every rank holds the same bytes.
fn same_everywhere(comm: &Comm, bytes: &mut [u8], what: &str) {
    if bytes.is_empty() {
        return;
    }
    let all = gathered(comm, bytes);
    for (r, b) in all.iter().enumerate() {
        assert_eq!(
            b, &all[0],
            "{what}: rank {r}'s result differs from rank 0's"
        );
    }
}

/// Small values of `dtype` (the element size's little-endian bytes of a
/// small integer, or of a small float for the floating dtypes), different
/// per rank.
fn input(dtype: DType, me: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        let v = ((me * 3 + i % 5) % 7 + 1) as u64;
        match dtype {
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F64 => out.extend((v as f64).to_le_bytes()),
            DType::BF16 => out.extend((((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
            // 1.0 .. 7.0 as float16: exponent 15 (+1 or +2), mantissa.
            DType::F16 => out.extend(half(v as f32).to_le_bytes()),
            DType::F8E4M3 | DType::F8E5M2 | DType::Bool => out.push((v & 1) as u8),
            _ => out.extend(&v.to_le_bytes()[..dtype.size()]),
        }
    }
    out
}

/// `x` (a small integer) as float16 bits.
fn half(x: f32) -> u16 {
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    ((exp as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
}

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(if kind == RedKind::PremulSum { 0.5 } else { 1.0 }),
    }
}

fn every_dtype_and_op(comm: &Comm) -> usize {
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let mut checked = 0;
    for dtype in DType::ALL {
        for kind in RedKind::ALL {
            for count in [1usize, 3, 64, 1000] {
                let mut buf = input(dtype, me, count);
                let op = Op::all_reduce(ptr(&mut buf), count, dtype, red(kind));
                // A combination the library refuses is refused on every
                // rank alike (before any data moves): skip it.
                if let Err(e) = run(comm, op) {
                    assert!(
                        matches!(
                            e.kind,
                            ErrorKind::Unsupported
                                | ErrorKind::InvalidArgument
                                | ErrorKind::InvalidUsage
                        ),
                        "{dtype:?} {kind:?}: {e}"
                    );
                    continue;
                }
                let what = format!("all_reduce {dtype:?} {kind:?} count {count}");
                if kind == RedKind::Sum && dtype == DType::I32 {
                    for i in 0..count {
                        let want: i32 = (0..n).map(|r| ((r * 3 + i % 5) % 7 + 1) as i32).sum();
                        let got = i32::from_le_bytes(buf[i * 4..i * 4 + 4].try_into().unwrap());
                        assert_eq!(got, want, "{what} [{i}]");
                    }
                }
                same_everywhere(comm, &mut buf, &what);
                checked += 1;
            }
        }
        let mut b = input(dtype, me, 5);
        let root = n - 1;
        run(comm, Op::broadcast(ptr(&mut b), 5, dtype, root as i32)).unwrap();
        assert_eq!(b, input(dtype, root, 5), "broadcast {dtype:?}");
        let mut d = input(dtype, me, 7);
        let reduced = run(
            comm,
            Op::reduce(ptr(&mut d), 7, dtype, root as i32, red(RedKind::Max)),
        );
        if reduced.is_ok() && me == root {
            let mut want = input(dtype, 0, 7);
            for r in 1..n {
                let theirs = input(dtype, r, 7);
                // Max of small non-negative values: bytewise per element
                // for the little-endian integers and bool, by value below.
                for (w, t) in want
                    .chunks_mut(dtype.size())
                    .zip(theirs.chunks(dtype.size()))
                {
                    if le(t) > le(w) {
                        w.copy_from_slice(t);
                    }
                }
            }
            assert_eq!(d, want, "reduce max {dtype:?} on the root");
        }
    }
    for k in 0..2000u64 {
        run(comm, Op::Barrier).unwrap();
        let mut x = [me as i64 + k as i64; 2];
        let mut bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let op = Op::all_reduce(ptr(&mut bytes), 2, DType::I64, red(RedKind::Sum));
        run(comm, op).unwrap();
        for (i, c) in bytes.chunks(8).enumerate() {
            x[i] = i64::from_le_bytes(c.try_into().unwrap());
        }
        let want = (0..n as i64).map(|r| r + k as i64).sum::<i64>();
        assert_eq!(x, [want; 2], "call {k}");
    }
    checked
}

/// A little-endian element's value (for the orderings of small positive
/// values of every dtype: integers, and floats whose bits order as values).
fn le(b: &[u8]) -> u64 {
    b.iter().rev().fold(0u64, |v, x| (v << 8) | *x as u64)
}

fn child() {
    let comm = child_comm("shared-cpu", Duration::from_secs(60));
    share_cpu_0();
    let checked = every_dtype_and_op(&comm);
    assert!(checked > 100, "only {checked} combinations ran");
    println!("RESULT ok {checked}");
}

fn shared_cpu(test: &str, n: usize) {
    let out = launch(test, "shared", n, &[], Duration::from_secs(300));
    assert_all_ok(&out);
    let first = out[0].results();
    for o in &out {
        assert_eq!(o.results(), first, "{}", o.describe());
        assert!(o.results()[0].starts_with("ok "), "{}", o.describe());
    }
}

#[test]
fn gloo_shared_cpu_2() {
    if role().is_some() {
        return child();
    }
    shared_cpu("gloo_shared_cpu_2", 2);
}

#[test]
fn gloo_shared_cpu_3() {
    if role().is_some() {
        return child();
    }
    shared_cpu("gloo_shared_cpu_3", 3);
}

#[test]
fn gloo_shared_cpu_4() {
    if role().is_some() {
        return child();
    }
    shared_cpu("gloo_shared_cpu_4", 4);
}

/// A rank killed while the others wait for it on their shared CPU (the
/// waits yield there rather than spin): the survivors fail with
/// TC_ERR_REMOTE naming it within two seconds, not at their 10 s timeout.
#[test]
fn gloo_shared_cpu_dead_peer_seen_at_once() {
    if role().is_some() {
        let comm = child_comm("shared-cpu-dead", Duration::from_secs(10));
        share_cpu_0();
        run(&comm, Op::Barrier).unwrap();
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(300));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut x = [1i32; 4];
        let start = Instant::now();
        let (e, last) = loop {
            let last = Instant::now();
            let op = Op::all_reduce(ptr(&mut x), 4, DType::I32, red(RedKind::Sum));
            if let Err(e) = run(&comm, op) {
                break (e, last);
            }
            x = [1; 4];
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "all_reduce never failed"
            );
        };
        let took = last.elapsed();
        println!("RESULT kind={:?} ms={}", e.kind, took.as_millis());
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        assert!(e.message.contains("rank 1's process exited"), "{e}");
        assert!(took < Duration::from_secs(2), "seen after {took:?}: {e}");
        return;
    }
    let out = launch(
        "gloo_shared_cpu_dead_peer_seen_at_once",
        "shared-dead",
        3,
        &[],
        Duration::from_secs(60),
    );
    out[1].assert_killed();
    for o in [&out[0], &out[2]] {
        assert!(o.ok(), "{}", o.describe());
    }
}
