//! The UCX host transport with real processes over TCP loopback (shared
//! memory off, `UCX_TLS=tcp,self`), 2, 3 and 4 ranks: every operation it
//! carries x every dtype x every reduce op, integers and bool bit for bit
//! against the same operation on a Gloo comm of the same ranks, floats
//! against a reference; point-to-point with several tags and sizes (eager
//! and rendezvous); a rank killed mid-operation; UCX hidden from the loader;
//! each collective at sizes on either side of the largest first-step
//! message that travels inside the neighbour check's message (64 KiB).
//! Every test says SKIPPED (and passes) where libucp.so.0 is missing.

mod gloo_common;
mod ucx_checks;
mod ucx_common;

use gloo_common::*;
// One name in both globs: the shared one (the same for bytes).
use gloo_common::ptr;
use std::time::{Duration, Instant};
use torchcomm::{Comm, Op, Ptr};
use torchcomm::{DType, ReduceOp};
use ucx_checks::*;
use ucx_common::*;

/// Launches `size` ranks over TCP loopback, UCX between "hosts", logging
/// at INFO, with `extra` in their environment.
fn launch_ucx(test: &str, size: usize, extra: &[(&str, &str)]) -> Vec<Outcome> {
    let mut env = LOOPBACK_ENV.to_vec();
    env.push(("TORCHCOMM_DEBUG", "INFO"));
    env.extend_from_slice(extra);
    launch(test, "child", size, &env, Duration::from_secs(240))
}

fn version(c: &Comm) -> String {
    c.backend_version().to_string_lossy().into_owned()
}

fn child_ops() {
    let ucx = comm_with("ucx", "ucx", Duration::from_secs(60));
    let gloo = comm_with("gloo", "gloo", Duration::from_secs(60));
    assert!(version(&ucx).contains("UCX 1."), "{}", version(&ucx));
    assert!(!version(&gloo).contains("UCX"), "{}", version(&gloo));
    let (me, n) = (rank() as usize, size() as usize);
    check_p2p(&ucx, me, n);
    check_movers(&ucx, me, n);
    check_reductions(&ucx, &gloo, me, n);
    check_v(&ucx, &gloo, me, n);
    check_ring_segments(&ucx, &gloo, me, n);
    // The comm remembers the mismatched receive of check_p2p.
    if let Err(e) = ucx.finalize() {
        assert!(e.message.contains("does not match"), "{}", e.message);
    }
    gloo.finalize().unwrap();
}

fn ops_world(test: &str, size: usize) {
    if gloo_common::role().is_some() {
        return child_ops();
    }
    if ucx_missing() {
        return;
    }
    let out = launch_ucx(test, size, &[]);
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 5, "{}", o.describe());
    }
}

#[test]
fn ucx_ops_2() {
    ops_world("ucx_ops_2", 2);
}

#[test]
fn ucx_ops_3() {
    ops_world("ucx_ops_3", 3);
}

#[test]
fn ucx_ops_4() {
    ops_world("ucx_ops_4", 4);
}

/// The elements of a float32 or uint8 buffer.
fn elements(dtype: DType, b: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        _ => b.iter().map(|v| *v as f64).collect(),
    }
}

