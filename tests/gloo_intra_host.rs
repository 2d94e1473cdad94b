//! Shared-memory collectives of the gloo backend (every rank on this host),
//! with real processes: all_reduce, reduce, broadcast, all_gather_single,
//! reduce_scatter_single and all_to_all_single (in place and out of place),
//! the list forms, gather, scatter, all_gather_v, reduce_scatter_v and
//! all_to_all_v_single (and counts that differ between ranks), over several
//! chunks with uneven
//! sizes, checked element by element, and buffers overlapping on one rank
//! only (that rank must not leave the others' path); float
//! sums bit-identical on every rank; the path agreed off by all ranks when
//! one opts out (`TORCHCOMM_GLOO_SHM=0`), with the same results; a peer
//! that dies is seen through its process, long before the timeout.
//! (The operation matrix of tests/gloo_ops.rs runs through this path too.)

mod gloo_common;

use gloo_common::*;
use std::ffi::c_void;
use std::time::{Duration, Instant};
use torchcomm::ErrorKind;
use torchcomm::{Comm, Op, Ptr};
use torchcomm::{DType, PremulFactor, RedKind, ReduceOp};

const TIMEOUT: Duration = Duration::from_secs(20);

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(1.0),
    }
}

/// Operations spanning several 512 KiB chunks, uneven, checked exactly.
fn chunked_ops(comm: &Comm) {
    let (me, n) = (comm.rank(), comm.size());
    // int32 SUM over 400 003 elements (4 chunks, the last partial).
    let count = 400_003;
    let val = |r: i32, i: usize| ((r as i64 + 1) * i as i64 % 1000) as i32 - 300;
    let mut a: Vec<i32> = (0..count).map(|i| val(me, i)).collect();
    run(
        comm,
        Op::all_reduce(ptr(&mut a), count, DType::I32, red(RedKind::Sum)),
    )
    .unwrap();
    for (i, x) in a.iter().enumerate() {
        assert_eq!(
            *x,
            (0..n).map(|r| val(r, i)).sum::<i32>(),
            "int32 sum, element {i}"
        );
    }
    // float64 AVG and float32 MAX.
    let mut b: Vec<f64> = (0..count).map(|i| (me as f64) * 4.0 + i as f64).collect();
    run(
        comm,
        Op::all_reduce(ptr(&mut b), count, DType::F64, red(RedKind::Avg)),
    )
    .unwrap();
    let mean = (0..n).map(|r| r as f64 * 4.0).sum::<f64>() / n as f64;
    assert!(
        b.iter().enumerate().all(|(i, x)| *x == mean + i as f64),
        "float64 avg"
    );
    let mut c: Vec<f32> = (0..count)
        .map(|i| ((i as i64 * 7 + me as i64 * 13) % 101) as f32)
        .collect();
    run(
        comm,
        Op::all_reduce(ptr(&mut c), count, DType::F32, red(RedKind::Max)),
    )
    .unwrap();
    for (i, x) in c.iter().enumerate() {
        let want = (0..n)
            .map(|r| ((i as i64 * 7 + r as i64 * 13) % 101) as f32)
            .fold(f32::MIN, f32::max);
        assert_eq!(*x, want, "float32 max, element {i}");
    }
    // float32 SUM of values that round: every rank must get the same bits.
    let mut s: Vec<f32> = (0..count)
        .map(|i| 0.1 + (me as f32 + 1.0) * (i as f32) * 1e-3)
        .collect();
    run(
        comm,
        Op::all_reduce(ptr(&mut s), count, DType::F32, red(RedKind::Sum)),
    )
    .unwrap();
    let digest = s
        .iter()
        .fold(0u64, |h, x| h.rotate_left(5) ^ x.to_bits() as u64);
    let mut digests = vec![0u64; n as usize];
    let mut mine = [digest];
    run(
        comm,
        Op::all_gather_single(ptr(&mut digests), ptr(&mut mine), 1, DType::U64),
    )
    .unwrap();
    assert!(
        digests.iter().all(|d| *d == digest),
        "float sums differ between ranks: {digests:x?}"
    );
    // broadcast of 1.3 MB from the last rank.
    let bytes = 1_300_007;
    let root = n - 1;
    let mut d: Vec<u8> = if me == root {
        (0..bytes).map(|i| (i % 251) as u8).collect()
    } else {
        vec![0xee; bytes]
    };
    run(comm, Op::broadcast(ptr(&mut d), bytes, DType::U8, root)).unwrap();
    assert!(
        d.iter().enumerate().all(|(i, x)| *x == (i % 251) as u8),
        "broadcast"
    );
    // all_gather_single of 700 001 bytes per rank, out of place and in place.
    let per = 700_001;
    let block = |r: i32, i: usize| (r as usize * 37 + i * 3) as u8;
    let mut input: Vec<u8> = (0..per).map(|i| block(me, i)).collect();
    let mut out = vec![0u8; per * n as usize];
    run(
        comm,
        Op::all_gather_single(ptr(&mut out), ptr(&mut input), per, DType::U8),
    )
    .unwrap();
    let ok =
        |out: &[u8]| (0..n).all(|r| (0..per).all(|i| out[r as usize * per + i] == block(r, i)));
    assert!(ok(&out), "all_gather_single");
    let mut inplace = vec![0u8; per * n as usize];
    inplace[me as usize * per..(me as usize + 1) * per].copy_from_slice(&input);
    let own = Ptr(unsafe { inplace.as_mut_ptr().add(me as usize * per) } as *mut c_void);
    run(
        comm,
        Op::all_gather_single(ptr(&mut inplace), own, per, DType::U8),
    )
    .unwrap();
    assert!(ok(&inplace), "all_gather_single in place");
    // reduce (int64 MIN) to rank 0.
    let mut r: Vec<i64> = (0..count)
        .map(|i| (i as i64 * 31 + me as i64 * 17) % 1009 - 500)
        .collect();
    run(
        comm,
        Op::reduce(ptr(&mut r), count, DType::I64, 0, red(RedKind::Min)),
    )
    .unwrap();
    if me == 0 {
        for (i, x) in r.iter().enumerate() {
            let want = (0..n)
                .map(|q| (i as i64 * 31 + q as i64 * 17) % 1009 - 500)
                .min()
                .unwrap();
            assert_eq!(*x, want, "int64 min to root, element {i}");
        }
    }
    // reduce_scatter_single (int32 SUM) of 150 001 elements per rank, out
    // of place and in place (the output at this rank's block of the input).
    let per_rank = 150_001;
    let contrib = |q: i32, i: usize| ((q as i64 + 2) * (i as i64 % 977)) as i32;
    let full: Vec<i32> = (0..per_rank * n as usize).map(|i| contrib(me, i)).collect();
    let want: Vec<i32> = (0..per_rank)
        .map(|i| (0..n).map(|q| contrib(q, me as usize * per_rank + i)).sum())
        .collect();
    let mut input = full.clone();
    let mut out = vec![0i32; per_rank];
    run(
        comm,
        Op::reduce_scatter_single(
            ptr(&mut out),
            ptr(&mut input),
            per_rank,
            DType::I32,
            red(RedKind::Sum),
        ),
    )
    .unwrap();
    assert!(out == want, "reduce_scatter_single");
    let mut inplace = full.clone();
    let own = Ptr(unsafe { inplace.as_mut_ptr().add(me as usize * per_rank) } as *mut c_void);
    run(
        comm,
        Op::reduce_scatter_single(
            own,
            ptr(&mut inplace),
            per_rank,
            DType::I32,
            red(RedKind::Sum),
        ),
    )
    .unwrap();
    assert!(
        inplace[me as usize * per_rank..(me as usize + 1) * per_rank] == want[..],
        "reduce_scatter_single in place"
    );
    // all_to_all_single of 300 007-byte blocks, out of place and in place.
    let blk = 300_007;
    let byte = |from: i32, to: usize, i: usize| (from as usize * 59 + to * 13 + i * 7) as u8;
    let mut send: Vec<u8> = (0..blk * n as usize)
        .map(|i| byte(me, i / blk, i % blk))
        .collect();
    let mut recv = vec![0u8; blk * n as usize];
    run(
        comm,
        Op::all_to_all_single(ptr(&mut recv), ptr(&mut send), blk, DType::U8),
    )
    .unwrap();
    let ok = |v: &[u8]| {
        v.iter()
            .enumerate()
            .all(|(i, x)| *x == byte((i / blk) as i32, me as usize, i % blk))
    };
    assert!(ok(&recv), "all_to_all_single");
    let p = ptr(&mut send);
    run(comm, Op::all_to_all_single(p, p, blk, DType::U8)).unwrap();
    assert!(ok(&send), "all_to_all_single in place");
    list_and_rooted_ops(comm);
    if comm.size() > 1 {
        v_ops(comm);
    }
    run(comm, Op::Barrier).unwrap();
}

