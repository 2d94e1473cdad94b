//! Bucket assignment (as DDP's rebuilt buckets) and the element casts the
//! reducer and its compressing hooks need.

use crate::error::{Error, Result};
use crate::kernels::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::types::DType;

/// Assigns the non-empty gradients to buckets as DDP does once it knows the
/// backward order: gradients in reverse index order (the order a backward
/// pass produces them), one open bucket per dtype, a dtype's first bucket
/// closed once it holds at least `first_bytes`, later ones at `cap_bytes`.
/// Buckets are ordered by their first gradient in that order, and list their
/// gradients in it.
pub fn assign(grads: &[(usize, DType)], first_bytes: usize, cap_bytes: usize) -> Vec<Vec<usize>> {
    struct Open {
        dtype: DType,
        members: Vec<usize>,
        bytes: usize,
        closed_before: usize,
    }
    let mut done = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    for i in (0..grads.len()).rev() {
        let (count, dtype) = grads[i];
        if count == 0 {
            continue;
        }
        let slot = open
            .iter()
            .position(|o| o.dtype == dtype)
            .unwrap_or_else(|| {
                open.push(Open {
                    dtype,
                    members: Vec::new(),
                    bytes: 0,
                    closed_before: 0,
                });
                open.len() - 1
            });
        let o = &mut open[slot];
        o.members.push(i);
        o.bytes += count * dtype.size();
        let limit = if o.closed_before == 0 {
            first_bytes
        } else {
            cap_bytes
        };
        if o.bytes >= limit {
            done.push(std::mem::take(&mut o.members));
            o.bytes = 0;
            o.closed_before += 1;
        }
    }
    done.extend(
        open.into_iter()
            .map(|o| o.members)
            .filter(|m| !m.is_empty()),
    );
    done.sort_by_key(|m| std::cmp::Reverse(m[0]));
    done
}

/// The dtypes gradients may have: the floating-point ones the hooks handle.
pub fn check_grad_dtype(dtype: DType, arg: &str) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(Error::unsupported(format!(
            "argument '{arg}': gradients of dtype {} are not supported (float32, float64, \
             float16 and bfloat16 are)",
            other.name()
        ))),
    }
}

fn load(src: *const u8, dtype: DType, i: usize) -> f64 {
    // SAFETY (all four arms): the caller guarantees `src` holds `i + 1`
    // elements of `dtype`; unaligned reads keep caller buffers legal.
    unsafe {
        match dtype {
            DType::F32 => (src.cast::<f32>().add(i).read_unaligned()) as f64,
            DType::F64 => src.cast::<f64>().add(i).read_unaligned(),
            DType::F16 => f16_to_f32(src.cast::<u16>().add(i).read_unaligned()) as f64,
            _ => bf16_to_f32(src.cast::<u16>().add(i).read_unaligned()) as f64,
        }
    }
}

fn store(dst: *mut u8, dtype: DType, i: usize, x: f64) {
    // SAFETY: as in `load`. A 16-bit value is rounded from its f32 value:
    // every f16/bf16/f32 source is exact in f32, so this is one rounding.
    unsafe {
        match dtype {
            DType::F32 => dst.cast::<f32>().add(i).write_unaligned(x as f32),
            DType::F64 => dst.cast::<f64>().add(i).write_unaligned(x),
            DType::F16 => dst
                .cast::<u16>()
                .add(i)
                .write_unaligned(f32_to_f16(x as f32)),
            _ => dst
                .cast::<u16>()
                .add(i)
                .write_unaligned(f32_to_bf16(x as f32)),
        }
    }
}

/// Whether [`cast`] converts `from` to `to`: between the gradient dtypes,
/// float64 never to 16 bits.
pub fn check_cast(from: DType, to: DType) -> Result<()> {
    check_grad_dtype(from, "bucket.dtype")?;
    check_grad_dtype(to, "bucket.dtype")?;
    if from == DType::F64 && matches!(to, DType::F16 | DType::BF16) {
        return Err(Error::unsupported(
            "casting float64 gradients to 16 bits is not supported",
        ));
    }
    Ok(())
}

