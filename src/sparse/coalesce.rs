//! Coalescing of COO entries keyed by linearised index: the local coalesce
//! of one rank's input and the merge of every rank's coalesced entries.
//!
//! Summation order (what decides float results bit for bit): duplicates
//! inside one rank are summed in the order they appear in its input (a
//! stable sort); the per-rank sums are then summed across ranks in rank
//! order, `((r0 + r1) + r2) + ...`. Float16 and bfloat16 are summed in
//! float32 and rounded to their type once per stage (once after the local
//! coalesce, once after the merge); integers wrap on overflow.

use crate::backends::gloo::reduce::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::error::{Error, Result};
use crate::types::DType;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// An element type and the type its sums are accumulated in.
trait Summand {
    type T: Copy;
    type A: Copy;
    const ZERO: Self::A;
    fn widen(t: Self::T) -> Self::A;
    fn add(a: Self::A, b: Self::A) -> Self::A;
    fn narrow(a: Self::A) -> Self::T;
}

macro_rules! exact_float {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Summand for $name {
            type T = $t;
            type A = $t;
            const ZERO: $t = 0.0;
            fn widen(t: $t) -> $t {
                t
            }
            fn add(a: $t, b: $t) -> $t {
                a + b
            }
            fn narrow(a: $t) -> $t {
                a
            }
        }
    };
}
exact_float!(F32, f32);
exact_float!(F64, f64);

macro_rules! wrapping_int {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Summand for $name {
            type T = $t;
            type A = $t;
            const ZERO: $t = 0;
            fn widen(t: $t) -> $t {
                t
            }
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            fn narrow(a: $t) -> $t {
                a
            }
        }
    };
}
wrapping_int!(I8, i8);
wrapping_int!(U8, u8);
wrapping_int!(I32, i32);
wrapping_int!(I64, i64);
wrapping_int!(U32, u32);
wrapping_int!(U64, u64);

macro_rules! half_float {
    ($name:ident, $to:ident, $from:ident) => {
        struct $name;
        impl Summand for $name {
            type T = u16;
            type A = f32;
            const ZERO: f32 = 0.0;
            fn widen(t: u16) -> f32 {
                $to(t)
            }
            fn add(a: f32, b: f32) -> f32 {
                a + b
            }
            fn narrow(a: f32) -> u16 {
                $from(a)
            }
        }
    };
}
half_float!(F16, f16_to_f32, f32_to_f16);
half_float!(BF16, bf16_to_f32, f32_to_bf16);

/// Refuses dtypes a sum is not defined on here (bool, float8).
pub fn check_dtype(dtype: DType) -> Result<()> {
    match dtype {
        DType::Bool | DType::F8E4M3 | DType::F8E5M2 => Err(Error::unsupported(format!(
            "sparse_all_reduce does not sum {} values",
            dtype.name()
        ))),
        _ => Ok(()),
    }
}

/// One rank's entries: sorted unique keys and `row` elements per key.
pub struct Entries<'a> {
    pub keys: &'a [u64],
    pub values: &'a [u8],
}

/// Sorted unique keys with their summed rows (`values` holds
/// `keys.len() * row` elements as bytes).
#[derive(Debug, Default)]
pub struct Coalesced {
    pub keys: Vec<u64>,
    pub values: Vec<u8>,
}

/// Row `i` of `row` elements of `S::T` read from `bytes` into `acc`
/// (`add`: summed into it, else overwriting it).
fn load_row<S: Summand>(acc: &mut [S::A], bytes: &[u8], i: usize, add: bool) {
    let size = std::mem::size_of::<S::T>();
    let start = i * acc.len() * size;
    let src = &bytes[start..start + acc.len() * size];
    for (j, a) in acc.iter_mut().enumerate() {
        // SAFETY: the slice above holds `acc.len()` elements of `S::T`.
        let t = unsafe { (src.as_ptr() as *const S::T).add(j).read_unaligned() };
        *a = if add {
            S::add(*a, S::widen(t))
        } else {
            S::widen(t)
        };
    }
}

