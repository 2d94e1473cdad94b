//! The arithmetic of PowerSGD on row-major float32 matrices: products with
//! a thin factor, Gram-Schmidt on its columns, and the deterministic
//! starting values of Q.
//!
//! Products accumulate in float64 and round once to float32, so a result
//! depends only on its inputs (not on a BLAS's blocking).

/// One gradient viewed as an `rows` x `cols` matrix (row-major, at `offset`
/// elements into the bucket) and approximated with rank `rank`; its P factor
/// is `rows` x `rank` at `p_offset`, its Q factor `cols` x `rank` at
/// `q_offset` (row-major, in the hook's P and Q buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matrix {
    pub grad: usize,
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rank: usize,
    pub p_offset: usize,
    pub q_offset: usize,
}

/// Whether a `rows` x `cols` matrix approximated with rank `rank` is worth
/// compressing: its factors, `min_rate` times over, are still smaller than
/// the matrix (PyTorch's `_should_compress`).
pub fn worth_compressing(rows: usize, cols: usize, rank: usize, min_rate: f64) -> bool {
    ((rows + cols) * rank) as f64 * min_rate < (rows * cols) as f64
}

/// `p = m q`: `m` is rows x cols, `q` cols x rank, `p` rows x rank.
pub fn times_factor(m: &[f32], q: &[f32], p: &mut [f32], rows: usize, cols: usize, rank: usize) {
    let mut acc = vec![0f64; rank];
    for i in 0..rows {
        acc.fill(0.0);
        let row = &m[i * cols..(i + 1) * cols];
        for (j, &x) in row.iter().enumerate() {
            let qj = &q[j * rank..(j + 1) * rank];
            for (a, &y) in acc.iter_mut().zip(qj) {
                *a += x as f64 * y as f64;
            }
        }
        for (out, a) in p[i * rank..(i + 1) * rank].iter_mut().zip(&acc) {
            *out = *a as f32;
        }
    }
}

/// `q = m^T p`: `m` is rows x cols, `p` rows x rank, `q` cols x rank.
/// `scratch` is reused between calls.
pub fn transposed_times_factor(
    m: &[f32],
    p: &[f32],
    q: &mut [f32],
    (rows, cols, rank): (usize, usize, usize),
    scratch: &mut Vec<f64>,
) {
    scratch.clear();
    scratch.resize(cols * rank, 0.0);
    for i in 0..rows {
        let row = &m[i * cols..(i + 1) * cols];
        let pi = &p[i * rank..(i + 1) * rank];
        for (j, &x) in row.iter().enumerate() {
            for (a, &y) in scratch[j * rank..(j + 1) * rank].iter_mut().zip(pi) {
                *a += x as f64 * y as f64;
            }
        }
    }
    for (out, a) in q.iter_mut().zip(scratch.iter()) {
        *out = *a as f32;
    }
}

/// `m = p q^T`: `p` is rows x rank, `q` cols x rank, `m` rows x cols.
pub fn outer_product(p: &[f32], q: &[f32], m: &mut [f32], rows: usize, cols: usize, rank: usize) {
    for i in 0..rows {
        let pi = &p[i * rank..(i + 1) * rank];
        for (j, out) in m[i * cols..(i + 1) * cols].iter_mut().enumerate() {
            let qj = &q[j * rank..(j + 1) * rank];
            let dot: f64 = pi.iter().zip(qj).map(|(&a, &b)| a as f64 * b as f64).sum();
            *out = dot as f32;
        }
    }
}

