//! The kernels against hand-computed results, in place and out of place;
//! the F16C conversions against the portable ones; a throughput print.

#[cfg(target_arch = "x86_64")]
use super::halves::f16c;
use super::*;
use crate::kernels::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

#[test]
fn half_kernels_handle_in_place_tails_and_partial_overlap() {
    let n = 1300; // two full chunks and a tail
    let val = |i: usize, k: usize| ((i * 7 + k) % 23) as f32 - 11.0;
    for dt in [DType::F16, DType::BF16] {
        let enc = if dt == DType::F16 {
            f32_to_f16
        } else {
            f32_to_bf16
        };
        let dec = if dt == DType::F16 {
            f16_to_f32
        } else {
            bf16_to_f32
        };
        let f = kernel(dt, RedKind::Sum).unwrap();
        let a: Vec<u16> = (0..n).map(|i| enc(val(i, 1))).collect();
        let b: Vec<u16> = (0..n).map(|i| enc(val(i, 5))).collect();
        let want: Vec<f32> = (0..n).map(|i| val(i, 1) + val(i, 5)).collect();
        let (mut c1, mut c2, mut c3) = (a.clone(), b.clone(), vec![0u16; n]);
        let p = |v: &Vec<u16>| v.as_ptr() as *const c_void;
        unsafe {
            f(c1.as_mut_ptr() as *mut c_void, p(&c1), p(&b), n); // c == a
            f(c2.as_mut_ptr() as *mut c_void, p(&a), p(&c2), n); // c == b
            f(c3.as_mut_ptr() as *mut c_void, p(&a), p(&b), n); // disjoint
        }
        for (name, c) in [("c==a", &c1), ("c==b", &c2), ("disjoint", &c3)] {
            let got: Vec<f32> = c.iter().map(|h| dec(*h)).collect();
            assert_eq!(got, want, "{} {name}", dt.name());
        }
        // Output one element past the first input: element by element,
        // in order, as the portable kernels do (never a chunk's stale
        // copy).
        let mut buf: Vec<u16> = a.clone();
        buf.push(0);
        let mut reference = buf.clone();
        for i in 0..n {
            reference[i + 1] = enc(dec(reference[i]) + dec(b[i]));
        }
        let base = buf.as_mut_ptr();
        unsafe { f(base.add(1) as *mut c_void, base as *const c_void, p(&b), n) };
        assert_eq!(buf, reference, "{} partial overlap", dt.name());
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn f16c_conversions_match_the_portable_ones() {
    if !(std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx"))
    {
        println!("SKIPPED: this CPU has no F16C");
        return;
    }
    // Every half value to f32 (runs of 13 cover the 8-wide path and the tail).
    let halves: Vec<u16> = (0..=u16::MAX).collect();
    let mut wide = vec![0f32; halves.len()];
    for (i, run) in halves.chunks(13).enumerate() {
        unsafe { f16c::to_f32(&mut wide[i * 13..i * 13 + run.len()], run.as_ptr()) };
    }
    for (h, w) in halves.iter().zip(&wide) {
        let want = f16_to_f32(*h);
        assert!(
            want.to_bits() == w.to_bits() || (want.is_nan() && w.is_nan()),
            "{h:#06x}: {w} vs {want}"
        );
    }
    // A sweep of f32 bit patterns (every exponent, ties, subnormal
    // results, overflow) back to half.
    let floats: Vec<f32> = (0..=u32::MAX / 4099)
        .map(|k| f32::from_bits(k.wrapping_mul(4099)))
        .collect();
    let mut narrow = vec![0u16; floats.len()];
    for (i, run) in floats.chunks(13).enumerate() {
        unsafe { f16c::from_f32(narrow.as_mut_ptr().add(i * 13), run) };
    }
    for (f, h) in floats.iter().zip(&narrow) {
        let want = f32_to_f16(*f);
        let nan = |b: u16| b & 0x7c00 == 0x7c00 && b & 0x3ff != 0;
        assert!(
            want == *h || (nan(want) && nan(*h)),
            "{f:e} ({:#010x}): {h:#06x} vs {want:#06x}",
            f.to_bits()
        );
    }
}

#[test]
fn half_blocks_are_summed_in_f32_and_rounded_once() {
    // 2048 + 1 + 1 in float16: adding one at a time rounds back to 2048
    // each step (the spacing at 2048 is 2); summing in f32 gives 2050.
    let blocks: Vec<u16> = [2048.0f32, 1.0, 1.0]
        .iter()
        .map(|v| f32_to_f16(*v))
        .collect();
    let mut out = 0u16;
    assert!(unsafe {
        sum_half_blocks(
            DType::F16,
            &mut out as *mut u16 as *mut u8,
            blocks.as_ptr() as *const u8,
            3,
            1,
            None,
        )
        .unwrap()
    });
    assert_eq!(f16_to_f32(out), 2050.0);
    let mut pairwise = blocks[0];
    for b in &blocks[1..] {
        pairwise = f32_to_f16(f16_to_f32(pairwise) + f16_to_f32(*b));
    }
    assert_eq!(f16_to_f32(pairwise), 2048.0, "the pairwise sum this avoids");
    let b: Vec<u16> = [3.0f32, 4.0].iter().map(|v| f32_to_bf16(*v)).collect();
    assert!(unsafe {
        sum_half_blocks(
            DType::BF16,
            &mut out as *mut u16 as *mut u8,
            b.as_ptr() as *const u8,
            2,
            1,
            Some(2),
        )
        .unwrap()
    });
    assert_eq!(bf16_to_f32(out), 3.5);
    assert!(!unsafe {
        sum_half_blocks(
            DType::F32,
            &mut out as *mut u16 as *mut u8,
            b.as_ptr() as *const u8,
            1,
            1,
            None,
        )
        .unwrap()
    });
}

unsafe fn run<T: Copy>(f: ReduceFn, a: &[T], b: &[T]) -> Vec<T> {
    let mut c = a.to_vec();
    // Out of place.
    f(
        c.as_mut_ptr() as *mut c_void,
        a.as_ptr() as *const c_void,
        b.as_ptr() as *const c_void,
        a.len(),
    );
    let out_of_place = c.clone();
    // In place, c == a, as Gloo calls it.
    let mut d = a.to_vec();
    let p = d.as_mut_ptr() as *mut c_void;
    f(p, p, b.as_ptr() as *const c_void, a.len());
    assert_eq!(
        std::slice::from_raw_parts(d.as_ptr() as *const u8, d.len() * std::mem::size_of::<T>()),
        std::slice::from_raw_parts(
            out_of_place.as_ptr() as *const u8,
            d.len() * std::mem::size_of::<T>()
        )
    );
    // In place, c == b.
    let mut e = b.to_vec();
    let p = e.as_mut_ptr() as *mut c_void;
    f(p, a.as_ptr() as *const c_void, p, a.len());
    assert_eq!(
        std::slice::from_raw_parts(e.as_ptr() as *const u8, e.len() * std::mem::size_of::<T>()),
        std::slice::from_raw_parts(
            out_of_place.as_ptr() as *const u8,
            e.len() * std::mem::size_of::<T>()
        )
    );
    out_of_place
}

#[test]
fn integer_kernels() {
    unsafe {
        let a: Vec<i32> = vec![1, -5, i32::MAX, 6];
        let b: Vec<i32> = vec![2, 7, 1, 3];
        assert_eq!(
            run(kernel(DType::I32, RedKind::Sum).unwrap(), &a, &b),
            vec![3, 2, i32::MIN, 9]
        );
        assert_eq!(
            run(kernel(DType::I32, RedKind::Product).unwrap(), &a, &b),
            vec![2, -35, i32::MAX, 18]
        );
        assert_eq!(
            run(kernel(DType::I32, RedKind::Min).unwrap(), &a, &b),
            vec![1, -5, 1, 3]
        );
        assert_eq!(
            run(kernel(DType::I32, RedKind::Max).unwrap(), &a, &b),
            vec![2, 7, i32::MAX, 6]
        );
        assert_eq!(
            run(kernel(DType::I32, RedKind::BAnd).unwrap(), &a, &b),
            vec![0, 3, 1, 2]
        );
        assert_eq!(
            run(kernel(DType::I32, RedKind::BOr).unwrap(), &a, &b),
            vec![3, -1, i32::MAX, 7]
        );
        assert_eq!(
            run(kernel(DType::I32, RedKind::BXor).unwrap(), &a, &b),
            vec![3, -4, i32::MAX - 1, 5]
        );
        let a: Vec<u8> = vec![200, 3];
        let b: Vec<u8> = vec![100, 5];
        assert_eq!(
            run(kernel(DType::U8, RedKind::Sum).unwrap(), &a, &b),
            vec![44, 8]
        );
        assert_eq!(
            run(kernel(DType::U8, RedKind::Max).unwrap(), &a, &b),
            vec![200, 5]
        );
        let a: Vec<i8> = vec![-100, 3];
        let b: Vec<i8> = vec![-100, -5];
        assert_eq!(
            run(kernel(DType::I8, RedKind::Sum).unwrap(), &a, &b),
            vec![56, -2]
        );
        assert_eq!(
            run(kernel(DType::I8, RedKind::Min).unwrap(), &a, &b),
            vec![-100, -5]
        );
        let a: Vec<u64> = vec![u64::MAX, 1 << 40];
        let b: Vec<u64> = vec![2, 1 << 41];
        assert_eq!(
            run(kernel(DType::U64, RedKind::Sum).unwrap(), &a, &b),
            vec![1, 3 << 40]
        );
        assert_eq!(
            run(kernel(DType::U64, RedKind::Min).unwrap(), &a, &b),
            vec![2, 1 << 40]
        );
        let a: Vec<i64> = vec![-3, 1 << 50];
        let b: Vec<i64> = vec![4, 2];
        assert_eq!(
            run(kernel(DType::I64, RedKind::Product).unwrap(), &a, &b),
            vec![-12, 1 << 51]
        );
        let a: Vec<u32> = vec![0xf0f0, 7];
        let b: Vec<u32> = vec![0x0ff0, 9];
        assert_eq!(
            run(kernel(DType::U32, RedKind::BXor).unwrap(), &a, &b),
            vec![0xff00, 14]
        );
    }
}

#[test]
fn bool_kernels() {
    unsafe {
        let a: Vec<u8> = vec![0, 0, 1, 1];
        let b: Vec<u8> = vec![0, 1, 0, 1];
        let k = |r| kernel(DType::Bool, r).unwrap();
        assert_eq!(run(k(RedKind::Sum), &a, &b), vec![0, 1, 1, 1]);
        assert_eq!(run(k(RedKind::Max), &a, &b), vec![0, 1, 1, 1]);
        assert_eq!(run(k(RedKind::BOr), &a, &b), vec![0, 1, 1, 1]);
        assert_eq!(run(k(RedKind::Product), &a, &b), vec![0, 0, 0, 1]);
        assert_eq!(run(k(RedKind::Min), &a, &b), vec![0, 0, 0, 1]);
        assert_eq!(run(k(RedKind::BAnd), &a, &b), vec![0, 0, 0, 1]);
        assert_eq!(run(k(RedKind::BXor), &a, &b), vec![0, 1, 1, 0]);
        assert!(kernel(DType::Bool, RedKind::Avg).is_err());
    }
}

#[test]
fn float_kernels() {
    unsafe {
        let a: Vec<f32> = vec![1.5, -2.0, f32::NAN, 3.0];
        let b: Vec<f32> = vec![2.0, 4.0, 1.0, f32::NAN];
        let s = run(kernel(DType::F32, RedKind::Sum).unwrap(), &a, &b);
        assert_eq!(&s[..2], &[3.5, 2.0]);
        let m = run(kernel(DType::F32, RedKind::Min).unwrap(), &a, &b);
        assert_eq!(&m[..2], &[1.5, -2.0]);
        assert!(m[2].is_nan() && m[3].is_nan());
        let m = run(kernel(DType::F32, RedKind::Max).unwrap(), &a, &b);
        assert_eq!(&m[..2], &[2.0, 4.0]);
        assert!(m[2].is_nan() && m[3].is_nan());
        let a: Vec<f64> = vec![1.5, -2.0];
        let b: Vec<f64> = vec![2.0, 4.0];
        assert_eq!(
            run(kernel(DType::F64, RedKind::Product).unwrap(), &a, &b),
            vec![3.0, -8.0]
        );
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for k in [RedKind::BAnd, RedKind::BOr, RedKind::BXor] {
                assert_eq!(
                    kernel(dt, k).err().unwrap().kind,
                    crate::error::ErrorKind::Unsupported
                );
            }
        }
        assert!(kernel(DType::F8E4M3, RedKind::Sum).is_err());
        assert!(kernel(DType::I32, RedKind::PremulSum).is_err());
    }
}

#[test]
fn half_kernels_compute_in_f32() {
    unsafe {
        for (to, from, dt) in [
            (
                f16_to_f32 as fn(u16) -> f32,
                f32_to_f16 as fn(f32) -> u16,
                DType::F16,
            ),
            (bf16_to_f32, f32_to_bf16, DType::BF16),
        ] {
            let a: Vec<u16> = [1.0f32, 2.5, -3.0, 100.0]
                .iter()
                .map(|x| from(*x))
                .collect();
            let b: Vec<u16> = [0.5f32, 0.25, 4.0, -100.0]
                .iter()
                .map(|x| from(*x))
                .collect();
            let s: Vec<f32> = run(kernel(dt, RedKind::Sum).unwrap(), &a, &b)
                .into_iter()
                .map(to)
                .collect();
            assert_eq!(s, vec![1.5, 2.75, 1.0, 0.0]);
            let p: Vec<f32> = run(kernel(dt, RedKind::Product).unwrap(), &a, &b)
                .into_iter()
                .map(to)
                .collect();
            assert_eq!(
                p,
                [0.5, 0.625, -12.0, -10000.0f32]
                    .iter()
                    .map(|x| to(from(*x)))
                    .collect::<Vec<_>>()
            );
            let m: Vec<f32> = run(kernel(dt, RedKind::Min).unwrap(), &a, &b)
                .into_iter()
                .map(to)
                .collect();
            assert_eq!(m, vec![0.5, 0.25, -3.0, -100.0]);
            let m: Vec<f32> = run(kernel(dt, RedKind::Max).unwrap(), &a, &b)
                .into_iter()
                .map(to)
                .collect();
            assert_eq!(m, vec![1.0, 2.5, 4.0, 100.0]);
        }
        // A long vector through the aligned fast path and an unaligned one.
        let n = 1001;
        let a: Vec<u16> = (0..n).map(|i| f32_to_f16(i as f32 * 0.5)).collect();
        let b: Vec<u16> = (0..n).map(|i| f32_to_f16(i as f32 * 0.25)).collect();
        let s = run(kernel(DType::F16, RedKind::Sum).unwrap(), &a, &b);
        for i in 0..n {
            assert_eq!(s[i], f32_to_f16(f16_to_f32(a[i]) + f16_to_f32(b[i])));
        }
        let mut raw = vec![0u8; 2 * n + 1];
        let f = kernel(DType::F16, RedKind::Sum).unwrap();
        f(
            raw.as_mut_ptr().add(1) as *mut c_void,
            a.as_ptr() as *const c_void,
            b.as_ptr() as *const c_void,
            n,
        );
        for i in 0..n {
            let v = u16::from_ne_bytes([raw[1 + 2 * i], raw[2 + 2 * i]]);
            assert_eq!(v, s[i]);
        }
    }
}

#[test]
fn scaling() {
    unsafe {
        let mut v: Vec<i32> = vec![7, -7, 9];
        let p = v.as_mut_ptr() as *mut u8;
        scale(DType::I32, p, p, 3, Scale::Div(2)).unwrap();
        assert_eq!(v, vec![3, -3, 4]);
        let mut f: Vec<f32> = vec![1.0, 3.0];
        let p = f.as_mut_ptr() as *mut u8;
        scale(DType::F32, p, p, 2, Scale::Mul(0.5)).unwrap();
        assert_eq!(f, vec![0.5, 1.5]);
        let src: Vec<u16> = vec![f32_to_bf16(3.0), f32_to_bf16(-1.0)];
        let mut dst = vec![0u16; 2];
        scale(
            DType::BF16,
            dst.as_mut_ptr() as *mut u8,
            src.as_ptr() as *const u8,
            2,
            Scale::Div(4),
        )
        .unwrap();
        assert_eq!(dst, vec![f32_to_bf16(0.75), f32_to_bf16(-0.25)]);
        let mut h: Vec<u16> = vec![f32_to_f16(3.0)];
        let p = h.as_mut_ptr() as *mut u8;
        scale(DType::F16, p, p, 1, Scale::Mul(2.0)).unwrap();
        assert_eq!(h, vec![f32_to_f16(6.0)]);
        let mut u: Vec<u64> = vec![u64::MAX];
        let p = u.as_mut_ptr() as *mut u8;
        scale(DType::U64, p, p, 1, Scale::Div(3)).unwrap();
        assert_eq!(u, vec![u64::MAX / 3]);
        assert!(scale(DType::I32, p, p, 1, Scale::Mul(2.0)).is_err());
        let x: f64 = 2.5;
        assert_eq!(
            scale::read_scalar(DType::F64, &x as *const f64 as *const u8).unwrap(),
            2.5
        );
    }
}

/// Prints kernel throughput (not a check): cargo test --release --lib kernel_throughput -- --ignored --nocapture
#[test]
#[ignore]
fn kernel_throughput() {
    let n = 1 << 20;
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let f = kernel(dt, RedKind::Sum).unwrap();
        let a = vec![0u8; n * dt.size()];
        let mut c = vec![0u8; n * dt.size()];
        let t = std::time::Instant::now();
        for _ in 0..50 {
            unsafe {
                f(
                    c.as_mut_ptr() as *mut c_void,
                    c.as_ptr() as *const c_void,
                    a.as_ptr() as *const c_void,
                    n,
                )
            };
        }
        let s = t.elapsed().as_secs_f64() / 50.0;
        println!(
            "{}: {:.2} GB/s of input",
            dt.name(),
            (n * dt.size()) as f64 / s / 1e9
        );
    }
}

#[test]
fn the_kernel_table_answers_as_the_rules_do() {
    for (i, d) in DType::ALL.iter().enumerate() {
        assert_eq!(*d as usize, i, "DType::ALL is in discriminant order");
        for (j, k) in RedKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, j, "RedKind::ALL is in discriminant order");
            match (kernel(*d, *k), select(*d, *k)) {
                (Ok(f), Ok(g)) => assert_eq!(f as usize, g as usize, "{d:?} {k:?}"),
                (Err(e), Err(r)) => assert_eq!((e.kind, e.message), (r.kind, r.message)),
                (a, b) => panic!("{d:?} {k:?}: table {:?}, rules {:?}", a.is_ok(), b.is_ok()),
            }
        }
    }
}

