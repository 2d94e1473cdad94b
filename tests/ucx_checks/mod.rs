//! The checks of the UCX host transport shared by tests/ucx_host.rs (ranks
//! on one machine over TCP loopback) and examples/ucx_hosts.rs (ranks on
//! hosts made of network namespaces, scripts/test-ucx-hosts.sh): every
//! operation it carries x every dtype x every reduce op, integers and bool
//! bit for bit against a Gloo comm of the same ranks, floats against a
//! reference; point-to-point with several tags and sizes.
//! Each check panics at its first wrong result and prints one `RESULT`
//! line when all is right.

#![allow(dead_code)]

use torchcomm::{Comm, Op, OpOptions, P2p, Ptr};
use torchcomm::{DType, PremulFactor, RedKind, ReduceOp};
use torchcomm::{ErrorKind, Result};

/// Runs `op` on `comm` to completion.
fn run(comm: &Comm, op: Op) -> Result<()> {
    comm.submit(op, &OpOptions::default()).map(|_| ())
}

pub fn ptr(v: &mut [u8]) -> Ptr {
    Ptr(v.as_mut_ptr() as *mut std::ffi::c_void)
}

/// `count` elements of `dtype` for rank `r`, seed `s`: small integers
/// (1..=3; 0/1 for bool) so that sums and products are exact in every
/// float type.
pub fn data(dtype: DType, count: usize, r: usize, s: usize) -> Vec<u8> {
    data_of(dtype, count, |i| 1 + (r + i + s) % 3)
}

/// `count` elements of `dtype` of the values `v(i)` (small integers; bool:
/// their lowest bit).
fn data_of(dtype: DType, count: usize, v: impl Fn(usize) -> usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for i in 0..count {
        let v = v(i);
        let bytes: Vec<u8> = match dtype {
            DType::Bool => vec![(v % 2) as u8],
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => vec![v as u8],
            DType::I32 | DType::U32 => (v as u32).to_ne_bytes().to_vec(),
            DType::I64 | DType::U64 => (v as u64).to_ne_bytes().to_vec(),
            DType::F32 => (v as f32).to_ne_bytes().to_vec(),
            DType::F64 => (v as f64).to_ne_bytes().to_vec(),
            DType::F16 => torchcomm::f32_to_f16(v as f32).to_ne_bytes().to_vec(),
            DType::BF16 => torchcomm::f32_to_bf16(v as f32).to_ne_bytes().to_vec(),
        };
        out.extend(bytes);
    }
    out
}

/// Element `i` of `buf` as f64 (float dtypes).
pub fn value(dtype: DType, buf: &[u8], i: usize) -> f64 {
    let b = &buf[i * dtype.size()..(i + 1) * dtype.size()];
    match dtype {
        DType::F32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DType::F16 => torchcomm::f16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64,
        DType::BF16 => torchcomm::bf16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64,
        _ => unreachable!(),
    }
}

/// The reference of reduce op `kind` over every rank's element `i`.
pub fn reference(dtype: DType, kind: RedKind, n: usize, count: usize, i: usize, s: usize) -> f64 {
    let vals: Vec<f64> = (0..n)
        .map(|r| value(dtype, &data(dtype, count, r, s), i))
        .collect();
    reduced(kind, n, &vals)
}

/// Reduce op `kind` (of `n` ranks) over `vals`.
fn reduced(kind: RedKind, n: usize, vals: &[f64]) -> f64 {
    match kind {
        RedKind::Sum => vals.iter().sum(),
        RedKind::Avg => vals.iter().sum::<f64>() / n as f64,
        RedKind::PremulSum => 0.5 * vals.iter().sum::<f64>(),
        RedKind::Product => vals.iter().product(),
        RedKind::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
        RedKind::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        _ => unreachable!(),
    }
}

pub fn red(kind: RedKind) -> ReduceOp {
    let factor = if kind == RedKind::PremulSum { 0.5 } else { 1.0 };
    ReduceOp {
        kind,
        factor: PremulFactor::Host(factor),
    }
}

