//! The gloo backend with real processes: every operation, dtype and reduce
//! op at world sizes 1 to 4, uneven counts, every root, in place and out of
//! place, outputs poisoned first and every element checked; and a split into
//! odd and even ranks running collectives concurrently with the parent.

mod gloo_common;

use gloo_common::*;
use std::time::Duration;
use torchcomm::ErrorKind;
use torchcomm::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use torchcomm::{Comm, Op, OpOptions, P2p, Ptr};
use torchcomm::{DType, PremulFactor, RedKind, ReduceOp};

const POISON: u8 = 0xa5;

/// 8-byte aligned bytes holding `n` elements of a dtype.
#[derive(Clone)]
struct Buf {
    words: Vec<u64>,
    dt: DType,
    n: usize,
}

impl Buf {
    fn poisoned(dt: DType, n: usize) -> Buf {
        let mut b = Buf {
            words: vec![0; (n * dt.size()).div_ceil(8) + 1],
            dt,
            n,
        };
        b.bytes_mut().fill(POISON);
        b
    }
    fn from_fn(dt: DType, n: usize, f: impl Fn(usize) -> f64) -> Buf {
        let mut b = Buf::poisoned(dt, n);
        for i in 0..n {
            b.set(i, f(i));
        }
        b
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.n * self.dt.size();
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, len) }
    }
    fn bytes(&self) -> &[u8] {
        let len = self.n * self.dt.size();
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, len) }
    }
    fn ptr(&mut self) -> Ptr {
        Ptr(self.words.as_mut_ptr() as *mut std::ffi::c_void)
    }
    fn at(&mut self, elem: usize) -> Ptr {
        Ptr(
            unsafe { (self.words.as_mut_ptr() as *mut u8).add(elem * self.dt.size()) }
                as *mut std::ffi::c_void,
        )
    }
    fn set(&mut self, i: usize, x: f64) {
        let s = self.dt.size();
        let e = enc(self.dt, x);
        self.bytes_mut()[i * s..(i + 1) * s].copy_from_slice(&e);
    }
    fn get(&self, i: usize) -> f64 {
        let s = self.dt.size();
        dec(self.dt, &self.bytes()[i * s..(i + 1) * s])
    }
}

fn enc(dt: DType, x: f64) -> Vec<u8> {
    match dt {
        DType::F32 => (x as f32).to_ne_bytes().to_vec(),
        DType::F64 => x.to_ne_bytes().to_vec(),
        DType::F16 => f32_to_f16(x as f32).to_ne_bytes().to_vec(),
        DType::BF16 => f32_to_bf16(x as f32).to_ne_bytes().to_vec(),
        DType::I8 => (x as i8).to_ne_bytes().to_vec(),
        DType::U8 | DType::F8E4M3 | DType::F8E5M2 => vec![x as u8],
        DType::Bool => vec![(x != 0.0) as u8],
        DType::I32 => (x as i32).to_ne_bytes().to_vec(),
        DType::I64 => (x as i64).to_ne_bytes().to_vec(),
        DType::U32 => (x as u32).to_ne_bytes().to_vec(),
        DType::U64 => (x as u64).to_ne_bytes().to_vec(),
    }
}

fn dec(dt: DType, b: &[u8]) -> f64 {
    match dt {
        DType::F32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DType::F16 => f16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64,
        DType::BF16 => bf16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64,
        DType::I8 => i8::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::U8 | DType::F8E4M3 | DType::F8E5M2 => b[0] as f64,
        DType::Bool => {
            if b[0] > 1 {
                -1.0 // not a bool: poison survived
            } else {
                b[0] as f64
            }
        }
        DType::I32 => i32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::U32 => u32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::U64 => u64::from_ne_bytes(b.try_into().unwrap()) as f64,
    }
}

/// A value unique to (rank, element) that every dtype represents exactly.
fn datum(dt: DType, rank: usize, i: usize) -> f64 {
    if dt == DType::Bool {
        return ((rank + i) % 2) as f64;
    }
    ((rank * 37 + i * 11 + 5) % 97) as f64
}