/// Every collective (roots 0 and n - 1) over `count` elements of `dtype`
/// per rank, checked element by element (sums of small integers: exact).
fn check_collectives_at(ucx: &Comm, dtype: DType, count: usize, me: usize, n: usize) {
    let es = dtype.size();
    let what = format!("{dtype:?} count {count}");
    let of = |r: usize, c: usize| data(dtype, c, r, 4);
    let sum_of = |c: usize| -> Vec<f64> {
        let ranks: Vec<Vec<f64>> = (0..n).map(|r| elements(dtype, &of(r, c))).collect();
        (0..c).map(|i| ranks.iter().map(|v| v[i]).sum()).collect()
    };
    let mut b = of(me, count);
    run(
        ucx,
        Op::all_reduce(ptr(&mut b), count, dtype, ReduceOp::SUM),
    )
    .unwrap();
    assert_eq!(elements(dtype, &b), sum_of(count), "all_reduce {what}");
    let root = n - 1;
    let mut b = of(me, count);
    let op = Op::reduce(ptr(&mut b), count, dtype, root as i32, ReduceOp::SUM);
    run(ucx, op).unwrap();
    if me == root {
        assert_eq!(elements(dtype, &b), sum_of(count), "reduce {what}");
    }
    let all: Vec<u8> = (0..n).flat_map(|r| of(r, count)).collect();
    let (mut input, mut out) = (of(me, count), vec![0u8; count * es * n]);
    let op = Op::all_gather_single(ptr(&mut out), ptr(&mut input), count, dtype);
    run(ucx, op).unwrap();
    assert_eq!(out, all, "all_gather {what}");
    let mut out = vec![0u8; count * es * n];
    let op = Op::gather_single(ptr(&mut out), ptr(&mut input), count, dtype, 0);
    run(ucx, op).unwrap();
    if me == 0 {
        assert_eq!(out, all, "gather {what}");
    }
    let (mut input, mut out) = (of(me, count * n), vec![0u8; count * es]);
    let op = Op::reduce_scatter_single(ptr(&mut out), ptr(&mut input), count, dtype, ReduceOp::SUM);
    run(ucx, op).unwrap();
    let want = &sum_of(count * n)[me * count..(me + 1) * count];
    assert_eq!(elements(dtype, &out), want, "reduce_scatter {what}");
    let mut out = vec![0u8; count * es * n];
    let op = Op::all_to_all_single(ptr(&mut out), ptr(&mut input), count, dtype);
    run(ucx, op).unwrap();
    for r in 0..n {
        let theirs = of(r, count * n);
        let block = &theirs[me * count * es..(me + 1) * count * es];
        assert_eq!(
            &out[r * count * es..(r + 1) * count * es],
            block,
            "all_to_all {what}"
        );
    }
    for root in [0, n - 1] {
        let mut b = of(me, count);
        run(ucx, Op::broadcast(ptr(&mut b), count, dtype, root as i32)).unwrap();
        assert_eq!(b, of(root, count), "broadcast from {root} {what}");
        let mut inputs: Vec<Vec<u8>> = (0..n).map(|r| of(r + 10 * root, count)).collect();
        let list: Vec<Ptr> = inputs.iter_mut().map(|v| ptr(v)).collect();
        let mut out = vec![0u8; count * es];
        let op = Op::scatter(ptr(&mut out), list, count, dtype, root as i32);
        run(ucx, op).unwrap();
        assert_eq!(out, of(me + 10 * root, count), "scatter from {root} {what}");
    }
    run(ucx, Op::Barrier).unwrap();
}

