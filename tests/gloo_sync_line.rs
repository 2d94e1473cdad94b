//! Chunks that travel in the shared-memory sync line (up to 32 bytes per
//! rank's part: the payload beside the phase and the fingerprint) and
//! those just past it, with real processes of 2, 3 and 4 ranks: every
//! collective that can use the line (all_reduce, reduce, broadcast,
//! all_gather, reduce_scatter, gather, scatter, all_to_all) at every
//! per-rank byte count from 0 to 40 in int8, and 0 to 10 elements of int32
//! and float32 (float32 sums checked bit for bit against the rank-order sum
//! every rank must compute); then many back-to-back calls alternating line
//! and half chunks, so that a line is rewritten while a slower rank may
//! still be reading the other.

mod gloo_common;

use gloo_common::*;
use std::fmt::Debug;
use std::time::Duration;
use torchcomm::{Comm, DType, Op, PremulFactor, RedKind, ReduceOp};

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(1.0),
    }
}

/// One dtype's values: rank `r`'s element `i`, and how `n` ranks' elements
/// combine in rank order (what every rank must get, bit for bit).
struct Values<T> {
    dtype: DType,
    val: fn(usize, usize) -> T,
    sum: fn(T, T) -> T,
    max: fn(T, T) -> T,
}

fn check_ops<T: Copy + PartialEq + Debug + Default>(comm: &Comm, v: &Values<T>, count: usize) {
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let root = n - 1;
    let what = |op: &str| format!("{op} of {count} {:?} on rank {me}", v.dtype);
    let ordered =
        |i: usize, f: fn(T, T) -> T| (1..n).fold((v.val)(0, i), |a, r| f(a, (v.val)(r, i)));
    let mine = |c: usize| (0..c).map(|i| (v.val)(me, i)).collect::<Vec<T>>();

    let mut a = mine(count);
    run(
        comm,
        Op::all_reduce(ptr(&mut a), count, v.dtype, red(RedKind::Sum)),
    )
    .unwrap();
    let want: Vec<T> = (0..count).map(|i| ordered(i, v.sum)).collect();
    assert_eq!(a, want, "{}", what("all_reduce"));

    let mut b = mine(count);
    let op = Op::reduce(ptr(&mut b), count, v.dtype, root as i32, red(RedKind::Max));
    run(comm, op).unwrap();
    let want = match me == root {
        true => (0..count).map(|i| ordered(i, v.max)).collect(),
        false => mine(count),
    };
    assert_eq!(b, want, "{}", what("reduce"));

    let mut c = mine(count);
    run(
        comm,
        Op::broadcast(ptr(&mut c), count, v.dtype, root as i32),
    )
    .unwrap();
    let want: Vec<T> = (0..count).map(|i| (v.val)(root, i)).collect();
    assert_eq!(c, want, "{}", what("broadcast"));

    let mut input = mine(count);
    let mut out = vec![T::default(); n * count];
    let op = Op::all_gather_single(ptr(&mut out), ptr(&mut input), count, v.dtype);
    run(comm, op).unwrap();
    let every: Vec<T> = (0..n)
        .flat_map(|r| (0..count).map(move |i| (v.val)(r, i)))
        .collect();
    assert_eq!(out, every, "{}", what("all_gather"));

    // Rank r's input holds block q at q * count: element i of block q is
    // val(r, q * count + i).
    let mut input = mine(n * count);
    let mut out = vec![T::default(); count];
    let op = Op::reduce_scatter_single(
        ptr(&mut out),
        ptr(&mut input),
        count,
        v.dtype,
        red(RedKind::Sum),
    );
    run(comm, op).unwrap();
    let want: Vec<T> = (0..count).map(|i| ordered(me * count + i, v.sum)).collect();
    assert_eq!(out, want, "{}", what("reduce_scatter"));

    let mut input = mine(count);
    let mut out = vec![T::default(); if me == root { n * count } else { 0 }];
    let op = Op::gather_single(ptr(&mut out), ptr(&mut input), count, v.dtype, root as i32);
    run(comm, op).unwrap();
    if me == root {
        assert_eq!(out, every, "{}", what("gather"));
    }

    let mut blocks: Vec<Vec<T>> = (0..n)
        .map(|q| (0..count).map(|i| (v.val)(me, q * count + i)).collect())
        .collect();
    let inputs = match me == root {
        true => blocks.iter_mut().map(|b| ptr(b)).collect(),
        false => Vec::new(),
    };
    let mut out = vec![T::default(); count];
    run(
        comm,
        Op::scatter(ptr(&mut out), inputs, count, v.dtype, root as i32),
    )
    .unwrap();
    let want: Vec<T> = (0..count).map(|i| (v.val)(root, me * count + i)).collect();
    assert_eq!(out, want, "{}", what("scatter"));

    let mut input = mine(n * count);
    let mut out = vec![T::default(); n * count];
    let op = Op::all_to_all_single(ptr(&mut out), ptr(&mut input), count, v.dtype);
    run(comm, op).unwrap();
    let want: Vec<T> = (0..n)
        .flat_map(|q| (0..count).map(move |i| (v.val)(q, me * count + i)))
        .collect();
    assert_eq!(out, want, "{}", what("all_to_all"));
}