/// The list forms, gather and scatter over several chunks, and buffers that
/// overlap on one rank only (that rank must stay on the same path as the
/// others: it works from a private copy).
fn list_and_rooted_ops(comm: &Comm) {
    let (me, n) = (comm.rank(), comm.size() as usize);
    let per = 600_011; // bytes per rank: several chunks
    let v = |r: usize, i: usize| (r * 101 + i * 11 + 7) as u8;
    // all_gather (list)
    let mut input: Vec<u8> = (0..per).map(|i| v(me as usize, i)).collect();
    let mut outs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; per]).collect();
    let out_ptrs: Vec<Ptr> = outs.iter_mut().map(|o| ptr(o)).collect();
    run(
        comm,
        Op::all_gather(out_ptrs, ptr(&mut input), per, DType::U8),
    )
    .unwrap();
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.iter().enumerate().all(|(i, x)| *x == v(r, i)),
            "all_gather list from rank {r}"
        );
    }
    // reduce_scatter (list), uint8 MAX
    let mut ins: Vec<Vec<u8>> = (0..n)
        .map(|b| (0..per).map(|i| v((me as usize + b) % n, i)).collect())
        .collect();
    let in_ptrs: Vec<Ptr> = ins.iter_mut().map(|x| ptr(x)).collect();
    let mut got = vec![0u8; per];
    run(
        comm,
        Op::reduce_scatter(ptr(&mut got), in_ptrs, per, DType::U8, red(RedKind::Max)),
    )
    .unwrap();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, x)| *x == (0..n).map(|q| v((q + me as usize) % n, i)).max().unwrap()),
        "reduce_scatter list"
    );
    // all_to_all (list)
    let mut sends: Vec<Vec<u8>> = (0..n)
        .map(|to| (0..per).map(|i| v(me as usize * 7 + to, i)).collect())
        .collect();
    let mut recvs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; per]).collect();
    let (sp, rp): (Vec<Ptr>, Vec<Ptr>) = (
        sends.iter_mut().map(|x| ptr(x)).collect(),
        recvs.iter_mut().map(|x| ptr(x)).collect(),
    );
    run(comm, Op::all_to_all(rp, sp, per, DType::U8)).unwrap();
    for (from, r) in recvs.iter().enumerate() {
        assert!(
            r.iter()
                .enumerate()
                .all(|(i, x)| *x == v(from * 7 + me as usize, i)),
            "all_to_all list from rank {from}"
        );
    }
    // gather to rank 1 and scatter from it
    let root = 1 % n as i32;
    let mut mine: Vec<u8> = (0..per).map(|i| v(me as usize + 3, i)).collect();
    let mut gathered: Vec<Vec<u8>> = if me == root {
        (0..n).map(|_| vec![0u8; per]).collect()
    } else {
        Vec::new()
    };
    let gp: Vec<Ptr> = gathered.iter_mut().map(|x| ptr(x)).collect();
    run(comm, Op::gather(gp, ptr(&mut mine), per, DType::U8, root)).unwrap();
    for (r, g) in gathered.iter().enumerate() {
        assert!(
            g.iter().enumerate().all(|(i, x)| *x == v(r + 3, i)),
            "gather from rank {r}"
        );
    }
    let mut pieces: Vec<Vec<u8>> = if me == root {
        (0..n)
            .map(|r| (0..per).map(|i| v(r + 5, i)).collect())
            .collect()
    } else {
        Vec::new()
    };
    let pp: Vec<Ptr> = pieces.iter_mut().map(|x| ptr(x)).collect();
    let mut piece = vec![0u8; per];
    run(comm, Op::scatter(ptr(&mut piece), pp, per, DType::U8, root)).unwrap();
    assert!(
        piece
            .iter()
            .enumerate()
            .all(|(i, x)| *x == v(me as usize + 5, i)),
        "scatter"
    );
    // all_gather_single whose input, on rank 0 only, is another rank's
    // block of the output (an overlap the chunks would break).
    let mut out = vec![0u8; per * n];
    let mut apart: Vec<u8> = (0..per).map(|i| v(me as usize + 9, i)).collect();
    let input = if me == 0 && n > 1 {
        out[per..2 * per].copy_from_slice(&apart);
        Ptr(unsafe { out.as_mut_ptr().add(per) } as *mut c_void)
    } else {
        ptr(&mut apart)
    };
    run(
        comm,
        Op::all_gather_single(ptr(&mut out), input, per, DType::U8),
    )
    .unwrap();
    assert!(
        (0..n).all(|r| (0..per).all(|i| out[r * per + i] == v(r + 9, i))),
        "all_gather_single with an overlapping input on rank 0"
    );
}

