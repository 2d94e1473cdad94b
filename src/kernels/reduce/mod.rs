//! Host reduction kernels for the Gloo backend: `c[i] = a[i] (op) b[i]` over
//! every dtype and elementwise reduce op, with the C signature Gloo's reduce
//! function option takes. Gloo calls them with `c` equal to `a` (or `b`), so
//! the kernels never form overlapping Rust references.
//!
//! Float16 and bfloat16 compute in float32 and round once (to nearest even)
//! per element; integers wrap on overflow; bool is one byte, 0 or 1, where
//! SUM and MAX are logical or, PRODUCT and MIN logical and. MIN and MAX
//! propagate NaN. Float8 types are carried but not reduced.
//!
//! `elementwise.rs` has the kernels of the types that compute in their own
//! type (and bfloat16); `halves.rs` the float16 ones and the f32 sum of
//! half blocks; `scale.rs` the scaling of AVG and PREMUL_SUM. The
//! float16/bfloat16 conversions themselves are [`crate::kernels::half`].

mod elementwise;
mod halves;
mod scale;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::types::{DType, RedKind};
use elementwise::*;
use halves::{f16_max, f16_min, f16_prod, f16_sum};
use std::ffi::c_void;
use std::sync::OnceLock;

pub use halves::sum_half_blocks;
pub use scale::{host_premul_factor, scale, Scale};

/// The C signature of a reduction: `n` elements at `c`, `a` and `b`.
pub type ReduceFn =
    unsafe extern "C" fn(c: *mut c_void, a: *const c_void, b: *const c_void, n: usize);

/// The elementwise kernel that combines two partial results of `kind` on
/// `dtype`: AVG and PREMUL_SUM combine by SUM (their scaling is applied
/// before or after, see [`scale`]). Every call of a reduction asks (when
/// it is checked and when it runs), so the answers are a table made once
/// from [`select`]; a refused pair asks [`select`] again for its error.
#[inline]
pub fn kernel(dtype: DType, kind: RedKind) -> Result<ReduceFn> {
    static TABLE: OnceLock<[[Option<ReduceFn>; RedKind::ALL.len()]; DType::ALL.len()]> =
        OnceLock::new();
    let table = TABLE.get_or_init(|| DType::ALL.map(|d| RedKind::ALL.map(|k| select(d, k).ok())));
    match table[dtype as usize][kind as usize] {
        Some(f) => Ok(f),
        None => select(dtype, kind),
    }
}

/// The rules behind [`kernel`], with the error of each refused pair.
#[cold]
fn select(dtype: DType, kind: RedKind) -> Result<ReduceFn> {
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
