//! The scaling around a SUM (PREMUL_SUM's factor before, AVG's division
//! after) and reading a host PREMUL_SUM factor.

use crate::error::{Error, Result};
use crate::kernels::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::types::{DType, PremulFactor, ReduceOp};

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

/// PREMUL_SUM's factor as a host reduction scales by: the op's host value,
/// or the one element of `dtype` its pointer names (host memory: the only
/// memory the host transports handle).
pub fn host_premul_factor(op: &ReduceOp, dtype: DType) -> Result<f64> {
    match op.factor {
        PremulFactor::Host(f) => Ok(f),
        PremulFactor::Pointer(p) => {
            if p.is_null() {
                return Err(Error::null_argument("op.premul_factor_ptr"));
            }
            // SAFETY: the caller passes one element of the op's dtype in
            // host memory.
            unsafe { read_scalar(dtype, p as *const u8) }
        }
    }
}

/// Reads one element of `dtype` at `p` (a host PREMUL_SUM factor) as f64.
///
/// # Safety
/// `p` must point to one readable element of `dtype`.
pub(super) unsafe fn read_scalar(dtype: DType, p: *const u8) -> Result<f64> {
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