fn store_row<S: Summand>(out: &mut Vec<u8>, acc: &[S::A]) {
    let size = std::mem::size_of::<S::T>();
    let start = out.len();
    out.resize(start + acc.len() * size, 0);
    let dst = out[start..].as_mut_ptr() as *mut S::T;
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: `dst` has room for `acc.len()` elements of `S::T`.
        unsafe { dst.add(j).write_unaligned(S::narrow(*a)) };
    }
}

/// Sums the rows of equal keys, visiting entries in `order` (whose keys are
/// nondecreasing).
fn fold_sorted<S: Summand>(
    keys: &[u64],
    values: &[u8],
    row: usize,
    order: impl Iterator<Item = usize>,
) -> Coalesced {
    // Room for the keys too, so that `into_packed` never reallocates.
    let mut out = Coalesced {
        keys: Vec::new(),
        values: Vec::with_capacity(keys.len() * (row * std::mem::size_of::<S::T>() + 8)),
    };
    let mut acc: Vec<S::A> = vec![S::ZERO; row];
    for i in order {
        let key = keys[i];
        if out.keys.last() == Some(&key) {
            load_row::<S>(&mut acc, values, i, true);
            continue;
        }
        if !out.keys.is_empty() {
            store_row::<S>(&mut out.values, &acc);
        }
        out.keys.push(key);
        load_row::<S>(&mut acc, values, i, false);
    }
    if !out.keys.is_empty() {
        store_row::<S>(&mut out.values, &acc);
    }
    out
}

fn local<S: Summand>(keys: &[u64], values: &[u8], row: usize) -> Coalesced {
    if keys.windows(2).all(|w| w[0] < w[1]) {
        // Already coalesced (torch's coalesced tensors): no sort, no sums.
        let mut packed = Vec::with_capacity(values.len() + keys.len() * 8);
        packed.extend_from_slice(values);
        return Coalesced {
            keys: keys.to_vec(),
            values: packed,
        };
    }
    let mut order: Vec<usize> = (0..keys.len()).collect();
    // Stable: duplicates keep their input order, so their sum is defined.
    order.sort_by_key(|&i| keys[i]);
    fold_sorted::<S>(keys, values, row, order.into_iter())
}

impl Coalesced {
    /// The values followed by the keys (native byte order): one rank's block
    /// of the exchange.
    pub fn into_packed(mut self) -> Vec<u8> {
        self.values.reserve_exact(self.keys.len() * 8);
        for k in &self.keys {
            self.values.extend_from_slice(&k.to_ne_bytes());
        }
        self.values
    }
}

/// K-way merge in key order; equal keys are taken in rank order, so their
/// rows are summed left to right across ranks.
fn merge<S: Summand>(ranks: &[Entries<'_>], row: usize) -> Coalesced {
    let total: usize = ranks.iter().map(|r| r.keys.len()).sum();
    let mut out = Coalesced {
        keys: Vec::with_capacity(total),
        values: Vec::with_capacity(total * row * std::mem::size_of::<S::T>()),
    };
    let mut acc: Vec<S::A> = vec![S::ZERO; row];
    let mut next = vec![0usize; ranks.len()];
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = ranks
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.keys.is_empty())
        .map(|(i, r)| Reverse((r.keys[0], i)))
        .collect();
    while let Some(Reverse((key, r))) = heap.pop() {
        let i = next[r];
        let add = out.keys.last() == Some(&key);
        if !add {
            if !out.keys.is_empty() {
                store_row::<S>(&mut out.values, &acc);
            }
            out.keys.push(key);
        }
        load_row::<S>(&mut acc, ranks[r].values, i, add);
        next[r] = i + 1;
        if let Some(&k) = ranks[r].keys.get(i + 1) {
            heap.push(Reverse((k, r)));
        }
    }
    if !out.keys.is_empty() {
        store_row::<S>(&mut out.values, &acc);
    }
    out
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DType::F32 => $f::<F32>($($arg),*),
            DType::F64 => $f::<F64>($($arg),*),
            DType::F16 => $f::<F16>($($arg),*),
            DType::BF16 => $f::<BF16>($($arg),*),
            DType::I8 => $f::<I8>($($arg),*),
            DType::U8 => $f::<U8>($($arg),*),
            DType::I32 => $f::<I32>($($arg),*),
            DType::I64 => $f::<I64>($($arg),*),
            DType::U32 => $f::<U32>($($arg),*),
            DType::U64 => $f::<U64>($($arg),*),
            DType::Bool | DType::F8E4M3 | DType::F8E5M2 => {
                return Err(check_dtype($dtype).unwrap_err())
            }
        }
    };
}

