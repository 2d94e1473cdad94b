//! The mismatch check of the UCX collectives: each rank sends what it
//! called (operation, dtype, count, root, reduce op, a digest of per-rank
//! counts) to its right-hand neighbour in the collective's first step, and
//! compares what its left-hand neighbour called before its first step's
//! receives. Every neighbour pair agreeing means every rank agrees; a pair
//! that differs fails the rank that sees it, which names both calls and
//! tells every rank (the failure notice), so that calls that differ across
//! ranks fail at once instead of hanging to the timeout or combining
//! unrelated data. It travels in the check message (`check.rs`), which
//! carries the first step's message to that neighbour too when there is a
//! small one.

use crate::op::{AllToAll, AllToAllKind, Gather, GatherKind, Reduction, ReductionKind, Scatter};
use crate::op::{Op, OP_NAMES};
use crate::types::{DType, RedKind};

/// What a rank called, as sent: op code, dtype + 1 (0: none), count, root
/// (as i64), reduce op + 1 (0: none), digest of per-rank counts (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Fingerprint([u64; 6]);

/// Its size on the wire.
pub(super) const FINGERPRINT_BYTES: usize = 48;

impl Fingerprint {
    fn new(
        code: u8,
        dtype: Option<DType>,
        (count, root): (usize, i32),
        red: Option<RedKind>,
        counts: Option<&[usize]>,
    ) -> Fingerprint {
        Fingerprint([
            code as u64,
            dtype.map_or(0, |d| d.to_c() as u64 + 1),
            count as u64,
            root as i64 as u64,
            red.map_or(0, |k| k as u64 + 1),
            counts.map_or(0, digest),
        ])
    }

    pub fn of_reduction(r: &Reduction) -> Fingerprint {
        let counts = match &r.kind {
            ReductionKind::ReduceScatterV { counts, .. } => Some(&counts[..]),
            _ => None,
        };
        Fingerprint::new(
            r.code(),
            Some(r.dtype),
            r.count_and_root(),
            Some(r.op.kind),
            counts,
        )
    }

    pub fn of_gather(g: &Gather) -> Fingerprint {
        let counts = match &g.kind {
            GatherKind::AllGatherV { counts, .. } => Some(&counts[..]),
            _ => None,
        };
        Fingerprint::new(g.code(), Some(g.dtype), g.count_and_root(), None, counts)
    }

    pub fn of_scatter(s: &Scatter) -> Fingerprint {
        Fingerprint::new(s.code(), Some(s.dtype), (s.count, s.root), None, None)
    }

    /// The v-variant's counts differ by rank: its own exchange checks
    /// every size.
    pub fn of_all_to_all(a: &AllToAll) -> Fingerprint {
        let count = match &a.kind {
            AllToAllKind::VSingle { .. } => 0,
            _ => a.count(),
        };
        Fingerprint::new(a.code(), Some(a.dtype), (count, -1), None, None)
    }

    pub fn of_barrier() -> Fingerprint {
        Fingerprint::new(Op::Barrier.code(), None, (0, -1), None, None)
    }

    /// Appends its [`FINGERPRINT_BYTES`] bytes (little-endian words).
    pub fn append_to(&self, out: &mut Vec<u8>) {
        for w in &self.0 {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// From the first [`FINGERPRINT_BYTES`] of `b` (missing bytes read as
    /// zero).
    pub fn from_bytes(b: &[u8]) -> Fingerprint {
        let mut w = [0u64; 6];
        for (i, c) in b.chunks_exact(8).take(6).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().unwrap_or_default());
        }
        Fingerprint(w)
    }

    /// The first field (in the order a reader checks a call) that differs.
    pub fn differing_field(&self, other: &Fingerprint) -> &'static str {
        let (a, b) = (&self.0, &other.0);
        if a[0] != b[0] {
            "operation"
        } else if a[1] != b[1] {
            "dtype"
        } else if a[2] != b[2] {
            "count"
        } else if a[5] != b[5] {
            "per-rank counts"
        } else if a[3] != b[3] {
            "root"
        } else {
            "reduce op"
        }
    }

    /// "all_reduce(dtype float32, count 8, op sum)".
    pub fn describe(&self) -> String {
        let w = &self.0;
        let op = OP_NAMES.get(w[0] as usize).copied().unwrap_or("?");
        if w[0] == Op::Barrier.code() as u64 {
            return "barrier()".into();
        }
        let dtype = DType::ALL
            .iter()
            .find(|d| d.to_c() as u64 + 1 == w[1])
            .map_or("?", |d| d.name());
        let root = match w[3] as i64 {
            r if r >= 0 => format!(", root {r}"),
            _ => String::new(),
        };
        let red = match w[4] {
            0 => String::new(),
            k => format!(
                ", op {}",
                RedKind::ALL.get(k as usize - 1).map_or("?", |k| k.name())
            ),
        };
        format!("{op}(dtype {dtype}, count {}{root}{red})", w[2])
    }
}

/// A digest of per-rank counts (FNV-1a over the counts).
fn digest(counts: &[usize]) -> u64 {
    counts
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64 ^ counts.len() as u64, |h, c| {
            (h ^ *c as u64).wrapping_mul(0x0100_0000_01b3)
        })
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Ptr;
    use crate::types::ReduceOp;

    fn all_reduce(count: usize, dtype: DType, op: ReduceOp) -> Fingerprint {
        let buf = Ptr(std::ptr::null_mut());
        Fingerprint::of_reduction(&Reduction {
            dtype,
            op,
            kind: ReductionKind::AllReduce { buf, count },
        })
    }

    #[test]
    fn round_trips_and_names_the_field() {
        let a = all_reduce(8, DType::F32, ReduceOp::SUM);
        let mut bytes = Vec::new();
        a.append_to(&mut bytes);
        assert_eq!(bytes.len(), FINGERPRINT_BYTES);
        bytes.extend_from_slice(&[7; 8]);
        assert_eq!(Fingerprint::from_bytes(&bytes), a);
        assert_eq!(a.describe(), "all_reduce(dtype float32, count 8, op sum)");
        let b = all_reduce(6, DType::F32, ReduceOp::SUM);
        assert_eq!(a.differing_field(&b), "count");
        let c = all_reduce(8, DType::I32, ReduceOp::SUM);
        assert_eq!(a.differing_field(&c), "dtype");
        assert_eq!(a.differing_field(&Fingerprint::of_barrier()), "operation");
        assert_eq!(Fingerprint::of_barrier().describe(), "barrier()");
    }
}