/// Every length either side of the scalar path's limit, in place on
/// either input, apart, and at odd addresses: element by element what
/// the operator gives (the scalar path and the slice loops must agree).
#[test]
fn elementwise_kernels_at_every_small_length() {
    fn check<T: Copy + PartialEq + std::fmt::Debug>(
        dt: DType,
        k: RedKind,
        val: impl Fn(usize) -> T,
        op: impl Fn(T, T) -> T,
    ) {
        let f = kernel(dt, k).unwrap();
        let es = std::mem::size_of::<T>();
        for n in 0..20 {
            let a: Vec<T> = (0..n).map(|i| val(3 * i + 1)).collect();
            let b: Vec<T> = (0..n).map(|i| val(5 * i + 2)).collect();
            let want: Vec<T> = a.iter().zip(&b).map(|(x, y)| op(*x, *y)).collect();
            let p = |v: &Vec<T>| v.as_ptr() as *const c_void;
            let (mut c1, mut c2, mut c3) = (a.clone(), b.clone(), b.clone());
            // Byte buffers holding a, b and the output one byte off their
            // alignment.
            let mut raw = vec![0u8; 3 * n * es + 3];
            let (ra, rb, rc) = (1, 2 + n * es, 3 + 2 * n * es);
            unsafe {
                f(c1.as_mut_ptr() as *mut c_void, p(&c1), p(&b), n);
                f(c2.as_mut_ptr() as *mut c_void, p(&a), p(&c2), n);
                f(c3.as_mut_ptr() as *mut c_void, p(&a), p(&b), n);
                let base = raw.as_mut_ptr();
                std::ptr::copy_nonoverlapping(a.as_ptr() as *const u8, base.add(ra), n * es);
                std::ptr::copy_nonoverlapping(b.as_ptr() as *const u8, base.add(rb), n * es);
                f(
                    base.add(rc) as *mut c_void,
                    base.add(ra) as *const c_void,
                    base.add(rb) as *const c_void,
                    n,
                );
            }
            let unaligned: Vec<T> = (0..n)
                .map(|i| unsafe { (raw.as_ptr().add(rc + i * es) as *const T).read_unaligned() })
                .collect();
            for (name, got) in [
                ("c==a", &c1),
                ("c==b", &c2),
                ("apart", &c3),
                ("unaligned", &unaligned),
            ] {
                assert_eq!(got, &want, "{} {k:?} n {n} {name}", dt.name());
            }
        }
    }
    check(
        DType::I32,
        RedKind::Sum,
        |i| i as i32 * 7 - 40,
        |x, y| x.wrapping_add(y),
    );
    check(
        DType::U8,
        RedKind::Max,
        |i| (i * 37 % 251) as u8,
        |x, y| x.max(y),
    );
    check(
        DType::F32,
        RedKind::Sum,
        |i| i as f32 * 0.3 - 2.0,
        |x, y| x + y,
    );
    check(
        DType::F64,
        RedKind::Product,
        |i| i as f64 * 0.7 - 1.0,
        |x, y| x * y,
    );
}
