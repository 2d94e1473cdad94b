//! Host reduction kernels for the Gloo backend: `c[i] = a[i] (op) b[i]` over
//! every dtype and elementwise reduce op, with the C signature Gloo's reduce
//! function option takes. Gloo calls them with `c` equal to `a` (or `b`), so
//! the kernels never form overlapping Rust references.
//!
//! Float16 and bfloat16 compute in float32 and round once (to nearest even)
//! per element; integers wrap on overflow; bool is one byte, 0 or 1, where
//! SUM and MAX are logical or, PRODUCT and MIN logical and. MIN and MAX
//! propagate NaN. Float8 types are carried but not reduced.

use crate::error::{Error, Result};
use crate::types::{DType, RedKind};
use std::ffi::c_void;

/// The C signature of a reduction: `n` elements at `c`, `a` and `b`.
pub type ReduceFn =
    unsafe extern "C" fn(c: *mut c_void, a: *const c_void, b: *const c_void, n: usize);

/// Compatibility re-exports: the conversions live in [`crate::half`].
pub use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

// ---- elementwise driver ---------------------------------------------------

/// Applies `f` elementwise. Uses slices (vectorisable) when the pointers are
/// aligned and `c` is either distinct from both inputs or equal to one of
/// them; raw unaligned accesses otherwise.
#[inline(always)]
unsafe fn apply<T: Copy>(
    c: *mut c_void,
    a: *const c_void,
    b: *const c_void,
    n: usize,
    f: impl Fn(T, T) -> T,
) {
    if n == 0 {
        return;
    }
    let (c, a, b) = (c as *mut T, a as *const T, b as *const T);
    let align = std::mem::align_of::<T>();
    let aligned =
        (c as usize) % align == 0 && (a as usize) % align == 0 && (b as usize) % align == 0;
    if aligned && a != b {
        if std::ptr::eq(c, a) {
            let cs = std::slice::from_raw_parts_mut(c, n);
            let bs = std::slice::from_raw_parts(b, n);
            for (x, y) in cs.iter_mut().zip(bs) {
                *x = f(*x, *y);
            }
            return;
        }
        if std::ptr::eq(c, b) {
            let cs = std::slice::from_raw_parts_mut(c, n);
            let as_ = std::slice::from_raw_parts(a, n);
            for (x, y) in cs.iter_mut().zip(as_) {
                *x = f(*y, *x);
            }
            return;
        }
        let (cb, ce) = (c as usize, c as usize + n * std::mem::size_of::<T>());
        let disjoint = |p: *const T| {
            let (pb, pe) = (p as usize, p as usize + n * std::mem::size_of::<T>());
            pe <= cb || ce <= pb
        };
        if disjoint(a) && disjoint(b) {
            let cs = std::slice::from_raw_parts_mut(c, n);
            let as_ = std::slice::from_raw_parts(a, n);
            let bs = std::slice::from_raw_parts(b, n);
            for ((x, y), z) in cs.iter_mut().zip(as_).zip(bs) {
                *x = f(*y, *z);
            }
            return;
        }
    }
    for i in 0..n {
        let v = f(a.add(i).read_unaligned(), b.add(i).read_unaligned());
        c.add(i).write_unaligned(v);
    }
}

#[inline(always)]
fn fmin<T: PartialOrd + Copy>(a: T, b: T) -> T {
    // NaN propagates: a NaN `a` fails `a == a` and is returned; a NaN `b`
    // fails `a < b` and is returned.
    #[allow(clippy::eq_op)]
    let a_nan = a != a;
    if a_nan || a < b {
        a
    } else {
        b
    }
}

#[inline(always)]
fn fmax<T: PartialOrd + Copy>(a: T, b: T) -> T {
    #[allow(clippy::eq_op)]
    let a_nan = a != a;
    if a_nan || a > b {
        a
    } else {
        b
    }
}

