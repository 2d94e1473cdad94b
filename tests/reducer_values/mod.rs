//! Gradient values for the reducer tests whose hook results are exact in
//! every dtype, and their reference after the built-in all-reduce.

/// World size times a multiple of 1/8 in [-1, 1].
pub fn value(world: usize, rank: usize, grad: usize, elem: usize, iter: usize) -> f32 {
    let k = ((rank * 7 + grad * 11 + elem * 3 + iter * 5) % 17) as f32 - 8.0;
    world as f32 * k / 8.0
}

/// Every rank's value divided by the world size, summed.
pub fn reference(world: usize, grad: usize, elem: usize, iter: usize) -> f32 {
    (0..world)
        .map(|r| value(world, r, grad, elem, iter) / world as f32)
        .sum()
}