/// Small values whose sums, products and averages are exact or rounded the
/// same way by the backend and the reference.
fn operand(dt: DType, rank: usize, i: usize) -> f64 {
    match dt {
        DType::Bool => ((rank + i) % 3 == 0) as u8 as f64,
        DType::U8 | DType::U32 | DType::U64 => ((rank * 7 + i * 3) % 5 + 1) as f64,
        _ => ((rank * 7 + i * 3) % 5) as f64 - 2.0,
    }
}

fn reference(dt: DType, kind: RedKind, n: usize, i: usize, factor: f64) -> f64 {
    let vs: Vec<f64> = (0..n).map(|r| operand(dt, r, i)).collect();
    if dt == DType::Bool {
        let bs: Vec<bool> = vs.iter().map(|v| *v != 0.0).collect();
        let any = bs.iter().any(|b| *b);
        let all = bs.iter().all(|b| *b);
        return match kind {
            RedKind::Sum | RedKind::Max | RedKind::BOr => any as u8 as f64,
            RedKind::Product | RedKind::Min | RedKind::BAnd => all as u8 as f64,
            RedKind::BXor => (bs.iter().filter(|b| **b).count() % 2) as f64,
            _ => unreachable!(),
        };
    }
    let ints: Vec<i64> = vs.iter().map(|v| *v as i64).collect();
    let sum: f64 = vs.iter().sum();
    match kind {
        RedKind::Sum => sum,
        RedKind::Product => vs.iter().product(),
        RedKind::Min => vs.iter().cloned().fold(f64::INFINITY, f64::min),
        RedKind::Max => vs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        RedKind::BAnd => ints.iter().fold(-1i64, |a, b| a & b) as f64,
        RedKind::BOr => ints.iter().fold(0i64, |a, b| a | b) as f64,
        RedKind::BXor => ints.iter().fold(0i64, |a, b| a ^ b) as f64,
        RedKind::Avg => {
            if dt.is_floating() {
                // The backend divides in the dtype (f32 for the half types).
                match dt {
                    DType::F64 => sum / n as f64,
                    _ => ((sum as f32) / n as f32) as f64,
                }
            } else {
                (sum / n as f64).trunc()
            }
        }
        RedKind::PremulSum => vs.iter().map(|v| v * factor).sum(),
    }
}

fn valid(dt: DType, kind: RedKind) -> bool {
    if matches!(dt, DType::F8E4M3 | DType::F8E5M2) {
        return false;
    }
    if kind.is_bitwise() && dt.is_floating() {
        return false;
    }
    if dt == DType::Bool && matches!(kind, RedKind::Avg | RedKind::PremulSum) {
        return false;
    }
    if kind == RedKind::PremulSum && !dt.is_floating() {
        return false;
    }
    true
}

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(0.5),
    }
}

fn check(buf: &Buf, what: &str, expected: impl Fn(usize) -> f64) {
    for i in 0..buf.n {
        let (got, want) = (buf.get(i), expected(i));
        assert!(
            got == want,
            "{what} [{}]: element {i} is {got}, expected {want}",
            buf.dt.name()
        );
    }
}

fn ok(comm: &Comm, op: Op) {
    let name = op.name();
    run(comm, op).unwrap_or_else(|e| panic!("{name}: {e}"));
}