macro_rules! kernel {
    ($name:ident, $t:ty, |$a:ident, $b:ident| $body:expr) => {
        unsafe extern "C" fn $name(c: *mut c_void, a: *const c_void, b: *const c_void, n: usize) {
            apply::<$t>(c, a, b, n, |$a: $t, $b: $t| -> $t { $body })
        }
    };
}

macro_rules! int_kernels {
    ($t:ty, $sum:ident, $prod:ident, $min:ident, $max:ident, $and:ident, $or:ident, $xor:ident) => {
        kernel!($sum, $t, |x, y| x.wrapping_add(y));
        kernel!($prod, $t, |x, y| x.wrapping_mul(y));
        kernel!($min, $t, |x, y| if x < y { x } else { y });
        kernel!($max, $t, |x, y| if x > y { x } else { y });
        kernel!($and, $t, |x, y| x & y);
        kernel!($or, $t, |x, y| x | y);
        kernel!($xor, $t, |x, y| x ^ y);
    };
}

int_kernels!(i8, i8_sum, i8_prod, i8_min, i8_max, i8_and, i8_or, i8_xor);
int_kernels!(u8, u8_sum, u8_prod, u8_min, u8_max, u8_and, u8_or, u8_xor);
int_kernels!(i32, i32_sum, i32_prod, i32_min, i32_max, i32_and, i32_or, i32_xor);
int_kernels!(i64, i64_sum, i64_prod, i64_min, i64_max, i64_and, i64_or, i64_xor);
int_kernels!(u32, u32_sum, u32_prod, u32_min, u32_max, u32_and, u32_or, u32_xor);
int_kernels!(u64, u64_sum, u64_prod, u64_min, u64_max, u64_and, u64_or, u64_xor);

// bool: any nonzero byte is true; results are 0 or 1.
kernel!(bool_or, u8, |x, y| ((x | y) != 0) as u8);
kernel!(bool_and, u8, |x, y| ((x != 0) & (y != 0)) as u8);
kernel!(bool_xor, u8, |x, y| ((x != 0) ^ (y != 0)) as u8);

macro_rules! float_kernels {
    ($t:ty, $sum:ident, $prod:ident, $min:ident, $max:ident) => {
        kernel!($sum, $t, |x, y| x + y);
        kernel!($prod, $t, |x, y| x * y);
        kernel!($min, $t, |x, y| fmin(x, y));
        kernel!($max, $t, |x, y| fmax(x, y));
    };
}

float_kernels!(f32, f32_sum, f32_prod, f32_min, f32_max);
float_kernels!(f64, f64_sum, f64_prod, f64_min, f64_max);