/// Makes an op over a case's buffers (input, output).
type MakeOp<'a> = Box<dyn Fn(&mut Vec<Vec<u8>>) -> Op + 'a>;

/// The reductions: all_reduce (both algorithms), reduce, reduce_scatter
/// (single and list), each on UCX and on Gloo.
pub fn check_reductions(ucx: &Comm, gloo: &Comm, me: usize, n: usize) {
    let mut checked = 0;
    for dtype in DType::ALL {
        for kind in RedKind::ALL {
            // 5: recursive doubling; 70,000: the ring (>= 128 KiB from 2 bytes
            // on; the 1-byte types stay below it); 300,000: the ring.
            for (count, s) in [(5usize, 1usize), (70_000, 2), (300_000, 3)] {
                if count == 300_000 && dtype.size() > 1 {
                    continue;
                }
                let es = dtype.size();
                let cases: Vec<(&str, MakeOp)> = vec![
                    (
                        "all_reduce",
                        Box::new(|b| Op::all_reduce(ptr(&mut b[0]), count, dtype, red(kind))),
                    ),
                    (
                        "reduce",
                        Box::new(|b| {
                            Op::reduce(ptr(&mut b[0]), count, dtype, (n - 1) as i32, red(kind))
                        }),
                    ),
                    (
                        "reduce_scatter_single",
                        Box::new(|b| {
                            let (input, output) = b.split_at_mut(1);
                            Op::reduce_scatter_single(
                                ptr(&mut output[0]),
                                ptr(&mut input[0]),
                                count / n,
                                dtype,
                                red(kind),
                            )
                        }),
                    ),
                ];
                for (name, make) in &cases {
                    let fresh = || {
                        let mut input = data(dtype, count, me, s);
                        if *name == "reduce_scatter_single" {
                            input.truncate(count / n * n * es);
                        }
                        vec![input, vec![0u8; count / n * es]]
                    };
                    let (mut a, mut b) = (fresh(), fresh());
                    let ra = run(ucx, make(&mut a));
                    let rb = run(gloo, make(&mut b));
                    if let Err(e) = &rb {
                        let Err(ea) = ra else {
                            panic!("{name} {dtype:?} {kind:?} {count}: UCX took what Gloo refused: {e:?}")
                        };
                        assert_eq!(ea.kind, e.kind, "{name} {dtype:?} {kind:?}: {}", ea.message);
                        continue;
                    }
                    ra.unwrap_or_else(|e| panic!("{name} {dtype:?} {kind:?} {count}: {e:?}"));
                    let (got, want_gloo, first, len) = match *name {
                        "reduce_scatter_single" => (&a[1], &b[1], me * (count / n), count / n),
                        "reduce" if me != n - 1 => {
                            // Other ranks' buffers are left as they were.
                            assert_eq!(a[0], data(dtype, count, me, s), "{name} {dtype:?}");
                            continue;
                        }
                        _ => (&a[0], &b[0], 0, count),
                    };
                    if dtype.is_floating() {
                        for i in (0..len).step_by(len / 7 + 1) {
                            let want = reference(dtype, kind, n, count, first + i, s);
                            let have = value(dtype, got, i);
                            assert!(
                                (have - want).abs() <= 1e-2 * want.abs().max(1.0),
                                "{name} {dtype:?} {kind:?} count {count} [{i}]: {have} != {want}"
                            );
                        }
                    } else {
                        assert!(got == want_gloo, "{name} {dtype:?} {kind:?} count {count}");
                    }
                    checked += 1;
                }
            }
        }
    }
    println!("RESULT reductions checked={checked}");
}

