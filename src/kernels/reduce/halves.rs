//! float16 kernels computed in f32 a chunk at a time (with the CPU's F16C
//! conversions when it has them), and the f32-accumulated sum of
//! float16/bfloat16 blocks that rounds once.

use super::elementwise::{fmax, fmin};
use crate::error::Result;
use crate::kernels::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::types::DType;
use std::ffi::c_void;

/// Converts a run of half values to f32 (`dst.len()` of them from `src`).
type HalfToF32 = unsafe fn(dst: &mut [f32], src: *const u16);
/// Converts f32 values to half bits at `dst`, rounding to nearest even.
type F32ToHalf = unsafe fn(dst: *mut u16, src: &[f32]);

unsafe fn f16_run_to_f32(dst: &mut [f32], src: *const u16) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        return f16c::to_f32(dst, src);
    }
    for (i, d) in dst.iter_mut().enumerate() {
        *d = f16_to_f32(src.add(i).read_unaligned());
    }
}

unsafe fn f32_run_to_f16(dst: *mut u16, src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
        return f16c::from_f32(dst, src);
    }
    for (i, v) in src.iter().enumerate() {
        dst.add(i).write_unaligned(f32_to_f16(*v));
    }
}

unsafe fn bf16_run_to_f32(dst: &mut [f32], src: *const u16) {
    for (i, d) in dst.iter_mut().enumerate() {
        *d = bf16_to_f32(src.add(i).read_unaligned());
    }
}

unsafe fn f32_run_to_bf16(dst: *mut u16, src: &[f32]) {
    for (i, v) in src.iter().enumerate() {
        dst.add(i).write_unaligned(f32_to_bf16(*v));
    }
}

/// The x86 F16C conversions (8 values per instruction, round to nearest
/// even like [`f32_to_f16`]); used when the CPU has them.
#[cfg(target_arch = "x86_64")]
pub(super) mod f16c {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn to_f32(dst: &mut [f32], src: *const u16) {
        let n = dst.len();
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm_loadu_si128(src.add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for (j, d) in dst.iter_mut().enumerate().skip(i) {
            *d = super::f16_to_f32(src.add(j).read_unaligned());
        }
    }

    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn from_f32(dst: *mut u16, src: &[f32]) {
        let n = src.len();
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            _mm_storeu_si128(
                dst.add(i) as *mut __m128i,
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v),
            );
            i += 8;
        }
        for (j, v) in src.iter().enumerate().skip(i) {
            dst.add(j).write_unaligned(super::f32_to_f16(*v));
        }
    }
}

/// Applies `f` to half values computed in f32, a chunk at a time: the
/// chunk's inputs are converted (vectorised) before its output is written,
/// so `c` may equal `a` or `b`; partly overlapping buffers go element by
/// element.
#[inline(always)]
unsafe fn half_apply(
    c: *mut c_void,
    a: *const c_void,
    b: *const c_void,
    n: usize,
    to: HalfToF32,
    from: F32ToHalf,
    f: impl Fn(f32, f32) -> f32,
) {
    const CHUNK: usize = 512;
    let (c, a, b) = (c as *mut u16, a as *const u16, b as *const u16);
    let bytes = n * 2;
    let partly_overlaps = |p: *const u16| {
        let (pb, cb) = (p as usize, c as usize);
        pb != cb && pb < cb + bytes && cb < pb + bytes
    };
    if partly_overlaps(a) || partly_overlaps(b) {
        let mut x = [0f32; 1];
        let mut y = [0f32; 1];
        for i in 0..n {
            to(&mut x, a.add(i));
            to(&mut y, b.add(i));
            from(c.add(i), &[f(x[0], y[0])]);
        }
        return;
    }
    let mut x = [0f32; CHUNK];
    let mut y = [0f32; CHUNK];
    let mut start = 0;
    while start < n {
        let m = CHUNK.min(n - start);
        to(&mut x[..m], a.add(start));
        to(&mut y[..m], b.add(start));
        for (xi, yi) in x[..m].iter_mut().zip(&y[..m]) {
            *xi = f(*xi, *yi);
        }
        from(c.add(start), &x[..m]);
        start += m;
    }
}

macro_rules! half_kernels {
    ($to:ident, $from:ident, $sum:ident, $prod:ident, $min:ident, $max:ident) => {
        pub(super) unsafe extern "C" fn $sum(
            c: *mut c_void,
            a: *const c_void,
            b: *const c_void,
            n: usize,
        ) {
            half_apply(c, a, b, n, $to, $from, |x, y| x + y)
        }
        pub(super) unsafe extern "C" fn $prod(
            c: *mut c_void,
            a: *const c_void,
            b: *const c_void,
            n: usize,
        ) {
            half_apply(c, a, b, n, $to, $from, |x, y| x * y)
        }
        pub(super) unsafe extern "C" fn $min(
            c: *mut c_void,
            a: *const c_void,
            b: *const c_void,
            n: usize,
        ) {
            half_apply(c, a, b, n, $to, $from, fmin)
        }
        pub(super) unsafe extern "C" fn $max(
            c: *mut c_void,
            a: *const c_void,
            b: *const c_void,
            n: usize,
        ) {
            half_apply(c, a, b, n, $to, $from, fmax)
        }
    };
}

half_kernels!(
    f16_run_to_f32,
    f32_run_to_f16,
    f16_sum,
    f16_prod,
    f16_min,
    f16_max
);

/// Sums `nblocks` blocks of `count` float16/bfloat16 elements (block `r`
/// at `blocks + r * count` elements) into `out` with an f32 accumulator, so
/// the result is rounded to the half type once, not once per rank; `divide`
/// divides the f32 sum first (AVG). Returns false for other dtypes.
///
/// # Safety
/// `blocks` holds `nblocks * count` elements and `out` holds `count`.
pub unsafe fn sum_half_blocks(
    dtype: DType,
    out: *mut u8,
    blocks: *const u8,
    nblocks: usize,
    count: usize,
    divide: Option<u64>,
) -> Result<bool> {
    let (to, from): (HalfToF32, F32ToHalf) = match dtype {
        DType::F16 => (f16_run_to_f32, f32_run_to_f16),
        DType::BF16 => (bf16_run_to_f32, f32_run_to_bf16),
        _ => return Ok(false),
    };
    let src = blocks as *const u16;
    let what = "float32 sums of the half-precision 'count' elements";
    let mut acc = crate::util::try_zeroed::<f32>(count, what)?;
    let mut part = crate::util::try_zeroed::<f32>(count, what)?;
    for r in 0..nblocks {
        to(&mut part, src.add(r * count));
        for (a, p) in acc.iter_mut().zip(&part) {
            *a += *p;
        }
    }
    if let Some(k) = divide {
        for a in acc.iter_mut() {
            *a /= k as f32;
        }
    }
    from(out as *mut u16, &acc);
    Ok(true)
}