// ---- float16 / bfloat16 slices ---------------------------------------------

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
mod f16c {
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
        unsafe extern "C" fn $sum(c: *mut c_void, a: *const c_void, b: *const c_void, n: usize) {
            half_apply(c, a, b, n, $to, $from, |x, y| x + y)
        }
        unsafe extern "C" fn $prod(c: *mut c_void, a: *const c_void, b: *const c_void, n: usize) {
            half_apply(c, a, b, n, $to, $from, |x, y| x * y)
        }
        unsafe extern "C" fn $min(c: *mut c_void, a: *const c_void, b: *const c_void, n: usize) {
            half_apply(c, a, b, n, $to, $from, fmin)
        }
        unsafe extern "C" fn $max(c: *mut c_void, a: *const c_void, b: *const c_void, n: usize) {
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
// bfloat16 converts with shifts, which the compiler vectorises in place.
kernel!(bf16_sum, u16, |x, y| f32_to_bf16(
    bf16_to_f32(x) + bf16_to_f32(y)
));
kernel!(bf16_prod, u16, |x, y| f32_to_bf16(
    bf16_to_f32(x) * bf16_to_f32(y)
));
kernel!(bf16_min, u16, |x, y| f32_to_bf16(fmin(
    bf16_to_f32(x),
    bf16_to_f32(y)
)));
kernel!(bf16_max, u16, |x, y| f32_to_bf16(fmax(
    bf16_to_f32(x),
    bf16_to_f32(y)
)));

/// The elementwise kernel that combines two partial results of `kind` on
/// `dtype`: AVG and PREMUL_SUM combine by SUM (their scaling is applied
/// before or after, see [`scale`]).
pub fn kernel(dtype: DType, kind: RedKind) -> Result<ReduceFn> {
    use DType::*;
    use RedKind::*;
    let k = match kind {
        PremulSum | Avg => Sum,
        other => other,
    };
    if k.is_bitwise() && dtype.is_floating() {
        return Err(Error::unsupported(format!(
            "reduce op {} is defined on integer and bool dtypes only, not {}",
            kind.name(),
            dtype.name()
        )));
    }
    macro_rules! pick {
        ($sum:ident, $prod:ident, $min:ident, $max:ident, $and:ident, $or:ident, $xor:ident) => {
            match k {
                Sum => $sum as ReduceFn,
                Product => $prod,
                Min => $min,
                Max => $max,
                BAnd => $and,
                BOr => $or,
                BXor => $xor,
                PremulSum | Avg => unreachable!(),
            }
        };
    }
    let f: ReduceFn = match dtype {
        I8 => pick!(i8_sum, i8_prod, i8_min, i8_max, i8_and, i8_or, i8_xor),
        U8 => pick!(u8_sum, u8_prod, u8_min, u8_max, u8_and, u8_or, u8_xor),
        I32 => pick!(i32_sum, i32_prod, i32_min, i32_max, i32_and, i32_or, i32_xor),
        I64 => pick!(i64_sum, i64_prod, i64_min, i64_max, i64_and, i64_or, i64_xor),
        U32 => pick!(u32_sum, u32_prod, u32_min, u32_max, u32_and, u32_or, u32_xor),
        U64 => pick!(u64_sum, u64_prod, u64_min, u64_max, u64_and, u64_or, u64_xor),
        Bool => {
            if kind == Avg || kind == PremulSum {
                return Err(Error::unsupported(format!(
                    "reduce op {} is not defined on bool",
                    kind.name()
                )));
            }
            pick!(bool_or, bool_and, bool_and, bool_or, bool_and, bool_or, bool_xor)
        }
        F32 => pick!(f32_sum, f32_prod, f32_min, f32_max, f32_sum, f32_sum, f32_sum),
        F64 => pick!(f64_sum, f64_prod, f64_min, f64_max, f64_sum, f64_sum, f64_sum),
        F16 => pick!(f16_sum, f16_prod, f16_min, f16_max, f16_sum, f16_sum, f16_sum),
        BF16 => pick!(bf16_sum, bf16_prod, bf16_min, bf16_max, bf16_sum, bf16_sum, bf16_sum),
        F8E4M3 | F8E5M2 => {
            return Err(Error::unsupported(format!(
                "the gloo backend moves {} data but does not reduce it (reduce op {})",
                dtype.name(),
                kind.name()
            )))
        }
    };
    if kind == PremulSum && !dtype.is_floating() {
        return Err(Error::unsupported(format!(
            "reduce op premul_sum is defined on floating dtypes only, not {}",
            dtype.name()
        )));
    }
    Ok(f)
}

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
) -> bool {
    let (to, from): (HalfToF32, F32ToHalf) = match dtype {
        DType::F16 => (f16_run_to_f32, f32_run_to_f16),
        DType::BF16 => (bf16_run_to_f32, f32_run_to_bf16),
        _ => return false,
    };
    let src = blocks as *const u16;
    let mut acc = vec![0f32; count];
    let mut part = vec![0f32; count];
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
    true
}

/// What to do to each element around the SUM of AVG and PREMUL_SUM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// Multiply by a factor (PREMUL_SUM, before the reduction).
    Mul(f64),
    /// Divide by the number of ranks (AVG, after); integers truncate toward
    /// zero.
    Div(u64),
}

