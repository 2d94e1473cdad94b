//! Coalescing of COO entries keyed by linearised index: the local coalesce
//! of one rank's input and the merge of every rank's coalesced entries.
//!
//! Summation order (what decides float results bit for bit): duplicates
//! inside one rank are summed in the order they appear in its input (a
//! stable sort); the per-rank sums are then summed across ranks in rank
//! order, `((r0 + r1) + r2) + ...`. Float16 and bfloat16 are summed in
//! float32 and rounded to their type once per stage (once after the local
//! coalesce, once after the merge); integers wrap on overflow.

use super::buf::CBuf;
use crate::error::{Error, Result};
use crate::kernels::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::types::DType;
use crate::util::{try_filled, try_vec};
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
#[derive(Debug)]
pub struct Coalesced {
    pub keys: Vec<u64>,
    pub values: CBuf,
}

impl Coalesced {
    /// The values followed by the keys (native byte order): one rank's block
    /// of the exchange. The local coalesce leaves room for the keys.
    pub fn into_packed(mut self) -> CBuf {
        let keys = &self.keys;
        self.values.append_with(keys.len() * 8, |dst| unsafe {
            std::ptr::copy_nonoverlapping(keys.as_ptr().cast::<u8>(), dst, keys.len() * 8)
        });
        self.values
    }
}

/// Appends coalesced rows in key order: a key seen once is copied as is; a
/// repeated key is summed in `S::A` and narrowed once.
struct Sink<'a, S: Summand> {
    out: Coalesced,
    row_bytes: usize,
    acc: Vec<S::A>,
    /// The current key's first row, until a second one arrives.
    first: Option<&'a [u8]>,
}

impl<'a, S: Summand> Sink<'a, S> {
    fn new(row: usize, keys: usize, values: CBuf) -> Result<Self> {
        const WHAT: &str = "argument 'input.nnz': the coalesced entries";
        Ok(Sink {
            out: Coalesced {
                keys: try_vec(keys, WHAT)?,
                values,
            },
            row_bytes: row * std::mem::size_of::<S::T>(),
            acc: try_filled(S::ZERO, row, WHAT)?,
            first: None,
        })
    }

    fn push(&mut self, key: u64, src: &'a [u8]) {
        if self.out.keys.last() != Some(&key) {
            self.flush();
            self.out.keys.push(key);
            self.first = Some(src);
            return;
        }
        if let Some(first) = self.first.take() {
            load_row::<S>(&mut self.acc, first, false);
        }
        load_row::<S>(&mut self.acc, src, true);
    }

    fn flush(&mut self) {
        if self.out.keys.is_empty() {
            return;
        }
        match self.first.take() {
            Some(first) => self.out.values.append(first),
            None => {
                let acc = &self.acc;
                self.out.values.append_with(self.row_bytes, |dst| {
                    let dst = dst as *mut S::T;
                    for (j, a) in acc.iter().enumerate() {
                        // SAFETY: room for the row was checked by append_with.
                        unsafe { dst.add(j).write_unaligned(S::narrow(*a)) };
                    }
                });
            }
        }
    }

    fn finish(mut self) -> Coalesced {
        self.flush();
        self.out
    }
}

/// One row of `S::T` from `src` into `acc` (`add`: summed into it).
fn load_row<S: Summand>(acc: &mut [S::A], src: &[u8], add: bool) {
    let src = &src
        [..std::mem::size_of_val(acc) / std::mem::size_of::<S::A>() * std::mem::size_of::<S::T>()];
    let p = src.as_ptr() as *const S::T;
    // SAFETY: `src` holds `acc.len()` elements of `S::T` (sliced above).
    if add {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = S::add(*a, S::widen(unsafe { p.add(j).read_unaligned() }));
        }
    } else {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = S::widen(unsafe { p.add(j).read_unaligned() });
        }
    }
}

fn local<S: Summand>(keys: &[u64], values: &[u8], row: usize) -> Result<Coalesced> {
    let row_bytes = row * std::mem::size_of::<S::T>();
    // Room for the keys too, so that `into_packed` never reallocates.
    let room = values.len() + keys.len() * 8;
    // Only sent, then recycled: a pooled buffer.
    let mut out = CBuf::pooled(room)?;
    if keys.windows(2).all(|w| w[0] < w[1]) {
        // Already coalesced (torch's coalesced tensors): no sort, no sums.
        out.append(values);
        let mut copy = try_vec(keys.len(), "argument 'input.nnz': the entries' keys")?;
        copy.extend_from_slice(keys);
        return Ok(Coalesced {
            keys: copy,
            values: out,
        });
    }
    // Stable: duplicates keep their input order.
    let order = super::radix::stable_order(keys)?;
    let mut sink = Sink::<S>::new(row, keys.len(), out)?;
    for (key, i) in order {
        sink.push(key, &values[i * row_bytes..(i + 1) * row_bytes]);
    }
    Ok(sink.finish())
}

/// K-way merge in key order; equal keys are taken in rank order, so their
/// rows are summed left to right across ranks. The next key is found by a
/// scan of the ranks' heads for few ranks, by a heap for many:
/// O(N log ranks) either way.
fn merge<'a, S: Summand>(ranks: &[Entries<'a>], row: usize) -> Result<Coalesced> {
    let total: usize = ranks.iter().map(|r| r.keys.len()).sum();
    let row_bytes = row * std::mem::size_of::<S::T>();
    // The result, handed to the caller: fresh memory.
    let bytes = total.checked_mul(row_bytes).ok_or_else(|| {
        Error::out_of_memory(
            "argument 'input.nnz': the summed entries",
            total as u128 * row_bytes as u128,
        )
    })?;
    let mut sink = Sink::<'a, S>::new(row, total, CBuf::with_capacity(bytes)?)?;
    let mut next = vec![0usize; ranks.len()];
    // Emits rank r's next entry; returns its following key, if any.
    let emit = |r: usize, next: &mut [usize], sink: &mut Sink<'a, S>| {
        let (e, i) = (&ranks[r], next[r]);
        sink.push(e.keys[i], &e.values[i * row_bytes..(i + 1) * row_bytes]);
        next[r] = i + 1;
        e.keys.get(i + 1).copied()
    };
    if ranks.len() <= 8 {
        loop {
            let head = (0..ranks.len())
                .filter_map(|r| ranks[r].keys.get(next[r]).map(|k| (*k, r)))
                .min();
            let Some((_, r)) = head else { break };
            emit(r, &mut next, &mut sink);
        }
        return Ok(sink.finish());
    }
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = ranks
        .iter()
        .enumerate()
        .filter_map(|(r, e)| e.keys.first().map(|k| Reverse((*k, r))))
        .collect();
    while let Some(Reverse((_, r))) = heap.pop() {
        if let Some(k) = emit(r, &mut next, &mut sink) {
            heap.push(Reverse((k, r)));
        }
    }
    Ok(sink.finish())
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
    dispatch!(dtype, local, keys, values, row)
}

/// Merges every rank's coalesced entries into one coalesced set.
pub fn merge_ranks(dtype: DType, ranks: &[Entries<'_>], row: usize) -> Result<Coalesced> {
    dispatch!(dtype, merge, ranks, row)
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
        assert_eq!(c.values.as_slice(), &[i8::MIN as u8, 3]);
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