/// Orthonormalizes the columns of the rows x rank matrix `a` in place by
/// modified Gram-Schmidt, as PyTorch's `_orthogonalize_gram_schmidt`: each
/// column is divided by its norm plus `epsilon`, then its projection is
/// removed from every later column. A zero column with `epsilon` 0 becomes
/// zeros (PyTorch would produce NaNs there).
pub fn orthogonalize(a: &mut [f32], rows: usize, rank: usize, epsilon: f32) {
    for c in 0..rank {
        let norm = (0..rows)
            .map(|i| (a[i * rank + c] as f64).powi(2))
            .sum::<f64>()
            .sqrt() as f32;
        let divisor = norm + epsilon;
        for i in 0..rows {
            let x = &mut a[i * rank + c];
            *x = if divisor == 0.0 { 0.0 } else { *x / divisor };
        }
        for later in c + 1..rank {
            let dot = (0..rows)
                .map(|i| a[i * rank + c] as f64 * a[i * rank + later] as f64)
                .sum::<f64>() as f32;
            for i in 0..rows {
                a[i * rank + later] -= dot * a[i * rank + c];
            }
        }
    }
}

/// SplitMix64: a small generator whose output depends only on its seed.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// About standard normal: the sum of 12 uniforms on [0, 1) minus 6.
    /// Only integer and float additions, so every rank gets the same bits
    /// whatever its math library.
    pub fn next_normal(&mut self) -> f32 {
        let sum: f64 = (0..12)
            .map(|_| (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
            .sum();
        (sum - 6.0) as f32
    }
}

/// The starting Q (cols x rank, before orthogonalization) of gradient
/// `grad` in hook iteration `iteration`: the same on every rank for the
/// same `seed`, different for every gradient and iteration.
pub fn initial_factor(seed: u64, grad: usize, iteration: u64, out: &mut [f32]) {
    let mut keys = SplitMix(seed);
    let base = keys.next_u64() ^ (grad as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut gen = SplitMix(base ^ iteration.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7));
    out.iter_mut().for_each(|x| *x = gen.next_normal());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonalize_gives_orthonormal_columns() {
        let (rows, rank) = (7, 3);
        let mut a = vec![0f32; rows * rank];
        initial_factor(5, 1, 2, &mut a);
        orthogonalize(&mut a, rows, rank, 0.0);
        for c in 0..rank {
            for d in 0..rank {
                let dot: f32 = (0..rows).map(|i| a[i * rank + c] * a[i * rank + d]).sum();
                let want = if c == d { 1.0 } else { 0.0 };
                assert!((dot - want).abs() < 1e-5, "columns {c},{d}: {dot}");
            }
        }
    }

    #[test]
    fn products_agree_with_each_other() {
        // m = p q^T, then m q = p (q^T q) and m^T p = q (p^T p).
        let (rows, cols, rank) = (5, 4, 2);
        let (mut p, mut q) = (vec![0f32; rows * rank], vec![0f32; cols * rank]);
        initial_factor(1, 0, 0, &mut p);
        initial_factor(1, 1, 0, &mut q);
        orthogonalize(&mut q, cols, rank, 0.0);
        let mut m = vec![0f32; rows * cols];
        outer_product(&p, &q, &mut m, rows, cols, rank);
        let mut back = vec![0f32; rows * rank];
        times_factor(&m, &q, &mut back, rows, cols, rank);
        for (x, y) in back.iter().zip(&p) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
        orthogonalize(&mut p, rows, rank, 0.0);
        outer_product(&p, &q, &mut m, rows, cols, rank);
        let mut q2 = vec![0f32; cols * rank];
        transposed_times_factor(&m, &p, &mut q2, (rows, cols, rank), &mut Vec::new());
        for (x, y) in q2.iter().zip(&q) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }

    #[test]
    fn zero_column_without_epsilon_becomes_zeros() {
        let mut a = vec![0f32; 6];
        orthogonalize(&mut a, 3, 2, 0.0);
        assert!(a.iter().all(|x| *x == 0.0));
    }

    #[test]
    fn compression_rule_matches_torch() {
        // (n + m) r rate < n m
        assert!(worth_compressing(64, 64, 1, 2.0));
        assert!(!worth_compressing(4, 4, 1, 2.0));
        assert!(!worth_compressing(100, 1, 1, 2.0));
        assert!(worth_compressing(100, 1, 1, 0.5));
    }
}