/// Converts `count` elements between floating-point dtypes (round to nearest
/// even, as PyTorch's casts). A float64 source going to a 16-bit dtype is
/// rejected: the two roundings through float32 could differ from a direct one.
///
/// # Safety
/// `src` and `dst` must hold `count` elements of their dtypes.
pub unsafe fn cast(
    src: *const u8,
    from: DType,
    dst: *mut u8,
    to: DType,
    count: usize,
) -> Result<()> {
    check_cast(from, to)?;
    if from == to {
        // SAFETY: both hold `count` elements; `copy` allows overlap.
        unsafe { std::ptr::copy(src, dst, count * from.size()) };
        return Ok(());
    }
    for i in 0..count {
        store(dst, to, i, load(src, from, i));
    }
    Ok(())
}

/// Divides `count` elements in place by `divisor`, in the dtype's precision
/// (16-bit values through float32, rounded once), as PyTorch's `div_`.
///
/// # Safety
/// `buf` must hold `count` elements of `dtype`, aligned for it.
pub unsafe fn divide(buf: *mut u8, dtype: DType, count: usize, divisor: f64) {
    match dtype {
        DType::F32 => {
            // SAFETY: `buf` holds `count` f32, 8-byte aligned storage.
            let s = unsafe { std::slice::from_raw_parts_mut(buf.cast::<f32>(), count) };
            let d = divisor as f32;
            s.iter_mut().for_each(|x| *x /= d);
        }
        DType::F64 => {
            // SAFETY: as above, f64.
            let s = unsafe { std::slice::from_raw_parts_mut(buf.cast::<f64>(), count) };
            s.iter_mut().for_each(|x| *x /= divisor);
        }
        _ => {
            let d = divisor as f32;
            for i in 0..count {
                let x = load(buf, dtype, i) as f32 / d;
                store(buf, dtype, i, x as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bucket_small_then_cap_per_dtype() {
        // Indices 0..6; reverse order 5,4,3,2,1,0.
        let g = [
            (4, DType::F32), // 0: 16 B
            (4, DType::F32), // 1: 16 B
            (2, DType::F16), // 2: 4 B
            (0, DType::F32), // 3: empty
            (2, DType::F32), // 4: 8 B
            (1, DType::F32), // 5: 4 B
        ];
        // f32: 5 (4 B), 4 (12 B >= 10: first bucket closed), 1 (16), 0 (32 >= 20).
        let b = assign(&g, 10, 20);
        assert_eq!(b, vec![vec![5, 4], vec![2], vec![1, 0]]);
        assert_eq!(
            assign(&g, 1 << 20, 1 << 20),
            vec![vec![5, 4, 1, 0], vec![2]]
        );
    }

    #[test]
    fn casts_round_to_nearest_even() {
        let src = [1.0f32 + 1.0 / 4096.0, 65504.0, 1e-8];
        let mut half = [0u16; 3];
        let to_half = unsafe {
            cast(
                src.as_ptr().cast(),
                DType::F32,
                half.as_mut_ptr().cast(),
                DType::F16,
                3,
            )
        };
        to_half.unwrap();
        assert_eq!(half, [0x3c00, 0x7bff, 0x0000]);
        let mut back = [0f32; 3];
        let to_f32 = unsafe {
            cast(
                half.as_ptr().cast(),
                DType::F16,
                back.as_mut_ptr().cast(),
                DType::F32,
                3,
            )
        };
        to_f32.unwrap();
        assert_eq!(back, [1.0, 65504.0, 0.0]);
        let mut v = [3.0f32, 1.0];
        unsafe { divide(v.as_mut_ptr().cast(), DType::F32, 2, 3.0) };
        assert_eq!(v, [1.0, 1.0 / 3.0]);
    }
}
