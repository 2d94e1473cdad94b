//! Stable ordering of linearised keys for the local coalesce: an LSD radix
//! sort over only the key bits in use (a 1,000,000-row table needs two
//! 11-bit passes), O(n) where a comparison sort of the same pairs is
//! O(n log n) with far more branches. Stability is what keeps duplicates of
//! one key in input order, which decides the float sums bit for bit.

use crate::error::Result;
use crate::util::{try_filled, try_vec};

/// Bits sorted per pass: 2048 counters stay in the L1 cache.
const DIGIT_BITS: u32 = 11;
const BUCKETS: usize = 1 << DIGIT_BITS;
/// Below this many keys a comparison sort is as fast and allocates less.
const SMALL: usize = 256;

/// `(key, input position)` in ascending key order, equal keys in input
/// order; `TC_ERR_OUT_OF_MEMORY` when there is no room for two copies.
pub fn stable_order(keys: &[u64]) -> Result<Vec<(u64, usize)>> {
    const WHAT: &str = "argument 'input.nnz': sorting the entries";
    let mut order = try_vec(keys.len(), WHAT)?;
    order.extend(keys.iter().copied().zip(0..));
    if keys.len() < SMALL {
        // (key, position) pairs are unique: unstable on pairs is stable on keys.
        order.sort_unstable();
        return Ok(order);
    }
    let max = keys.iter().copied().max().unwrap_or(0);
    let passes = (u64::BITS - max.leading_zeros()).div_ceil(DIGIT_BITS);
    let counts = histograms(keys, passes);
    let mut spare = try_filled((0u64, 0usize), keys.len(), WHAT)?;
    for (pass, count) in counts.iter().enumerate() {
        // A digit every key shares leaves the order as it is.
        if count.contains(&keys.len()) {
            continue;
        }
        scatter(&order, &mut spare, count, pass as u32 * DIGIT_BITS);
        std::mem::swap(&mut order, &mut spare);
    }
    Ok(order)
}

/// One histogram of digit values per pass, from a single read of the keys.
fn histograms(keys: &[u64], passes: u32) -> Vec<[usize; BUCKETS]> {
    let mut counts = vec![[0usize; BUCKETS]; passes as usize];
    for key in keys {
        for (pass, count) in counts.iter_mut().enumerate() {
            count[digit(*key, pass as u32 * DIGIT_BITS)] += 1;
        }
    }
    counts
}

fn digit(key: u64, shift: u32) -> usize {
    ((key >> shift) as usize) & (BUCKETS - 1)
}

/// Moves `from` into `to` by the digit at `shift`, keeping the order of
/// equal digits (what makes the whole sort stable).
fn scatter(from: &[(u64, usize)], to: &mut [(u64, usize)], count: &[usize; BUCKETS], shift: u32) {
    let mut next = [0usize; BUCKETS];
    let mut at = 0;
    for (n, c) in next.iter_mut().zip(count) {
        *n = at;
        at += c;
    }
    for pair in from {
        let d = digit(pair.0, shift);
        to[next[d]] = *pair;
        next[d] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), enough for shuffles.
    fn pseudo_random(n: usize, modulus: u64, mut s: u64) -> Vec<u64> {
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s % modulus
            })
            .collect()
    }

    #[test]
    fn matches_a_stable_comparison_sort() {
        for (n, modulus) in [
            (10, 5),
            (1000, 7),
            (5000, 1 << 40),
            (3000, u64::MAX),
            (4096, 1),
        ] {
            let keys = pseudo_random(n, modulus, 0x9e37_79b9_7f4a_7c15 ^ n as u64);
            let mut want: Vec<(u64, usize)> = keys.iter().copied().zip(0..).collect();
            want.sort_by_key(|p| p.0);
            assert_eq!(
                stable_order(&keys).unwrap(),
                want,
                "n {n} modulus {modulus}"
            );
        }
    }

    #[test]
    fn duplicates_keep_input_order() {
        let mut keys = vec![7u64; 600];
        keys.extend(std::iter::repeat_n(3u64, 600));
        let order = stable_order(&keys).unwrap();
        let positions: Vec<usize> = order.iter().map(|p| p.1).collect();
        let want: Vec<usize> = (600..1200).chain(0..600).collect();
        assert_eq!(positions, want);
    }
}
