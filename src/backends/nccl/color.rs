//! The color NCCL's split is called with, derived from the rank list every
//! member of the new comm passes.

/// The color of a native split: the same for every rank passing the same
/// list (ranks that pass different lists get different colors, which the
/// backend then reports), never NCCL_SPLIT_NOCOLOR (negative).
pub(super) fn split_color(ranks: &[i32]) -> i32 {
    // FNV-1a over the list, in the order given (it also fixes the new ranks).
    let mut h: u32 = 0x811c_9dc5;
    for r in ranks {
        for b in r.to_le_bytes() {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
    }
    (h & 0x7fff_ffff) as i32
}

#[cfg(test)]
mod tests {
    use super::split_color;

    #[test]
    fn split_colors_are_non_negative_and_tell_lists_apart() {
        let lists: [&[i32]; 6] = [&[0], &[1], &[0, 1], &[1, 0], &[0, 2, 4, 6], &[1, 3, 5, 7]];
        let colors: Vec<i32> = lists.iter().map(|l| split_color(l)).collect();
        assert!(colors.iter().all(|c| *c >= 0), "{colors:?}");
        let distinct: std::collections::HashSet<i32> = colors.iter().copied().collect();
        assert_eq!(distinct.len(), lists.len(), "{colors:?}");
        assert_eq!(
            split_color(&[0, 2, 4, 6]),
            colors[4],
            "same list, same color"
        );
    }
}