/// The data movers on every dtype (bytes: their results are exact).
pub fn check_movers(ucx: &Comm, me: usize, n: usize) {
    let root = n - 1;
    for dtype in DType::ALL {
        for count in [3usize, 40_000] {
            let bytes = count * dtype.size();
            let of = |r: usize| data(dtype, count, r, 7);
            // broadcast
            let mut b = if me == root {
                of(root)
            } else {
                vec![0u8; bytes]
            };
            run(ucx, Op::broadcast(ptr(&mut b), count, dtype, root as i32)).unwrap();
            assert_eq!(b, of(root), "broadcast {dtype:?}");
            // all_gather (single buffer, then the list form)
            let mut input = of(me);
            let mut out = vec![0u8; bytes * n];
            run(
                ucx,
                Op::all_gather_single(ptr(&mut out), ptr(&mut input), count, dtype),
            )
            .unwrap();
            let all: Vec<u8> = (0..n).flat_map(of).collect();
            assert_eq!(out, all, "all_gather_single {dtype:?}");
            let mut outs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; bytes]).collect();
            let outputs = outs.iter_mut().map(|o| ptr(o)).collect();
            run(ucx, Op::all_gather(outputs, ptr(&mut input), count, dtype)).unwrap();
            assert_eq!(outs.concat(), all, "all_gather {dtype:?}");
            // gather (single buffer) and scatter
            let mut out = vec![0u8; bytes * n];
            run(
                ucx,
                Op::gather_single(ptr(&mut out), ptr(&mut input), count, dtype, root as i32),
            )
            .unwrap();
            if me == root {
                assert_eq!(out, all, "gather_single {dtype:?}");
            }
            let mut ins: Vec<Vec<u8>> = (0..n).map(of).collect();
            let inputs = ins.iter_mut().map(|i| ptr(i)).collect();
            let mut got = vec![0u8; bytes];
            run(
                ucx,
                Op::scatter(ptr(&mut got), inputs, count, dtype, root as i32),
            )
            .unwrap();
            assert_eq!(got, of(me), "scatter {dtype:?}");
            // all_to_all: block r of rank q is data(q * n + r)
            let mut input: Vec<u8> = (0..n).flat_map(|r| of(me * n + r)).collect();
            let mut out = vec![0u8; bytes * n];
            run(
                ucx,
                Op::all_to_all_single(ptr(&mut out), ptr(&mut input), count, dtype),
            )
            .unwrap();
            let want: Vec<u8> = (0..n).flat_map(|q| of(q * n + me)).collect();
            assert_eq!(out, want, "all_to_all_single {dtype:?}");
        }
    }
    run(ucx, Op::Barrier).unwrap();
    println!("RESULT movers ok");
}

/// Point-to-point between every pair: tags 0, 7 and 2^31, 8 bytes
/// (eager, in the head) and 4 MiB (rendezvous, its own message), sends
/// and receives in one batch posted in opposite orders on the two sides.
pub fn check_p2p(ucx: &Comm, me: usize, n: usize) {
    for peer in (0..n).filter(|p| *p != me) {
        for bytes in [8usize, 4 << 20] {
            let tags = [0u32, 7, 1 << 31];
            let mut sends: Vec<Vec<u8>> = tags
                .iter()
                .map(|t| data(DType::U8, bytes, me * 31 + peer, *t as usize % 5))
                .collect();
            let mut recvs: Vec<Vec<u8>> = tags.iter().map(|_| vec![0u8; bytes]).collect();
            let mut ops: Vec<P2p> = Vec::new();
            for (i, t) in tags.iter().enumerate() {
                let o = |is_send, buf| P2p {
                    is_send,
                    buf,
                    count: bytes,
                    dtype: DType::U8,
                    peer: peer as i32,
                    tag: *t,
                    source: None,
                };
                ops.push(o(true, ptr(&mut sends[i])));
                ops.push(o(false, ptr(&mut recvs[i])));
            }
            if me > peer {
                ops.reverse();
            }
            run(ucx, Op::batch(ops)).unwrap();
            for (i, t) in tags.iter().enumerate() {
                let want = data(DType::U8, bytes, peer * 31 + me, *t as usize % 5);
                assert!(recvs[i] == want, "tag {t} {bytes} bytes from {peer}");
            }
        }
        // A receive that does not match its send fails cleanly, in step.
        let mut one = vec![1u8; 16];
        let r = if me < peer {
            run(ucx, Op::send(ptr(&mut one), 16, DType::U8, peer as i32, 3))
        } else {
            run(ucx, Op::recv(ptr(&mut one), 8, DType::U8, peer as i32, 3))
        };
        if me > peer {
            let e = r.expect_err("a mismatched receive");
            assert_eq!(e.kind, ErrorKind::InvalidUsage, "{}", e.message);
            assert!(e.message.contains("does not match"), "{}", e.message);
        } else {
            r.unwrap();
        }
    }
    run(ucx, Op::Barrier).unwrap();
    println!("RESULT p2p ok");
}