/// Every data-movement operation for one dtype.
fn movement(comm: &Comm, dt: DType) {
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let c = 7; // not a multiple of any world size here
    for root in 0..n {
        let mut b = if me == root {
            Buf::from_fn(dt, c, |i| datum(dt, root, i))
        } else {
            Buf::poisoned(dt, c)
        };
        ok(comm, Op::broadcast(b.ptr(), c, dt, root as i32));
        check(&b, "broadcast", |i| datum(dt, root, i));
    }
    // all_gather_single, out of place and in place.
    let mut input = Buf::from_fn(dt, c, |i| datum(dt, me, i));
    let mut out = Buf::poisoned(dt, c * n);
    ok(comm, Op::all_gather_single(out.ptr(), input.ptr(), c, dt));
    check(&out, "all_gather_single", |i| datum(dt, i / c, i % c));
    let mut out = Buf::poisoned(dt, c * n);
    for i in 0..c {
        out.set(me * c + i, datum(dt, me, i));
    }
    let inp = out.at(me * c);
    ok(comm, Op::all_gather_single(out.ptr(), inp, c, dt));
    check(&out, "all_gather_single in place", |i| {
        datum(dt, i / c, i % c)
    });
    // all_gather (list).
    let mut outs: Vec<Buf> = (0..n).map(|_| Buf::poisoned(dt, c)).collect();
    let ptrs = outs.iter_mut().map(|b| b.ptr()).collect();
    ok(comm, Op::all_gather(ptrs, input.ptr(), c, dt));
    for (r, b) in outs.iter().enumerate() {
        check(b, "all_gather", |i| datum(dt, r, i));
    }
    // all_gather_v with uneven counts, one of them zero.
    let counts: Vec<usize> = (0..n).map(|r| (r * 3 + 2) % 5).collect();
    let offs: Vec<usize> = (0..n).map(|r| counts[..r].iter().sum()).collect();
    let total: usize = counts.iter().sum();
    let mut input = Buf::from_fn(dt, counts[me], |i| datum(dt, me, i));
    let mut out = Buf::poisoned(dt, total);
    ok(
        comm,
        Op::all_gather_v(out.ptr(), input.ptr(), counts.clone(), dt),
    );
    check(&out, "all_gather_v", |i| {
        let r = (0..n)
            .rev()
            .find(|r| offs[*r] <= i && counts[*r] > 0)
            .unwrap();
        datum(dt, r, i - offs[r])
    });
    // all_to_all_single, out of place and in place; all_to_all (list).
    let mut input = Buf::from_fn(dt, c * n, |i| datum(dt, me, i) + (i / c) as f64 * 0.0);
    let mut out = Buf::poisoned(dt, c * n);
    ok(comm, Op::all_to_all_single(out.ptr(), input.ptr(), c, dt));
    // Rank r sent me its block `me`: elements me*c..me*c+c of its input.
    check(&out, "all_to_all_single", |i| {
        datum(dt, i / c, me * c + i % c)
    });
    let p = input.ptr();
    ok(comm, Op::all_to_all_single(p, p, c, dt));
    check(&input, "all_to_all_single in place", |i| {
        datum(dt, i / c, me * c + i % c)
    });
    let mut ins: Vec<Buf> = (0..n)
        .map(|d| Buf::from_fn(dt, c, |i| datum(dt, me, d * c + i)))
        .collect();
    let mut outs: Vec<Buf> = (0..n).map(|_| Buf::poisoned(dt, c)).collect();
    let (ip, op) = (
        ins.iter_mut().map(|b| b.ptr()).collect(),
        outs.iter_mut().map(|b| b.ptr()).collect(),
    );
    ok(comm, Op::all_to_all(op, ip, c, dt));
    for (r, b) in outs.iter().enumerate() {
        check(b, "all_to_all", |i| datum(dt, r, me * c + i));
    }
    // all_to_all_v_single: rank s sends (s + 2d) % 3 elements to rank d.
    let split = |s: usize, d: usize| (s + 2 * d) % 3;
    let in_counts: Vec<usize> = (0..n).map(|d| split(me, d)).collect();
    let out_counts: Vec<usize> = (0..n).map(|s| split(s, me)).collect();
    let in_offs: Vec<usize> = (0..n).map(|d| in_counts[..d].iter().sum()).collect();
    let mut input = Buf::from_fn(dt, in_counts.iter().sum(), |i| datum(dt, me, i));
    let mut out = Buf::poisoned(dt, out_counts.iter().sum());
    ok(
        comm,
        Op::all_to_all_v_single(
            out.ptr(),
            out_counts.clone(),
            input.ptr(),
            in_counts.clone(),
            dt,
        ),
    );
    let mut k = 0;
    for s in 0..n {
        let s_offset: usize = (0..me).map(|d| split(s, d)).sum();
        for j in 0..split(s, me) {
            assert_eq!(
                out.get(k),
                datum(dt, s, s_offset + j),
                "all_to_all_v_single [{}] from rank {s}",
                dt.name()
            );
            k += 1;
        }
    }
    let _ = in_offs;
    // scatter and gather from every root.
    for root in 0..n {
        let mut ins: Vec<Buf> = (0..n)
            .map(|d| Buf::from_fn(dt, c, |i| datum(dt, root, d * c + i)))
            .collect();
        let ptrs = if me == root {
            ins.iter_mut().map(|b| b.ptr()).collect()
        } else {
            Vec::new()
        };
        let mut out = Buf::poisoned(dt, c);
        ok(comm, Op::scatter(out.ptr(), ptrs, c, dt, root as i32));
        check(&out, "scatter", |i| datum(dt, root, me * c + i));
        let mut input = Buf::from_fn(dt, c, |i| datum(dt, me, i));
        let mut outs: Vec<Buf> = (0..n).map(|_| Buf::poisoned(dt, c)).collect();
        let ptrs = if me == root {
            outs.iter_mut().map(|b| b.ptr()).collect()
        } else {
            Vec::new()
        };
        ok(comm, Op::gather(ptrs, input.ptr(), c, dt, root as i32));
        if me == root {
            for (r, b) in outs.iter().enumerate() {
                check(b, "gather", |i| datum(dt, r, i));
            }
        }
    }
    // send/recv around the ring, then a batch exchanging with every rank
    // (self included) with per-pair counts.
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mut sbuf = Buf::from_fn(dt, c, |i| datum(dt, me, i));
    let mut rbuf = Buf::poisoned(dt, c);
    if n == 1 {
        let ops = vec![
            P2p {
                is_send: true,
                buf: sbuf.ptr(),
                count: c,
                dtype: dt,
                peer: 0,
                tag: 0,
                source: None,
            },
            P2p {
                is_send: false,
                buf: rbuf.ptr(),
                count: c,
                dtype: dt,
                peer: 0,
                tag: 0,
                source: None,
            },
        ];
        ok(comm, Op::batch(ops));
    } else if me % 2 == 0 {
        ok(comm, Op::send(sbuf.ptr(), c, dt, next as i32, 0));
        ok(comm, Op::recv(rbuf.ptr(), c, dt, prev as i32, 0));
    } else {
        ok(comm, Op::recv(rbuf.ptr(), c, dt, prev as i32, 0));
        ok(comm, Op::send(sbuf.ptr(), c, dt, next as i32, 0));
    }
    check(&rbuf, "send/recv", |i| datum(dt, prev, i));
    let pair = |s: usize, d: usize| (s * 5 + d * 3) % 4 + 1;
    let mut sends: Vec<Buf> = (0..n)
        .map(|d| Buf::from_fn(dt, pair(me, d), |i| datum(dt, me, d * 10 + i)))
        .collect();
    let mut recvs: Vec<Buf> = (0..n).map(|s| Buf::poisoned(dt, pair(s, me))).collect();
    let mut ops = Vec::new();
    for d in 0..n {
        ops.push(P2p {
            is_send: true,
            buf: sends[d].ptr(),
            count: pair(me, d),
            dtype: dt,
            peer: d as i32,
            tag: 0,
            source: None,
        });
        ops.push(P2p {
            is_send: false,
            buf: recvs[d].ptr(),
            count: pair(d, me),
            dtype: dt,
            peer: d as i32,
            tag: 0,
            source: None,
        });
    }
    ok(comm, Op::batch(ops));
    for (s, b) in recvs.iter().enumerate() {
        check(b, "batch", |i| datum(dt, s, me * 10 + i));
    }
}

