//! float16/bfloat16 sums (SUM, AVG, PREMUL_SUM) over the UCX host
//! transport, 3 and 4 ranks over TCP loopback (shared memory off,
//! `UCX_TLS=tcp,self`): all_reduce (below and above the ring's size),
//! reduce, reduce_scatter_single and reduce_scatter_v accumulate in f32 and
//! round once, so their results equal, bit for bit, both the f32 sum in
//! rank order rounded once and the Gloo path's results. The values are
//! chosen so that rounding at every step gives other results (checked
//! here). Says SKIPPED (and passes) where libucp.so.0 is missing.

mod gloo_common;
mod ucx_common;

use gloo_common::*;
use std::time::Duration;
use torchcomm::{Comm, Op, OpOptions, PremulFactor, Ptr};
use torchcomm::{DType, RedKind, ReduceOp};
use ucx_common::*;

fn ptr(v: &mut [u8]) -> Ptr {
    Ptr(v.as_mut_ptr() as *mut std::ffi::c_void)
}

fn to_f32(dtype: DType, h: u16) -> f32 {
    match dtype {
        DType::F16 => torchcomm::f16_to_f32(h),
        _ => torchcomm::bf16_to_f32(h),
    }
}

fn to_half(dtype: DType, f: f32) -> u16 {
    match dtype {
        DType::F16 => torchcomm::f32_to_f16(f),
        _ => torchcomm::f32_to_bf16(f),
    }
}

/// Rank `r`'s element `i`: rank 0 holds values near 1, the others
/// multiples of half a unit in the last place of 1 (2^-11 in float16,
/// 2^-8 in bfloat16), which a sum rounded at each step loses.
fn element(dtype: DType, r: usize, i: usize) -> u16 {
    let half_ulp = match dtype {
        DType::F16 => 2f32.powi(-11),
        _ => 2f32.powi(-8),
    };
    let v = match r {
        0 => 1.0 + 2.0 * half_ulp * (i % 4) as f32,
        _ => half_ulp * (1 + (i + r) % 3) as f32,
    };
    to_half(dtype, v)
}

fn input(dtype: DType, r: usize, first: usize, count: usize) -> Vec<u8> {
    (first..first + count)
        .flat_map(|i| element(dtype, r, i).to_ne_bytes())
        .collect()
}

/// Element `i` of the sum over `n` ranks: in f32, in rank order (after
/// PREMUL_SUM's scaling, rounded to the type as the backend does), then
/// divided (AVG) and rounded once; with `per_step`, rounded at each step.
fn expected(dtype: DType, kind: RedKind, n: usize, i: usize, per_step: bool) -> u16 {
    let mut acc = 0f32;
    for r in 0..n {
        let mut x = to_f32(dtype, element(dtype, r, i));
        if kind == RedKind::PremulSum {
            x = to_f32(dtype, to_half(dtype, x * 0.5));
        }
        acc += x;
        if per_step {
            acc = to_f32(dtype, to_half(dtype, acc));
        }
    }
    if kind == RedKind::Avg {
        acc /= n as f32;
    }
    to_half(dtype, acc)
}

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(0.5),
    }
}

