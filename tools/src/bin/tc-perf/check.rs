//! Checking results: the data each rank sends (exact in every dtype), the
//! value every output element must hold, and the comparison per dtype.

use crate::case::Case;
use crate::coll::Coll;
use crate::die;
use torchcomm::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use torchcomm::{DType, RedKind};

unsafe fn put(dt: DType, p: *mut u8, i: usize, v: f64) {
    match dt {
        DType::F32 => *(p as *mut f32).add(i) = v as f32,
        DType::F64 => *(p as *mut f64).add(i) = v,
        DType::F16 => *(p as *mut u16).add(i) = f32_to_f16(v as f32),
        DType::BF16 => *(p as *mut u16).add(i) = f32_to_bf16(v as f32),
        DType::I8 => *(p as *mut i8).add(i) = v as i8,
        DType::U8 => *p.add(i) = v as u8,
        DType::I32 => *(p as *mut i32).add(i) = v as i32,
        DType::U32 => *(p as *mut u32).add(i) = v as u32,
        DType::I64 => *(p as *mut i64).add(i) = v as i64,
        DType::U64 => *(p as *mut u64).add(i) = v as u64,
        _ => unreachable!("dtype not benchmarked"),
    }
}

unsafe fn get(dt: DType, p: *const u8, i: usize) -> f64 {
    match dt {
        DType::F32 => *(p as *const f32).add(i) as f64,
        DType::F64 => *(p as *const f64).add(i),
        DType::F16 => f16_to_f32(*(p as *const u16).add(i)) as f64,
        DType::BF16 => bf16_to_f32(*(p as *const u16).add(i)) as f64,
        DType::I8 => *(p as *const i8).add(i) as f64,
        DType::U8 => *p.add(i) as f64,
        DType::I32 => *(p as *const i32).add(i) as f64,
        DType::U32 => *(p as *const u32).add(i) as f64,
        DType::I64 => *(p as *const i64).add(i) as f64,
        DType::U64 => *(p as *const u64).add(i) as f64,
        _ => unreachable!("dtype not benchmarked"),
    }
}

/// Element `i` of rank `r`'s input for a check run with `seed`: small
/// non-zero integers, exact in every dtype and after reduction over the
/// ranks (1..=2 for products so that they stay small).
pub(crate) fn value(r: usize, i: usize, seed: usize, red: RedKind) -> f64 {
    // A mixing hash, so that no pattern of ranks, offsets and blocks lines
    // up with another rank's data.
    let mut x = (r as u64) << 48 ^ (seed as u64) << 32 ^ i as u64;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    let h = x as usize;
    if red == RedKind::Product {
        (1 + h % 2) as f64
    } else {
        (1 + h % 5) as f64
    }
}

fn reduce_values(red: RedKind, vals: impl Iterator<Item = f64>, n: usize) -> f64 {
    let mut it = vals;
    let first = it.next().unwrap();
    let acc = it.fold(first, |a, b| match red {
        RedKind::Sum | RedKind::Avg => a + b,
        RedKind::Product => a * b,
        RedKind::Min => a.min(b),
        RedKind::Max => a.max(b),
        _ => unreachable!(),
    });
    if red == RedKind::Avg {
        acc / n as f64
    } else {
        acc
    }
}

fn matches(dt: DType, red: RedKind, got: f64, want: f64) -> bool {
    let want = match dt {
        // Round the expectation into the dtype first.
        DType::F16 => f16_to_f32(f32_to_f16(want as f32)) as f64,
        DType::BF16 => bf16_to_f32(f32_to_bf16(want as f32)) as f64,
        DType::F32 => want as f32 as f64,
        _ => want,
    };
    if dt.is_floating() {
        let tol = match dt {
            DType::F16 | DType::BF16 => 1e-2,
            DType::F32 => 1e-6,
            _ => 1e-12,
        };
        (got - want).abs() <= tol * want.abs().max(1.0)
    } else if red == RedKind::Avg {
        // Integer averages may truncate or round.
        (got - want).abs() < 1.0
    } else {
        got == want
    }
}

impl Case {
    /// Fills this rank's input with fresh data and the rest of the output
    /// with a non-zero sentinel.
    pub(crate) fn fill(&mut self, seed: usize) {
        let dt = self.dt;
        let es = dt.size();
        let sentinel = 9.0;
        if !self.in_place {
            let out_elems = self.output.0.len() * 8 / es;
            let o = self.output.ptr();
            for i in 0..out_elems {
                unsafe { put(dt, o, i, sentinel) };
            }
        } else {
            let all = self.input.0.len() * 8 / es;
            let b = self.input.ptr();
            for i in 0..all {
                unsafe { put(dt, b, i, sentinel) };
            }
        }
        let (inp, _) = self.ptrs();
        for i in 0..self.in_elems() {
            let v = self.v(self.rank, i, seed);
            unsafe { put(dt, inp, i, v) };
        }
        self.upload()
            .unwrap_or_else(|e| die("copying the input to the device", e));
    }

    /// Number of wrong elements of this rank's result.
    pub(crate) fn check(&mut self, seed: usize) -> u64 {
        self.download()
            .unwrap_or_else(|e| die("copying the result from the device", e));
        let (dt, red) = (self.dt, self.red);
        let (_, out) = self.ptrs();
        let out = out as *const u8;
        let mut wrong = 0u64;
        self.for_each_expected(seed, |i, want| {
            let got = unsafe { get(dt, out, i) };
            if !matches(dt, red, got, want) {
                wrong += 1;
            }
        });
        wrong
    }

    /// Calls `expect(i, want)` for every output element `i` this rank must
    /// hold after the operation, with its expected value.
    fn for_each_expected(&self, seed: usize, mut expect: impl FnMut(usize, f64)) {
        let (n, me, c, root, red) = (self.n, self.rank, self.count, self.root, self.red);
        match self.coll {
            Coll::AllReduce => {
                for i in 0..c {
                    expect(i, reduce_values(red, (0..n).map(|r| self.v(r, i, seed)), n));
                }
            }
            Coll::Reduce => {
                if me == root {
                    for i in 0..c {
                        expect(i, reduce_values(red, (0..n).map(|r| self.v(r, i, seed)), n));
                    }
                }
            }
            Coll::Broadcast => {
                for i in 0..c {
                    expect(i, self.v(root, i, seed));
                }
            }
            Coll::AllGather => {
                for r in 0..n {
                    for j in 0..c {
                        expect(r * c + j, self.v(r, j, seed));
                    }
                }
            }
            Coll::Gather => {
                if me == root {
                    for r in 0..n {
                        for j in 0..c {
                            expect(r * c + j, self.v(r, j, seed));
                        }
                    }
                }
            }
            Coll::ReduceScatter => {
                for j in 0..c {
                    expect(
                        j,
                        reduce_values(red, (0..n).map(|r| self.v(r, me * c + j, seed)), n),
                    );
                }
            }
            Coll::Scatter => {
                for j in 0..c {
                    expect(j, self.v(root, me * c + j, seed));
                }
            }
            Coll::AllToAll => {
                for s in 0..n {
                    for j in 0..c {
                        expect(s * c + j, self.v(s, me * c + j, seed));
                    }
                }
            }
            Coll::SendRecv => {
                let prev = (me + n - 1) % n;
                for j in 0..c {
                    expect(j, self.v(prev, j, seed));
                }
            }
            Coll::Barrier => {}
        }
    }
}