/// The v-variants (per-rank counts, one of them 0): all_gather_v and
/// all_to_all_v_single on every dtype (exact), reduce_scatter_v on every
/// dtype x reduce op (integers and bool bit for bit against `gloo`, floats
/// against the reference); small counts and ~70,000 elements (rendezvous).
pub fn check_v(ucx: &Comm, gloo: &Comm, me: usize, n: usize) {
    let mut checked = 0;
    for big in [0usize, 70_000] {
        let c = |r: usize| if r == 1 { 0 } else { big + (r * 37 + 5) % 11 };
        let counts: Vec<usize> = (0..n).map(c).collect();
        let total: usize = counts.iter().sum();
        let at: usize = counts[..me].iter().sum();
        for dtype in DType::ALL {
            let es = dtype.size();
            // all_gather_v
            let mut input = data(dtype, counts[me], me, 9);
            let mut out = vec![0u8; total * es];
            let op = Op::all_gather_v(ptr(&mut out), ptr(&mut input), counts.clone(), dtype);
            run(ucx, op).unwrap();
            let want: Vec<u8> = (0..n).flat_map(|r| data(dtype, counts[r], r, 9)).collect();
            assert!(out == want, "all_gather_v {dtype:?} big {big}");
            // all_to_all_v_single: rank q sends rank r a(q, r) elements
            let a = |q: usize, r: usize| {
                if (q + r) % 3 == 0 {
                    0
                } else {
                    big / 4 + q + 2 * r
                }
            };
            let ins: Vec<usize> = (0..n).map(|r| a(me, r)).collect();
            let outs: Vec<usize> = (0..n).map(|r| a(r, me)).collect();
            let mut input: Vec<u8> = (0..n)
                .flat_map(|r| data(dtype, a(me, r), me * n + r, 5))
                .collect();
            let mut out = vec![0u8; outs.iter().sum::<usize>() * es];
            let op =
                Op::all_to_all_v_single(ptr(&mut out), outs.clone(), ptr(&mut input), ins, dtype);
            run(ucx, op).unwrap();
            let want: Vec<u8> = (0..n)
                .flat_map(|q| data(dtype, a(q, me), q * n + me, 5))
                .collect();
            assert!(out == want, "all_to_all_v_single {dtype:?} big {big}");
            // reduce_scatter_v
            for kind in RedKind::ALL {
                let make = |input: &mut Vec<u8>, output: &mut Vec<u8>| {
                    Op::reduce_scatter_v(ptr(output), ptr(input), counts.clone(), dtype, red(kind))
                };
                let (mut ia, mut oa) = (data(dtype, total, me, 4), vec![0u8; counts[me] * es]);
                let (mut ib, mut ob) = (data(dtype, total, me, 4), vec![0u8; counts[me] * es]);
                let ra = run(ucx, make(&mut ia, &mut oa));
                if let Err(e) = run(gloo, make(&mut ib, &mut ob)) {
                    let ea = ra.expect_err("UCX took what Gloo refused");
                    assert_eq!(
                        ea.kind, e.kind,
                        "reduce_scatter_v {dtype:?} {kind:?}: {}",
                        ea.message
                    );
                    continue;
                }
                ra.unwrap_or_else(|e| panic!("reduce_scatter_v {dtype:?} {kind:?}: {e:?}"));
                if dtype.is_floating() {
                    for i in (0..counts[me]).step_by(counts[me] / 7 + 1) {
                        let want = reference(dtype, kind, n, total, at + i, 4);
                        let have = value(dtype, &oa, i);
                        assert!(
                            (have - want).abs() <= 1e-2 * want.abs().max(1.0),
                            "reduce_scatter_v {dtype:?} {kind:?} big {big} [{i}]: {have} != {want}"
                        );
                    }
                } else {
                    assert!(oa == ob, "reduce_scatter_v {dtype:?} {kind:?} big {big}");
                }
                checked += 1;
            }
        }
    }
    run(ucx, Op::Barrier).unwrap();
    println!("RESULT v-variants checked={checked}");
}