/// Every reduction for one dtype and reduce op.
fn reductions(comm: &Comm, dt: DType, kind: RedKind) {
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let c = 13;
    let what = format!("{} {}", kind.name(), dt.name());
    let expect = |i: usize| dec(dt, &enc(dt, reference(dt, kind, n, i, 0.5)));
    let mut b = Buf::from_fn(dt, c, |i| operand(dt, me, i));
    ok(comm, Op::all_reduce(b.ptr(), c, dt, red(kind)));
    check(&b, &format!("all_reduce {what}"), expect);
    for root in 0..n {
        let mut b = Buf::from_fn(dt, c, |i| operand(dt, me, i));
        ok(comm, Op::reduce(b.ptr(), c, dt, root as i32, red(kind)));
        if me == root {
            check(&b, &format!("reduce {what} root {root}"), expect);
        } else {
            check(
                &b,
                &format!("reduce {what} non-root input untouched"),
                |i| operand(dt, me, i),
            );
        }
    }
    if kind == RedKind::Sum && matches!(dt, DType::F16 | DType::BF16) && n >= 3 {
        // Rank 0 holds a value whose spacing in the half type is 2, the
        // others 1: summed in f32 and rounded once the ones are not lost.
        let big = if dt == DType::F16 { 2048.0 } else { 256.0 };
        let x = |r: usize| if r == 0 { big } else { 1.0 };
        let want = dec(dt, &enc(dt, big + (n - 1) as f64));
        let mut b = Buf::from_fn(dt, c, |_| x(me));
        ok(comm, Op::all_reduce(b.ptr(), c, dt, red(kind)));
        check(&b, &format!("all_reduce rounds once {what}"), |_| want);
        for root in 0..n {
            let mut b = Buf::from_fn(dt, c, |_| x(me));
            ok(comm, Op::reduce(b.ptr(), c, dt, root as i32, red(kind)));
            if me == root {
                check(
                    &b,
                    &format!("reduce rounds once {what} root {root}"),
                    |_| want,
                );
            } else {
                check(
                    &b,
                    &format!("reduce {what} non-root input untouched"),
                    |_| x(me),
                );
            }
        }
        let mut input = Buf::from_fn(dt, c * n, |_| x(me));
        let mut out = Buf::poisoned(dt, c);
        ok(
            comm,
            Op::reduce_scatter_single(out.ptr(), input.ptr(), c, dt, red(kind)),
        );
        check(
            &out,
            &format!("reduce_scatter_single rounds once {what}"),
            |_| want,
        );
    }
    // reduce_scatter_single: block r of rank s holds operand(s, r*c + i).
    let mut input = Buf::from_fn(dt, c * n, |i| operand(dt, me, i));
    let mut out = Buf::poisoned(dt, c);
    ok(
        comm,
        Op::reduce_scatter_single(out.ptr(), input.ptr(), c, dt, red(kind)),
    );
    check(&out, &format!("reduce_scatter_single {what}"), |i| {
        dec(dt, &enc(dt, reference(dt, kind, n, me * c + i, 0.5)))
    });
    check(&input, "reduce_scatter_single input untouched", |i| {
        operand(dt, me, i)
    });
    // In place: the output is this rank's block of the input.
    let mut input = Buf::from_fn(dt, c * n, |i| operand(dt, me, i));
    let own_block = input.at(me * c);
    ok(
        comm,
        Op::reduce_scatter_single(own_block, input.ptr(), c, dt, red(kind)),
    );
    for i in 0..c {
        let (got, want) = (
            input.get(me * c + i),
            dec(dt, &enc(dt, reference(dt, kind, n, me * c + i, 0.5))),
        );
        assert!(
            got == want,
            "reduce_scatter_single in place {what}: element {i} is {got}, expected {want}"
        );
    }
    let mut ins: Vec<Buf> = (0..n)
        .map(|r| Buf::from_fn(dt, c, |i| operand(dt, me, r * c + i)))
        .collect();
    let ptrs = ins.iter_mut().map(|b| b.ptr()).collect();
    let mut out = Buf::poisoned(dt, c);
    ok(comm, Op::reduce_scatter(out.ptr(), ptrs, c, dt, red(kind)));
    check(&out, &format!("reduce_scatter {what}"), |i| {
        dec(dt, &enc(dt, reference(dt, kind, n, me * c + i, 0.5)))
    });
    let counts: Vec<usize> = (0..n).map(|r| (r * 3 + 2) % 5).collect();
    let off: usize = counts[..me].iter().sum();
    let mut input = Buf::from_fn(dt, counts.iter().sum(), |i| operand(dt, me, i));
    let mut out = Buf::poisoned(dt, counts[me]);
    ok(
        comm,
        Op::reduce_scatter_v(out.ptr(), input.ptr(), counts, dt, red(kind)),
    );
    check(&out, &format!("reduce_scatter_v {what}"), |i| {
        dec(dt, &enc(dt, reference(dt, kind, n, off + i, 0.5)))
    });
}

