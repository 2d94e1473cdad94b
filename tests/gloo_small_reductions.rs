//! Small all-reduces and reduces through shared memory (the one-sync form:
//! every rank combines every rank's input itself), with real processes of
//! 2, 3 and 4 ranks: counts from 0 to past the one-sync limit (16 KiB),
//! SUM of int32, AVG of float64, PREMUL_SUM of float32, bfloat16 SUM (added
//! in f32), a reduce to a root that is not rank 0, then many back-to-back
//! calls (halves reused while a slower rank may still read them). Every
//! element is checked against values computed here (exact in each dtype).

mod gloo_common;

use gloo_common::*;
use std::time::Duration;
use torchcomm::{Comm, Op};
use torchcomm::{DType, PremulFactor, RedKind, ReduceOp};

const COUNTS: [usize; 7] = [0, 1, 2, 5, 1000, 4096, 4097];

fn red(kind: RedKind, factor: f64) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(factor),
    }
}

fn all_reduce<T>(comm: &Comm, buf: &mut [T], dtype: DType, op: ReduceOp) {
    let count = buf.len();
    let op = Op::all_reduce(ptr(buf), count, dtype, op);
    run(comm, op).unwrap();
}

fn bf16(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

fn child() {
    let comm = child_comm("small-reductions", Duration::from_secs(60));
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let ranks = 0..n;
    for count in COUNTS {
        let val = |r: usize, i: usize| (r * 1000 + i % 97) as i32 - 300;
        let mut a: Vec<i32> = (0..count).map(|i| val(me, i)).collect();
        all_reduce(&comm, &mut a, DType::I32, red(RedKind::Sum, 1.0));
        for (i, x) in a.iter().enumerate() {
            assert_eq!(
                *x,
                ranks.clone().map(|r| val(r, i)).sum::<i32>(),
                "sum {count} [{i}]"
            );
        }
        // Multiples of n: the average is exact.
        let mut b: Vec<f64> = (0..count).map(|i| ((me + i) * n) as f64).collect();
        all_reduce(&comm, &mut b, DType::F64, red(RedKind::Avg, 1.0));
        for (i, x) in b.iter().enumerate() {
            let want = ranks.clone().map(|r| (r + i) as f64).sum::<f64>();
            assert_eq!(*x, want, "avg {count} [{i}]");
        }
        let mut c: Vec<f32> = (0..count).map(|i| (me + i % 8) as f32).collect();
        all_reduce(&comm, &mut c, DType::F32, red(RedKind::PremulSum, 0.5));
        for (i, x) in c.iter().enumerate() {
            let want = ranks.clone().map(|r| (r + i % 8) as f32 * 0.5).sum::<f32>();
            assert_eq!(*x, want, "premul {count} [{i}]");
        }
        let mut h: Vec<u16> = (0..count).map(|i| bf16((me + i % 4) as f32)).collect();
        all_reduce(&comm, &mut h, DType::BF16, red(RedKind::Sum, 1.0));
        for (i, x) in h.iter().enumerate() {
            let want = ranks.clone().map(|r| (r + i % 4) as f32).sum::<f32>();
            assert_eq!(*x, bf16(want), "bfloat16 {count} [{i}]");
        }
        let root = n - 1;
        let mut d: Vec<i32> = (0..count).map(|i| val(me, i)).collect();
        let op = Op::reduce(
            ptr(&mut d),
            count,
            DType::I32,
            root as i32,
            red(RedKind::Max, 1.0),
        );
        run(&comm, op).unwrap();
        for (i, x) in d.iter().enumerate() {
            let want = match me == root {
                true => ranks.clone().map(|r| val(r, i)).max().unwrap_or_default(),
                false => val(me, i),
            };
            assert_eq!(*x, want, "reduce {count} [{i}] on rank {me}");
        }
    }
    for k in 0..2000i64 {
        let mut x = [me as i64 + k; 3];
        all_reduce(&comm, &mut x, DType::I64, red(RedKind::Sum, 1.0));
        let want = (0..n as i64).map(|r| r + k).sum::<i64>();
        assert_eq!(x, [want; 3], "call {k}");
    }
    println!("RESULT ok");
}

fn small_reductions(test: &str, n: usize) {
    let out = launch(test, "small", n, &[], Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
    }
}

#[test]
fn gloo_small_reductions_2() {
    if role().is_some() {
        return child();
    }
    small_reductions("gloo_small_reductions_2", 2);
}

#[test]
fn gloo_small_reductions_3() {
    if role().is_some() {
        return child();
    }
    small_reductions("gloo_small_reductions_3", 3);
}

#[test]
fn gloo_small_reductions_4() {
    if role().is_some() {
        return child();
    }
    small_reductions("gloo_small_reductions_4", 4);
}