/// The segment size of the UCX ring all_reduce
/// (src/backends/ucx/segmented_ring.rs).
const RING_SEGMENT_BYTES: usize = 62 << 10;
/// The smallest all_reduce the ring takes (src/backends/ucx/collectives.rs).
const RING_MIN_BYTES: usize = 128 << 10;

/// Rank `r`'s element `i` in [`check_ring_segments`]: 1..=3 without a
/// short period, so that a segment sent, combined or kept at the wrong
/// place shows.
fn scattered(i: usize, r: usize) -> usize {
    let h = (i as u64 ^ 0x5bd1_e995).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33;
    1 + (h as usize + r) % 3
}

/// all_reduce of the segmented ring on every dtype x reduce op, each
/// rank's block two segments long, one element short of that, and one or
/// two elements over (counts not divisible by the rank count), and at 128
/// KiB (the smallest ring: on 2 ranks blocks of a segment and a bit, on 3
/// and 4 ranks blocks of one segment folded into the check message) and
/// one element below it (recursive doubling): integers
/// and bool bit for bit against `gloo`, floats element by element against
/// the reference, and every rank's result bit-identical.
pub fn check_ring_segments(ucx: &Comm, gloo: &Comm, me: usize, n: usize) {
    let mut checked = 0;
    for dtype in DType::ALL {
        let es = dtype.size();
        let two = 2 * RING_SEGMENT_BYTES / es;
        let smallest = RING_MIN_BYTES / es;
        for count in [two * n - 1, two * n + n + 1, smallest - 1, smallest] {
            for kind in RedKind::ALL {
                let what = format!("all_reduce {dtype:?} {kind:?} count {count}");
                let mut a = data_of(dtype, count, |i| scattered(i, me));
                let mut b = a.clone();
                let ra = run(ucx, Op::all_reduce(ptr(&mut a), count, dtype, red(kind)));
                if let Err(e) = run(gloo, Op::all_reduce(ptr(&mut b), count, dtype, red(kind))) {
                    let ea = ra.expect_err("UCX took what Gloo refused");
                    assert_eq!(ea.kind, e.kind, "{what}: {}", ea.message);
                    continue;
                }
                ra.unwrap_or_else(|e| panic!("{what}: {e:?}"));
                let bytes = count * es;
                let (mut all, mut mine) = (vec![0u8; bytes * n], a.clone());
                let op = Op::all_gather_single(ptr(&mut all), ptr(&mut mine), bytes, DType::U8);
                run(gloo, op).unwrap();
                for (r, theirs) in all.chunks_exact(bytes).enumerate() {
                    assert!(
                        theirs == a,
                        "{what}: rank {r}'s result differs from rank {me}'s"
                    );
                }
                if dtype.is_floating() {
                    for i in 0..count {
                        let vals: Vec<f64> = (0..n).map(|r| scattered(i, r) as f64).collect();
                        let want = reduced(kind, n, &vals);
                        let have = value(dtype, &a, i);
                        assert!(
                            (have - want).abs() <= 1e-2 * want.abs().max(1.0),
                            "{what} [{i}]: {have} != {want}"
                        );
                    }
                } else {
                    assert!(a == b, "{what}");
                }
                checked += 1;
            }
        }
    }
    println!("RESULT ring segments checked={checked}");
}