fn matrix_child() {
    let comm = child_comm("matrix", Duration::from_secs(60));
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    for dt in DType::ALL {
        movement(&comm, dt);
        for kind in RedKind::ALL {
            if valid(dt, kind) {
                reductions(&comm, dt, kind);
            }
        }
    }
    // A large all_reduce: several Gloo segments per rank.
    let big = 300_007;
    let mut b = Buf::from_fn(DType::F32, big, |i| (me * 3 + i % 17) as f64);
    ok(
        &comm,
        Op::all_reduce(b.ptr(), big, DType::F32, ReduceOp::SUM),
    );
    check(&b, "large all_reduce", |i| {
        (0..n).map(|r| (r * 3 + i % 17) as f64).sum()
    });
    // PREMUL_SUM with the factor behind a host pointer.
    let factor: f64 = 0.25;
    let mut b = Buf::from_fn(DType::F64, 5, |i| operand(DType::F64, me, i));
    let op = ReduceOp {
        kind: RedKind::PremulSum,
        factor: PremulFactor::Pointer(&factor as *const f64 as *const _),
    };
    ok(&comm, Op::all_reduce(b.ptr(), 5, DType::F64, op));
    check(&b, "premul_sum through a pointer", |i| {
        reference(DType::F64, RedKind::PremulSum, n, i, 0.25)
    });
    // Zero-element operations complete.
    let mut z = Buf::poisoned(DType::F32, 0);
    ok(&comm, Op::all_reduce(z.ptr(), 0, DType::F32, ReduceOp::SUM));
    ok(&comm, Op::broadcast(z.ptr(), 0, DType::F32, 0));
    ok(&comm, Op::Barrier);
    comm.finalize().unwrap();
    println!("RESULT matrix ok rank {me}");
}