/// Scales `n` elements of `dtype` from `src` into `dst` (may be equal).
///
/// # Safety
/// `src` and `dst` must hold `n` elements; they are equal or disjoint.
pub unsafe fn scale(
    dtype: DType,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    how: Scale,
) -> Result<()> {
    unsafe fn each<T: Copy>(dst: *mut u8, src: *const u8, n: usize, f: impl Fn(T) -> T) {
        let (d, s) = (dst as *mut T, src as *const T);
        for i in 0..n {
            d.add(i).write_unaligned(f(s.add(i).read_unaligned()));
        }
    }
    macro_rules! int {
        ($t:ty) => {
            match how {
                Scale::Div(k) => each::<$t>(dst, src, n, |x| (x as i128 / k as i128) as $t),
                Scale::Mul(_) => {
                    return Err(Error::unsupported(format!(
                        "reduce op premul_sum is defined on floating dtypes only, not {}",
                        dtype.name()
                    )))
                }
            }
        };
    }
    let factor = match how {
        Scale::Mul(f) => f,
        Scale::Div(k) => 1.0 / k as f64,
    };
    match dtype {
        DType::F32 => match how {
            Scale::Div(k) => each::<f32>(dst, src, n, |x| x / k as f32),
            Scale::Mul(f) => each::<f32>(dst, src, n, |x| x * f as f32),
        },
        DType::F64 => match how {
            Scale::Div(k) => each::<f64>(dst, src, n, |x| x / k as f64),
            Scale::Mul(f) => each::<f64>(dst, src, n, |x| x * f),
        },
        DType::F16 => match how {
            Scale::Div(k) => each::<u16>(dst, src, n, |x| f32_to_f16(f16_to_f32(x) / k as f32)),
            Scale::Mul(_) => {
                each::<u16>(dst, src, n, |x| f32_to_f16(f16_to_f32(x) * factor as f32))
            }
        },
        DType::BF16 => match how {
            Scale::Div(k) => each::<u16>(dst, src, n, |x| f32_to_bf16(bf16_to_f32(x) / k as f32)),
            Scale::Mul(_) => {
                each::<u16>(dst, src, n, |x| f32_to_bf16(bf16_to_f32(x) * factor as f32))
            }
        },
        DType::I8 => int!(i8),
        DType::U8 => int!(u8),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::U32 => int!(u32),
        DType::U64 => int!(u64),
        DType::Bool | DType::F8E4M3 | DType::F8E5M2 => {
            return Err(Error::unsupported(format!(
                "the gloo backend cannot scale {} values",
                dtype.name()
            )))
        }
    }
    Ok(())
}

/// Reads one element of `dtype` at `p` (a host PREMUL_SUM factor) as f64.
///
/// # Safety
/// `p` must point to one readable element of `dtype`.
pub unsafe fn read_scalar(dtype: DType, p: *const u8) -> Result<f64> {
    Ok(match dtype {
        DType::F32 => (p as *const f32).read_unaligned() as f64,
        DType::F64 => (p as *const f64).read_unaligned(),
        DType::F16 => f16_to_f32((p as *const u16).read_unaligned()) as f64,
        DType::BF16 => bf16_to_f32((p as *const u16).read_unaligned()) as f64,
        DType::I8 => (p as *const i8).read_unaligned() as f64,
        DType::U8 | DType::Bool => p.read() as f64,
        DType::I32 => (p as *const i32).read_unaligned() as f64,
        DType::I64 => (p as *const i64).read_unaligned() as f64,
        DType::U32 => (p as *const u32).read_unaligned() as f64,
        DType::U64 => (p as *const u64).read_unaligned() as f64,
        DType::F8E4M3 | DType::F8E5M2 => {
            return Err(Error::unsupported(format!(
                "a {} premul_sum factor is not supported",
                dtype.name()
            )))
        }
    })
}

#[cfg(test)]
mod tests {

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
        if !(std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("avx"))
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
        });
    }
    use super::*;

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
                read_scalar(DType::F64, &x as *const f64 as *const u8).unwrap(),
                2.5
            );
        }
    }
}

#[cfg(test)]
mod throughput {
    use super::*;
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
}