fn halves(buf: &[u8]) -> Vec<u16> {
    buf.chunks(2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .collect()
}

/// Runs `make`'s op on UCX and on Gloo; checks UCX's result (elements
/// `first..` of the sum) against the sum rounded once and against Gloo's.
fn compare(
    (ucx, gloo): (&Comm, &Comm),
    what: &str,
    (dtype, kind, n): (DType, RedKind, usize),
    first: usize,
    fresh: &dyn Fn() -> (Vec<u8>, Vec<u8>),
    make: &dyn Fn(&mut Vec<u8>, &mut Vec<u8>) -> Op,
    read_output: bool,
) -> usize {
    let (mut ia, mut oa) = fresh();
    let (mut ib, mut ob) = fresh();
    ucx.submit(make(&mut ia, &mut oa), &OpOptions::default())
        .unwrap_or_else(|e| panic!("ucx {what} {dtype:?} {kind:?}: {e:?}"));
    gloo.submit(make(&mut ib, &mut ob), &OpOptions::default())
        .unwrap_or_else(|e| panic!("gloo {what} {dtype:?} {kind:?}: {e:?}"));
    let (got, gloo_got) = match read_output {
        true => (halves(&oa), halves(&ob)),
        false => (halves(&ia), halves(&ib)),
    };
    let mut differs_per_step = 0;
    for (j, (g, b)) in got.iter().zip(&gloo_got).enumerate() {
        let want = expected(dtype, kind, n, first + j, false);
        assert_eq!(
            *g,
            want,
            "{what} {dtype:?} {kind:?} on {n} ranks, element {}: UCX gave {g:#06x}, \
             the sum rounded once is {want:#06x}",
            first + j
        );
        assert_eq!(
            *g,
            *b,
            "{what} {dtype:?} {kind:?} on {n} ranks, element {}: UCX {g:#06x}, Gloo {b:#06x}",
            first + j
        );
        differs_per_step += usize::from(expected(dtype, kind, n, first + j, true) != want);
    }
    differs_per_step
}

fn child() {
    let ucx = comm_with("ucx", "ucx", Duration::from_secs(60));
    let gloo = comm_with("gloo", "gloo", Duration::from_secs(60));
    let v = ucx.backend_version().to_string_lossy().into_owned();
    assert!(v.contains("UCX 1."), "{v}");
    let (me, n) = (rank() as usize, size() as usize);
    let comms = (&*ucx, &*gloo);
    let mut checked = 0;
    let mut differs = 0;
    for dtype in [DType::F16, DType::BF16] {
        for kind in [RedKind::Sum, RedKind::Avg, RedKind::PremulSum] {
            let case = (dtype, kind, n);
            // Recursive doubling, then the ring (>= 128 KiB).
            for count in [8 * n + 1, 140_001] {
                let fresh = || (input(dtype, me, 0, count), Vec::new());
                let make = |i: &mut Vec<u8>, _: &mut Vec<u8>| {
                    Op::all_reduce(ptr(i), count, dtype, red(kind))
                };
                differs += compare(comms, "all_reduce", case, 0, &fresh, &make, false);
                let root = n - 1;
                let make = |i: &mut Vec<u8>, _: &mut Vec<u8>| {
                    Op::reduce(ptr(i), count, dtype, root as i32, red(kind))
                };
                if me == root {
                    differs += compare(comms, "reduce", case, 0, &fresh, &make, false);
                } else {
                    let mut i = input(dtype, me, 0, count);
                    ucx.submit(make(&mut i, &mut Vec::new()), &OpOptions::default())
                        .unwrap();
                    assert!(i == input(dtype, me, 0, count), "reduce changed rank {me}");
                    let mut i = input(dtype, me, 0, count);
                    gloo.submit(make(&mut i, &mut Vec::new()), &OpOptions::default())
                        .unwrap();
                }
                checked += 2;
            }
            let per = 9;
            let fresh = || (input(dtype, me, 0, per * n), vec![0u8; per * 2]);
            let make = |i: &mut Vec<u8>, o: &mut Vec<u8>| {
                Op::reduce_scatter_single(ptr(o), ptr(i), per, dtype, red(kind))
            };
            differs += compare(
                comms,
                "reduce_scatter_single",
                case,
                me * per,
                &fresh,
                &make,
                true,
            );
            let counts: Vec<usize> = (0..n).map(|r| 5 + 3 * r).collect();
            let total: usize = counts.iter().sum();
            let at: usize = counts[..me].iter().sum();
            let fresh = || (input(dtype, me, 0, total), vec![0u8; counts[me] * 2]);
            let make = |i: &mut Vec<u8>, o: &mut Vec<u8>| {
                Op::reduce_scatter_v(ptr(o), ptr(i), counts.clone(), dtype, red(kind))
            };
            differs += compare(comms, "reduce_scatter_v", case, at, &fresh, &make, true);
            checked += 2;
        }
    }
    // The values make rounding at each step visible.
    assert!(
        differs > 100,
        "only {differs} elements tell the roundings apart"
    );
    println!("RESULT checked={checked} differs_per_step={differs}");
    ucx.finalize().unwrap();
    gloo.finalize().unwrap();
}

fn world(test: &str, n: usize) {
    if role().is_some() {
        return child();
    }
    if ucx_missing() {
        return;
    }
    let out = launch(test, "child", n, LOOPBACK_ENV, Duration::from_secs(240));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

#[test]
fn ucx_half_sums_3() {
    world("ucx_half_sums_3", 3);
}

#[test]
fn ucx_half_sums_4() {
    world("ucx_half_sums_4", 4);
}