fn run_matrix(size: usize, test: &str) {
    if role().is_some() {
        return matrix_child();
    }
    let out = launch(test, "matrix", size, &[], Duration::from_secs(150));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

#[test]
fn gloo_matrix_world_1() {
    run_matrix(1, "gloo_matrix_world_1");
}

#[test]
fn gloo_matrix_world_2() {
    run_matrix(2, "gloo_matrix_world_2");
}

#[test]
fn gloo_matrix_world_3() {
    run_matrix(3, "gloo_matrix_world_3");
}

#[test]
fn gloo_matrix_world_4() {
    run_matrix(4, "gloo_matrix_world_4");
}

/// Reductions the backend rejects fail with TC_ERR_UNSUPPORTED (each on a
/// fresh one-rank comm, since a failed operation aborts its comm).
#[test]
fn gloo_unsupported_reductions() {
    if role().is_some() {
        let store = child_store();
        let mut k = 0;
        for dt in DType::ALL {
            for kind in RedKind::ALL {
                if valid(dt, kind) {
                    continue;
                }
                let comm = child_comm_on(
                    store.clone(),
                    &format!("unsup{k}"),
                    0,
                    1,
                    Duration::from_secs(10),
                )
                .unwrap();
                k += 1;
                let mut b = Buf::from_fn(dt, 3, |i| i as f64);
                let err = run(&comm, Op::all_reduce(b.ptr(), 3, dt, red(kind))).unwrap_err();
                assert_eq!(
                    err.kind,
                    ErrorKind::Unsupported,
                    "{} {}: {err}",
                    kind.name(),
                    dt.name()
                );
                assert!(err.message.contains(kind.name()), "{err}");
            }
        }
        println!("RESULT unsupported ok {k}");
        return;
    }
    let out = launch(
        "gloo_unsupported_reductions",
        "unsupported",
        1,
        &[],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
}

/// A split into even and odd ranks runs collectives concurrently with the
/// parent comm.
#[test]
fn gloo_split_concurrent_with_parent() {
    if role().is_some() {
        let parent = child_comm("parent", Duration::from_secs(60));
        let (n, me) = (parent.size() as usize, parent.rank() as usize);
        let group: Vec<i32> = (0..n as i32)
            .filter(|r| (*r as usize) % 2 == me % 2)
            .collect();
        let child = parent
            .split(
                &group,
                if me % 2 == 0 { "even" } else { "odd" },
                Default::default(),
            )
            .unwrap()
            .unwrap();
        assert_eq!(child.size() as usize, group.len());
        assert_eq!(child.rank() as usize, me / 2);
        let asynch = OpOptions {
            async_op: true,
            ..Default::default()
        };
        for iter in 0..20 {
            let mut a = Buf::from_fn(DType::I64, 1000, |i| (me + i + iter) as f64);
            let mut b = Buf::from_fn(DType::I64, 1000, |i| (me * 2 + i) as f64);
            let wa = parent
                .submit(
                    Op::all_reduce(a.ptr(), 1000, DType::I64, ReduceOp::SUM),
                    &asynch,
                )
                .unwrap();
            let wb = child
                .submit(
                    Op::all_reduce(b.ptr(), 1000, DType::I64, ReduceOp::SUM),
                    &asynch,
                )
                .unwrap();
            wb.wait_blocking().unwrap();
            wa.wait_blocking().unwrap();
            check(&a, "parent all_reduce", |i| {
                (0..n).map(|r| (r + i + iter) as f64).sum()
            });
            check(&b, "child all_reduce", |i| {
                group.iter().map(|r| (*r as usize * 2 + i) as f64).sum()
            });
        }
        // An empty list opts out; a list without the caller is an error.
        assert!(parent
            .split(&[], "none", Default::default())
            .unwrap()
            .is_none());
        let others: Vec<i32> = (0..n as i32).filter(|r| *r as usize != me).collect();
        assert!(parent.split(&others, "bad", Default::default()).is_err());
        child.finalize().unwrap();
        parent.finalize().unwrap();
        println!("RESULT split ok");
        return;
    }
    let out = launch(
        "gloo_split_concurrent_with_parent",
        "split",
        4,
        &[],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
}

/// A comm made again under the same name (as after a failure) gets a fresh
/// key scope: each incarnation rendezvouses and reduces correctly.
#[test]
fn gloo_comm_recreated_under_same_name() {
    if role().is_some() {
        for round in 0..3usize {
            let comm = child_comm("again", Duration::from_secs(60));
            let (n, me) = (comm.size() as usize, comm.rank() as usize);
            let mut a = Buf::from_fn(DType::I32, 64, |i| (me + i + round) as f64);
            ok(
                &comm,
                Op::all_reduce(a.ptr(), 64, DType::I32, ReduceOp::SUM),
            );
            check(&a, "all_reduce", |i| {
                (0..n).map(|r| (r + i + round) as f64).sum()
            });
            comm.finalize().unwrap();
            comm.release();
        }
        println!("RESULT recreate ok");
        return;
    }
    let out = launch(
        "gloo_comm_recreated_under_same_name",
        "recreate",
        3,
        &[],
        Duration::from_secs(60),
    );
    assert_all_ok(&out);
}