/// Coalesces one rank's entries (`values`: `keys.len() * row` elements of
/// `dtype`), summing duplicates in input order.
pub fn coalesce_local(dtype: DType, keys: &[u64], values: &[u8], row: usize) -> Result<Coalesced> {
    Ok(dispatch!(dtype, local, keys, values, row))
}

/// Merges every rank's coalesced entries into one coalesced set.
pub fn merge_ranks(dtype: DType, ranks: &[Entries<'_>], row: usize) -> Result<Coalesced> {
    Ok(dispatch!(dtype, merge, ranks, row))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }
    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn local_sums_duplicates_in_input_order() {
        // (1e8 + 1) - 1e8 is 0 in float32; any other order gives 1.
        let keys = [5, 3, 5, 5];
        let vals = f32_bytes(&[1e8, 7.0, 1.0, -1e8]);
        let c = coalesce_local(DType::F32, &keys, &vals, 1).unwrap();
        assert_eq!(c.keys, vec![3, 5]);
        assert_eq!(f32s(&c.values), vec![7.0, 0.0]);
    }

    #[test]
    fn merge_sums_across_ranks_in_rank_order() {
        let a = f32_bytes(&[1e8, 1.0]);
        let b = f32_bytes(&[1.0, 2.0]);
        let c = f32_bytes(&[-1e8]);
        let ranks = [
            Entries {
                keys: &[2, 9],
                values: &a,
            },
            Entries {
                keys: &[2, 4],
                values: &b,
            },
            Entries {
                keys: &[2],
                values: &c,
            },
        ];
        let m = merge_ranks(DType::F32, &ranks, 1).unwrap();
        assert_eq!(m.keys, vec![2, 4, 9]);
        assert_eq!(f32s(&m.values), vec![0.0, 2.0, 1.0]);
    }

    #[test]
    fn integers_wrap_and_rows_stay_whole() {
        let keys = [1, 1];
        let vals: Vec<u8> = [i8::MAX, 1, 1, 2].iter().map(|x| *x as u8).collect();
        let c = coalesce_local(DType::I8, &keys, &vals, 2).unwrap();
        assert_eq!(c.keys, vec![1]);
        assert_eq!(c.values, vec![i8::MIN as u8, 3]);
    }

    #[test]
    fn half_sums_in_f32_and_round_once() {
        // 2048 + 1 + 1 in float16 step by step stays 2048; in f32, 2050.
        let h = |x: f32| f32_to_f16(x).to_ne_bytes();
        let vals: Vec<u8> = [h(2048.0), h(1.0), h(1.0)].concat();
        let c = coalesce_local(DType::F16, &[0, 0, 0], &vals, 1).unwrap();
        assert_eq!(
            f16_to_f32(u16::from_ne_bytes([c.values[0], c.values[1]])),
            2050.0
        );
    }

    #[test]
    fn bool_is_refused() {
        assert!(coalesce_local(DType::Bool, &[], &[], 1).is_err());
    }
}
