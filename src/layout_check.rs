//! Agreement of a buffer list across ranks, for calls whose ranks must pass
//! the same list (`tc_broadcast_coalesced`, `tc_reducer_new`).
//!
//! The common case costs one 16-byte all-reduce: MAX over `[digest, !digest]`
//! gives every rank the largest and the smallest digest at once. Only when
//! they differ do the ranks exchange their lists, so that every rank can name
//! the first difference between the reference rank and the lowest rank that
//! differs from it.

use crate::comm::{Comm, Op, Ptr};
use crate::device_ops::host_collective;
use crate::error::{Error, Result};
use crate::types::{DType, RedKind, ReduceOp};
use std::ffi::c_void;
use std::sync::Arc;

/// What every rank must agree on: named scalars (root, byte limits) and the
/// list of (count, dtype) entries.
pub struct Layout<'a> {
    pub scalars: &'a [(&'a str, u64)],
    pub entries: Vec<(usize, DType)>,
}

fn fnv1a(words: impl Iterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

impl Layout<'_> {
    /// The layout as words: scalars, the entry count, then (count, dtype) pairs.
    fn words(&self) -> Vec<u64> {
        let mut w: Vec<u64> = self.scalars.iter().map(|&(_, v)| v).collect();
        w.push(self.entries.len() as u64);
        for &(count, dtype) in &self.entries {
            w.push(count as u64);
            w.push(dtype.to_c() as u64);
        }
        w
    }
}

/// The exchanges are small and blocking; on a device comm they go through
/// device scratch memory on the caller's `stream` (see [`host_collective`]).
fn blocking(comm: &Arc<Comm>, stream: *mut c_void, op: Op) -> Result<()> {
    host_collective(comm, op, stream)
}

fn ptr<T>(v: &mut [T]) -> Ptr {
    Ptr(v.as_mut_ptr().cast())
}

/// Collective: returns Ok on every rank when every rank passed the same
/// layout, else an `InvalidUsage` error on every rank naming the first
/// difference between `reference` and the lowest rank that differs from it.
/// On a device comm the exchanges are ordered on `stream` (the caller's).
pub fn agree(
    comm: &Arc<Comm>,
    what: &str,
    reference: i32,
    layout: &Layout,
    stream: *mut c_void,
) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let words = layout.words();
    let digest = fnv1a(words.iter().copied());
    let mut pair = [digest, !digest];
    blocking(
        comm,
        stream,
        Op::all_reduce(
            ptr(&mut pair),
            2,
            DType::U64,
            ReduceOp {
                kind: RedKind::Max,
                ..ReduceOp::SUM
            },
        ),
    )?;
    if pair[0] == !pair[1] {
        return Ok(());
    }
    let mut digests = vec![0u64; comm.size() as usize];
    blocking(
        comm,
        stream,
        Op::all_gather_single(
            ptr(&mut digests),
            Ptr((&digest as *const u64).cast_mut().cast()),
            1,
            DType::U64,
        ),
    )?;
    let other = digests
        .iter()
        .position(|&d| d != digests[reference as usize])
        .unwrap_or(0) as i32;
    let theirs = share_words(comm, stream, reference, &words)?;
    let others = share_words(comm, stream, other, &words)?;
    Err(Error::invalid_usage(format!(
        "{what}: ranks passed different lists: {}",
        first_difference(layout, (reference, &theirs), (other, &others))
    )))
}

/// Broadcasts `root`'s words (its length first).
fn share_words(comm: &Arc<Comm>, stream: *mut c_void, root: i32, mine: &[u64]) -> Result<Vec<u64>> {
    let mut len = [mine.len() as u64];
    blocking(
        comm,
        stream,
        Op::broadcast(ptr(&mut len), 1, DType::U64, root),
    )?;
    let mut words = if comm.rank() == root {
        mine.to_vec()
    } else {
        vec![0u64; len[0] as usize]
    };
    blocking(
        comm,
        stream,
        Op::broadcast(ptr(&mut words), words.len(), DType::U64, root),
    )?;
    Ok(words)
}

fn describe_entry(words: &[u64], at: usize) -> String {
    let dtype = DType::from_c(words[at + 1] as i32, "dtype")
        .map(|d| d.name().to_string())
        .unwrap_or_else(|_| format!("dtype {}", words[at + 1]));
    format!("{} elements of {dtype}", words[at])
}

/// "entry 3: rank 0 has 10 elements of float32, rank 2 has 12 ...".
pub fn first_difference(layout: &Layout, a: (i32, &[u64]), b: (i32, &[u64])) -> String {
    let ((ra, wa), (rb, wb)) = (a, b);
    let s = layout.scalars.len();
    for (i, &(name, _)) in layout.scalars.iter().enumerate() {
        if wa.get(i) != wb.get(i) {
            return format!(
                "{name} is {} on rank {ra} but {} on rank {rb}",
                wa.get(i).copied().unwrap_or(0),
                wb.get(i).copied().unwrap_or(0)
            );
        }
    }
    let (na, nb) = (wa.get(s).copied(), wb.get(s).copied());
    let n = na.unwrap_or(0).min(nb.unwrap_or(0)) as usize;
    for i in 0..n {
        let at = s + 1 + 2 * i;
        if wa.get(at..at + 2) != wb.get(at..at + 2) {
            return format!(
                "entry {i}: rank {ra} has {}, rank {rb} has {}",
                describe_entry(wa, at),
                describe_entry(wb, at)
            );
        }
    }
    format!(
        "rank {ra} passed {} entries, rank {rb} passed {}",
        na.unwrap_or(0),
        nb.unwrap_or(0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_names_the_entry() {
        let scalars = [("root", 0u64)];
        let a = Layout {
            scalars: &scalars,
            entries: vec![(4, DType::F32), (10, DType::F16)],
        };
        let b = Layout {
            scalars: &scalars,
            entries: vec![(4, DType::F32), (12, DType::F16)],
        };
        let msg = first_difference(&a, (0, &a.words()), (2, &b.words()));
        assert_eq!(
            msg,
            "entry 1: rank 0 has 10 elements of float16, rank 2 has 12 elements of float16"
        );
        let c = Layout {
            scalars: &scalars,
            entries: vec![(4, DType::F32)],
        };
        let msg = first_difference(&a, (0, &a.words()), (1, &c.words()));
        assert_eq!(msg, "rank 0 passed 2 entries, rank 1 passed 1");
        let other = [("root", 1u64)];
        let d = Layout {
            scalars: &other,
            entries: vec![],
        };
        let msg = first_difference(&a, (0, &a.words()), (3, &d.words()));
        assert_eq!(msg, "root is 0 on rank 0 but 1 on rank 3");
        assert_ne!(fnv1a(a.words().into_iter()), fnv1a(b.words().into_iter()));
    }
}