fn sizes_world(test: &str, ranks: usize) {
    if gloo_common::role().is_some() {
        let ucx = comm_with("sizes", "ucx", Duration::from_secs(60));
        assert!(version(&ucx).contains("UCX 1."), "{}", version(&ucx));
        let (me, n) = (rank() as usize, size() as usize);
        // 64 KiB and its neighbours in float32 and in bytes; nothing (no
        // step at all); one element; 8 KiB (UCX over TCP sends rendezvous
        // from there, and the folded message is 56 bytes more).
        for count in [0, 1, 2048, 16383, 16384, 16385] {
            check_collectives_at(&ucx, DType::F32, count, me, n);
        }
        for count in [8192, 65535, 65536, 65537] {
            check_collectives_at(&ucx, DType::U8, count, me, n);
        }
        println!("RESULT sizes around 64 KiB right");
        return;
    }
    if ucx_missing() {
        return;
    }
    let out = launch_ucx(test, ranks, &[]);
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

#[test]
fn ucx_sizes_around_the_check_message_2_ranks() {
    sizes_world("ucx_sizes_around_the_check_message_2_ranks", 2);
}

#[test]
fn ucx_sizes_around_the_check_message_3_ranks() {
    sizes_world("ucx_sizes_around_the_check_message_3_ranks", 3);
}

/// Rank 2 of 3 dies in the middle of a stream of all_reduces: each
/// survivor fails well before its 20 s timeout, naming rank 2.
#[test]
fn ucx_peer_killed() {
    const TIMEOUT: Duration = Duration::from_secs(20);
    if gloo_common::role().is_some() {
        let comm = comm_with("killed", "ucx", TIMEOUT);
        assert!(version(&comm).contains("UCX"), "{}", version(&comm));
        if rank() == 2 {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
        }
        let mut data = vec![1.0f32; 1 << 18];
        let count = data.len();
        for _ in 0..1_000_000 {
            let start = Instant::now();
            let op = Op::all_reduce(
                Ptr(data.as_mut_ptr() as *mut std::ffi::c_void),
                count,
                DType::F32,
                ReduceOp::SUM,
            );
            if let Err(e) = run(&comm, op) {
                let took = start.elapsed();
                println!(
                    "RESULT kind={:?} ms={} msg={}",
                    e.kind,
                    took.as_millis(),
                    e.message
                );
                assert!(
                    took < Duration::from_secs(5),
                    "took {took:?}: {}",
                    e.message
                );
                assert!(e.message.contains("rank 2"), "{}", e.message);
                return;
            }
        }
        panic!("all_reduce never failed");
    }
    if ucx_missing() {
        return;
    }
    let out = launch_ucx("ucx_peer_killed", 3, &[]);
    for o in &out[..2] {
        println!("rank {}: {:?}", o.rank, o.results());
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
    out[2].assert_killed();
}

/// UCX hidden from the loader: the comm says so at INFO and runs on Gloo.
#[test]
fn ucx_hidden_falls_back_to_gloo() {
    if gloo_common::role().is_some() {
        let comm = comm_with("hidden", "ucx", Duration::from_secs(30));
        assert!(!version(&comm).contains("UCX"), "{}", version(&comm));
        let mut v = vec![rank() as u8 + 1; 4];
        run(
            &comm,
            Op::all_reduce(ptr(&mut v), 4, DType::U8, ReduceOp::SUM),
        )
        .unwrap();
        assert_eq!(v, vec![3u8; 4]);
        println!("RESULT ok");
        return;
    }
    let hide = [("TORCHCOMM_UCX_LIBRARY", "libucp-hidden-by-test.so.0")];
    let out = launch_ucx("ucx_hidden_falls_back_to_gloo", 2, &hide);
    assert_all_ok(&out);
    for o in &out {
        assert!(
            o.stderr
                .contains("the host transport ucx was asked for but UCX is unavailable")
                && o.stderr.contains("using Gloo between hosts"),
            "{}",
            o.describe()
        );
    }
}

/// Ranks on different hosts (here: `TORCHCOMM_HOST_ID` set apart) that
/// leave the transport to the default use UCX between them, for
/// point-to-point and the collectives up to its largest size
/// (`TORCHCOMM_UCX_LARGEST`, 4 KiB here), and Gloo above it; each rank's
/// TRACE lines say which transport ran which call.
#[test]
fn ucx_by_default_between_hosts_up_to_its_largest_size() {
    const LARGEST: usize = 4096;
    if gloo_common::role().is_some() {
        std::env::set_var("TORCHCOMM_HOST_ID", format!("host-{}", rank()));
        let hints = Vec::new();
        let timeout = Duration::from_secs(60);
        let comm = child_comm_hinted(child_store(), "auto", (rank(), size()), timeout, hints);
        let comm = comm.unwrap();
        assert!(version(&comm).contains("UCX 1."), "{}", version(&comm));
        let n = size() as usize;
        for floats in [LARGEST / 4, LARGEST / 4 + 1] {
            let mut v: Vec<f32> = (0..floats).map(|i| (i + rank() as usize) as f32).collect();
            let buf = Ptr(v.as_mut_ptr().cast());
            let op = Op::all_reduce(buf, floats, DType::F32, ReduceOp::SUM);
            run(&comm, op).unwrap();
            let want = |i: usize| (n * i + n * (n - 1) / 2) as f32;
            assert!(v.iter().enumerate().all(|(i, x)| *x == want(i)), "{floats}");
        }
        comm.finalize().unwrap();
        println!("RESULT ok");
        return;
    }
    if ucx_missing() {
        return;
    }
    let env = [
        ("UCX_TLS", "tcp,self"),
        ("TORCHCOMM_DEBUG", "TRACE"),
        ("TORCHCOMM_UCX_LARGEST", "4096"),
    ];
    let test = "ucx_by_default_between_hosts_up_to_its_largest_size";
    let out = launch(test, "child", 2, &env, Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert!(
            o.stderr.contains("ucx: all_reduce (collective"),
            "{}",
            o.describe()
        );
        let above = "all_reduce of 4100 bytes is above the 4096 bytes UCX carries by default";
        assert!(o.stderr.contains(above), "{}", o.describe());
        let table = "point-to-point, and collectives of at most 4096 bytes";
        assert!(o.stderr.contains(table), "{}", o.describe());
    }
}
