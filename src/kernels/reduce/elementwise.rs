//! The elementwise kernels of every dtype that computes in its own type
//! (integers, bool, float32, float64) and of bfloat16 (through f32 with
//! shifts), over one driver that picks slices or unaligned accesses.

use crate::kernels::half::{bf16_to_f32, f32_to_bf16};
use std::ffi::c_void;

/// Applies `f` elementwise. Uses slices (vectorisable) when the pointers are
/// aligned and `c` is either distinct from both inputs or equal to one of
/// them; raw unaligned accesses otherwise.
#[inline(always)]
pub(super) unsafe fn apply<T: Copy>(
    c: *mut c_void,
    a: *const c_void,
    b: *const c_void,
    n: usize,
    f: impl Fn(T, T) -> T,
) {
    let (c, a, b) = (c as *mut T, a as *const T, b as *const T);
    // A few elements (the small collectives) go straight to the scalar
    // loop: the checks below cost more than the loop they choose.
    if n < FEW {
        scalar(c, a, b, n, f);
        return;
    }
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
    scalar(c, a, b, n, f);
}

/// Below this many elements [`apply`] takes the scalar loop at once.
const FEW: usize = 8;

/// `f` elementwise, one element at a time, with unaligned accesses: right
/// for any alignment and for `c` equal to an input.
#[inline(always)]
unsafe fn scalar<T: Copy>(c: *mut T, a: *const T, b: *const T, n: usize, f: impl Fn(T, T) -> T) {
    for i in 0..n {
        let v = f(a.add(i).read_unaligned(), b.add(i).read_unaligned());
        c.add(i).write_unaligned(v);
    }
}

#[inline(always)]
pub(super) fn fmin<T: PartialOrd + Copy>(a: T, b: T) -> T {
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
pub(super) fn fmax<T: PartialOrd + Copy>(a: T, b: T) -> T {
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
        pub(super) unsafe extern "C" fn $name(
            c: *mut c_void,
            a: *const c_void,
            b: *const c_void,
            n: usize,
        ) {
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