fn child() {
    let comm = child_comm("sync-line", Duration::from_secs(60));
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let int8 = Values::<i8> {
        dtype: DType::I8,
        val: |r, i| ((r * 5 + i * 3) % 23) as i8 - 11,
        sum: |a, b| a.wrapping_add(b),
        max: |a, b| a.max(b),
    };
    let int32 = Values::<i32> {
        dtype: DType::I32,
        val: |r, i| (r * 1000 + i * 7) as i32 - 500,
        sum: |a, b| a.wrapping_add(b),
        max: |a, b| a.max(b),
    };
    // Sums that round differently in another order.
    let float32 = Values::<f32> {
        dtype: DType::F32,
        val: |r, i| 0.1 * (r + 1) as f32 + 1e-3 * i as f32 + [0.0, 1e7, -1e7, 3.3][r % 4],
        sum: |a, b| a + b,
        max: |a, b| a.max(b),
    };
    for count in 0..=40 {
        check_ops(&comm, &int8, count);
    }
    for count in 0..=10 {
        check_ops(&comm, &int32, count);
        check_ops(&comm, &float32, count);
    }
    // Back to back: a line chunk, a half chunk, a broadcast in the line.
    for k in 0..3000i64 {
        let mut x = [me as i64 + k; 2];
        run(
            &comm,
            Op::all_reduce(ptr(&mut x), 2, DType::I64, red(RedKind::Sum)),
        )
        .unwrap();
        let want = (0..n as i64).map(|r| r + k).sum::<i64>();
        assert_eq!(x, [want; 2], "line call {k}");
        let mut y = [me as i32 + k as i32; 16];
        run(
            &comm,
            Op::all_reduce(ptr(&mut y), 16, DType::I32, red(RedKind::Max)),
        )
        .unwrap();
        assert_eq!(y, [n as i32 - 1 + k as i32; 16], "half call {k}");
        let mut z = [me as u32 * 7 + k as u32];
        run(
            &comm,
            Op::broadcast(ptr(&mut z), 1, DType::U32, (k as usize % n) as i32),
        )
        .unwrap();
        assert_eq!(
            z,
            [(k as usize % n) as u32 * 7 + k as u32],
            "broadcast call {k}"
        );
    }
    println!("RESULT ok");
}

fn sync_line(test: &str, n: usize) {
    let out = launch(test, "sync-line", n, &[], Duration::from_secs(180));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), ["ok"], "{}", o.describe());
    }
}

#[test]
fn gloo_sync_line_2() {
    if role().is_some() {
        return child();
    }
    sync_line("gloo_sync_line_2", 2);
}

#[test]
fn gloo_sync_line_3() {
    if role().is_some() {
        return child();
    }
    sync_line("gloo_sync_line_3", 3);
}

#[test]
fn gloo_sync_line_4() {
    if role().is_some() {
        return child();
    }
    sync_line("gloo_sync_line_4", 4);
}