/// The v-variants through shared memory: uneven counts (one empty, one
/// longer than a chunk), then counts that differ between ranks, which
/// every rank reports alike, after which the comm still works.
fn v_ops(comm: &Comm) {
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    let counts: Vec<usize> = (0..n).map(|r| [300_017, 0, 5, 170_003][r % 4]).collect();
    let total: usize = counts.iter().sum();
    let starts: Vec<usize> = counts
        .iter()
        .scan(0, |a, c| Some(std::mem::replace(a, *a + c)))
        .collect();
    let val = |r: usize, i: usize| (r * 1_000_003 + i) as i32;
    // all_gather_v of int32
    let mut mine: Vec<i32> = (0..counts[me]).map(|i| val(me, i)).collect();
    let mut out = vec![-1i32; total];
    run(
        comm,
        Op::all_gather_v(ptr(&mut out), ptr(&mut mine), counts.clone(), DType::I32),
    )
    .unwrap();
    for r in 0..n {
        assert!(
            (0..counts[r]).all(|i| out[starts[r] + i] == val(r, i)),
            "all_gather_v block of rank {r}"
        );
    }
    // reduce_scatter_v of int32 SUM: rank q contributes (q + 1) * val
    let mut input: Vec<i32> = (0..total)
        .map(|j| (me as i32 + 1) * (j as i32 % 1000))
        .collect();
    let mut got = vec![-1i32; counts[me]];
    run(
        comm,
        Op::reduce_scatter_v(
            ptr(&mut got),
            ptr(&mut input),
            counts.clone(),
            DType::I32,
            red(RedKind::Sum),
        ),
    )
    .unwrap();
    let k: i32 = (1..=n as i32).sum();
    assert!(
        (0..counts[me]).all(|i| got[i] == k * ((starts[me] + i) as i32 % 1000)),
        "reduce_scatter_v"
    );
    // counts that differ on the last rank: everyone fails alike, nothing lands
    let mut bad = counts.clone();
    if me == n - 1 {
        bad[0] += 1;
    }
    let mut out2 = vec![-1i32; bad.iter().sum()];
    let mut mine2: Vec<i32> = vec![7; bad[me]];
    let e = run(
        comm,
        Op::all_gather_v(ptr(&mut out2), ptr(&mut mine2), bad, DType::I32),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    // (Gloo's path, when the comm opted out, words it differently.)
    assert!(
        e.message.contains(&format!("rank {}", n - 1)) && e.message.contains("counts"),
        "{e}"
    );
    assert!(out2.iter().all(|x| *x == -1), "nothing landed");
    let mut x = [me as i32; 4];
    run(
        comm,
        Op::all_reduce(ptr(&mut x), 4, DType::I32, red(RedKind::Sum)),
    )
    .unwrap();
    assert_eq!(x, [(0..n as i32).sum::<i32>(); 4], "the comm still works");
    // all_to_all_v_single: rank s sends split(s, d) int64 elements to rank
    // d (some empty, some longer than a chunk), out of place and in place.
    let split = |s: usize, d: usize| [70_001, 0, 3, 40_000][(s + 2 * d) % 4];
    let elem = |s: usize, d: usize, i: usize| (s * 1_000_000_000 + d * 1_000_000 + i) as i64;
    let ins: Vec<usize> = (0..n).map(|d| split(me, d)).collect();
    let outs: Vec<usize> = (0..n).map(|s| split(s, me)).collect();
    let mut send: Vec<i64> = (0..n)
        .flat_map(|d| (0..ins[d]).map(move |i| elem(me, d, i)))
        .collect();
    let want: Vec<i64> = (0..n)
        .flat_map(|s| (0..outs[s]).map(move |i| elem(s, me, i)))
        .collect();
    let mut recv = vec![-1i64; want.len()];
    run(
        comm,
        Op::all_to_all_v_single(
            ptr(&mut recv),
            outs.clone(),
            ptr(&mut send),
            ins.clone(),
            DType::I64,
        ),
    )
    .unwrap();
    assert!(recv == want, "all_to_all_v_single");
    if ins == outs {
        let p = ptr(&mut send);
        run(
            comm,
            Op::all_to_all_v_single(p, outs.clone(), p, ins.clone(), DType::I64),
        )
        .unwrap();
        assert!(send == want, "all_to_all_v_single in place");
    }
    // rank 0 expects one element more from the last rank than it sends
    let mut outs_bad = outs.clone();
    if me == 0 {
        outs_bad[n - 1] += 1;
    }
    let mut recv_bad = vec![-1i64; outs_bad.iter().sum()];
    let e = run(
        comm,
        Op::all_to_all_v_single(
            ptr(&mut recv_bad),
            outs_bad,
            ptr(&mut send),
            ins,
            DType::I64,
        ),
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
    assert!(
        e.message.contains(&format!("rank {} sends", n - 1)) && e.message.contains("rank 0"),
        "{e}"
    );
    assert!(recv_bad.iter().all(|x| *x == -1), "nothing landed");
}

fn intra_child(opt_out_rank: i32) {
    if rank() == opt_out_rank {
        std::env::set_var("TORCHCOMM_GLOO_SHM", "0");
    }
    let comm = child_comm("intra", TIMEOUT);
    chunked_ops(&comm);
    // finalize reports the first failed operation: the deliberate counts
    // mismatch of `v_ops`.
    match comm.finalize() {
        Ok(()) => assert_eq!(comm.size(), 1),
        Err(e) => assert!(
            comm.size() > 1 && e.message.contains("all_gather_v") && e.message.contains("counts"),
            "{e}"
        ),
    }
    println!("RESULT ok");
}

fn intra(test: &str, n: usize, opt_out_rank: i32) -> Vec<Outcome> {
    let out = launch(
        test,
        "intra",
        n,
        &[("TORCHCOMM_DEBUG", "INFO")],
        Duration::from_secs(120),
    );
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
        let on = o.stderr.contains("shared-memory collectives on");
        assert_eq!(on, opt_out_rank < 0, "rank {}: {}", o.rank, o.describe());
        // The transport table: logged once per comm, in order of preference.
        let table: Vec<&str> = o
            .stderr
            .lines()
            .filter(|l| l.contains("'intra' rank") && l.contains(": transports: "))
            .collect();
        assert_eq!(table.len(), 1, "rank {}: {}", o.rank, o.describe());
        let first = match on {
            true => "1. shared memory: every operation; 2. gloo: every operation (Gloo over TCP)",
            false => "1. gloo: every operation (Gloo over TCP) (an operation",
        };
        assert!(table[0].contains(first), "rank {}: {}", o.rank, table[0]);
    }
    out
}

#[test]
fn gloo_intra_host_chunked_2() {
    if role().is_some() {
        return intra_child(-1);
    }
    intra("gloo_intra_host_chunked_2", 2, -1);
}

#[test]
fn gloo_intra_host_chunked_3() {
    if role().is_some() {
        return intra_child(-1);
    }
    intra("gloo_intra_host_chunked_3", 3, -1);
}

#[test]
fn gloo_intra_host_chunked_4() {
    if role().is_some() {
        return intra_child(-1);
    }
    intra("gloo_intra_host_chunked_4", 4, -1);
}

/// One rank opting out turns the path off for all (they must agree), and
/// the same operations give the same results over Gloo.
#[test]
fn gloo_intra_host_one_rank_opts_out() {
    if role().is_some() {
        return intra_child(1);
    }
    let out = intra("gloo_intra_host_one_rank_opts_out", 3, 1);
    assert!(
        out[1].stderr.contains("TORCHCOMM_GLOO_SHM=0"),
        "{}",
        out[1].describe()
    );
    assert!(
        out[0].stderr.contains("not every rank can map"),
        "{}",
        out[0].describe()
    );
}

/// A rank killed while the others wait in a shared-memory all_reduce: the
/// survivors fail with TC_ERR_REMOTE naming it within a second, not at
/// their 10 s timeout.
#[test]
fn gloo_intra_host_dead_peer_seen_at_once() {
    const LONG: Duration = Duration::from_secs(10);
    if role().is_some() {
        let comm = child_comm("intra-dead", LONG);
        run(&comm, Op::Barrier).unwrap();
        if comm.rank() == 2 {
            std::thread::sleep(Duration::from_millis(300));
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut data = vec![1i32; 16 << 10];
        let start = Instant::now();
        let (e, last) = loop {
            let last = Instant::now();
            if let Err(e) = run(
                &comm,
                Op::all_reduce(ptr(&mut data), 16 << 10, DType::I32, red(RedKind::Max)),
            ) {
                break (e, last);
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "all_reduce never failed"
            );
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
        assert!(took < Duration::from_secs(2), "seen after {took:?}: {e}");
        return;
    }
    let out = launch(
        "gloo_intra_host_dead_peer_seen_at_once",
        "intra-dead",
        3,
        &[],
        Duration::from_secs(60),
    );
    out[2].assert_killed();
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        eprintln!("rank {}: {:?}", o.rank, o.results());
    }
}

/// Descriptors of this process whose link target contains `what`.
fn open_fds(what: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().contains(what))
        .count()
}

/// Many live comms between the same processes cost no descriptors of the
/// shared-memory path beyond one pidfd per peer process: segments are
/// closed once mapped, and peers' pidfds are shared between comms.
#[test]
fn gloo_intra_host_descriptors_do_not_grow_with_comms() {
    if role().is_some() {
        let mut comms = Vec::new();
        for k in 0..8 {
            let c = child_comm(&format!("fds-{k}"), TIMEOUT);
            let mut x = [1i32; 4];
            run(
                &c,
                Op::all_reduce(ptr(&mut x), 4, DType::I32, red(RedKind::Sum)),
            )
            .unwrap();
            assert_eq!(x, [c.size(); 4]);
            comms.push(c);
        }
        let (segments, pidfds) = (open_fds("intra-host segment"), open_fds("[pidfd]"));
        println!("RESULT segments={segments} pidfds={pidfds}");
        assert_eq!(
            segments, 0,
            "segment descriptors are closed once every peer mapped them"
        );
        assert_eq!(
            pidfds,
            size() as usize - 1,
            "one pidfd per peer process, shared by the 8 comms"
        );
        for c in comms {
            c.finalize().unwrap();
        }
        return;
    }
    let out = launch(
        "gloo_intra_host_descriptors_do_not_grow_with_comms",
        "fds",
        3,
        &[],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
    eprintln!("rank 0: {:?}", out[0].results());
}
