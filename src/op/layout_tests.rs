//! Unit tests of [`Op::layout`] and of [`for_each_buffer`] over it: each
//! case names the bytes a wrong block offset, total or side would get
//! wrong.

use super::*;
use std::ffi::c_void;

fn p(a: usize) -> Ptr {
    Ptr(a as *mut c_void)
}

fn span(a: usize, bytes: usize) -> Span {
    Span::new(p(a), bytes)
}

/// Every buffer of `op` for `rank` of `size`, as (address, bytes, use).
fn visited(op: &Op, rank: i32, size: i32) -> Vec<(usize, usize, Use)> {
    let mut v = Vec::new();
    op.layout(rank, size)
        .each(|s, u| v.push((s.ptr.0 as usize, s.bytes, u)));
    v
}

#[test]
fn all_gather_single_blocks_are_rank_ordered() {
    // 3 float32 per rank, 4 ranks: 12-byte blocks, rank 2's at 24.
    let op = Op::all_gather_single(p(0x1000), p(0x5000), 3, DType::F32);
    let Layout::Apart { input, output } = op.layout(2, 4) else {
        panic!("all_gather_single is not in place")
    };
    assert_eq!(input, Side::Own(span(0x5000, 12)));
    assert_eq!(output.block(2), Some(span(0x1000 + 24, 12)));
    assert_eq!(output.block(0), Some(span(0x1000, 12)));
    assert_eq!(output.buffer(0), span(0x1000, 48));
    assert_eq!(
        visited(&op, 2, 4),
        [(0x5000, 12, Use::In), (0x1000, 48, Use::Out)]
    );
}

#[test]
fn v_variant_blocks_follow_the_counts() {
    // Counts 1, 2, 3 of int64: rank 2's block is 24 bytes at 24 (not at
    // 2 * 24 as even blocks would put it); the whole is 48 bytes.
    let counts = vec![1, 2, 3];
    let gather = Op::all_gather_v(p(0x1000), p(0x1000 + 24), counts.clone(), DType::I64);
    let l = gather.layout(2, 3);
    assert_eq!(
        l.own_and_block(2),
        Some((span(0x1018, 24), span(0x1018, 24)))
    );
    assert!(
        !l.overlaps_outside_own_block(2),
        "in place at its own block"
    );
    assert_eq!(
        visited(&gather, 1, 3),
        [(0x1018, 16, Use::In), (0x1000, 48, Use::Out)],
        "rank 1 contributes counts[1] elements"
    );
    let scatter = Op::reduce_scatter_v(p(0x9000), p(0x1000), counts, DType::I64, ReduceOp::SUM);
    assert_eq!(
        visited(&scatter, 0, 3),
        [(0x1000, 48, Use::In), (0x9000, 8, Use::Out)]
    );
    let Layout::Apart { input, .. } = scatter.layout(1, 3) else {
        panic!("reduce_scatter_v is not in place")
    };
    assert_eq!(input.block(1), Some(span(0x1008, 16)));
}

#[test]
fn in_place_at_another_block_is_an_overlap() {
    let at = |input| Op::all_gather_single(p(0x1000), p(input), 4, DType::U8);
    assert!(!at(0x1004).layout(1, 3).overlaps_outside_own_block(1));
    assert!(at(0x1004).layout(2, 3).overlaps_outside_own_block(2));
    assert!(at(0x1005).layout(1, 3).overlaps_outside_own_block(1));
    assert!(
        !at(0x100c).layout(1, 3).overlaps_outside_own_block(1),
        "just past the end"
    );
    assert!(
        at(0x100b).layout(1, 3).overlaps_outside_own_block(1),
        "last byte"
    );
    // The scatter side: the output at this rank's block of the input.
    let rs = |output| Op::reduce_scatter_single(p(output), p(0x1000), 2, DType::F32, ReduceOp::SUM);
    assert!(!rs(0x1010).layout(2, 4).overlaps_outside_own_block(2));
    assert!(rs(0x1010).layout(1, 4).overlaps_outside_own_block(1));
    assert!(!rs(0x2000).layout(1, 4).overlaps_outside_own_block(1));
}

#[test]
fn list_forms_are_one_buffer_per_rank() {
    let outputs = vec![p(0x1000), p(0x2000), p(0x3000)];
    let gather = |input| Op::gather(outputs.clone(), p(input), 2, DType::F64, 0);
    assert_eq!(
        visited(&gather(0x8000), 0, 3),
        [
            (0x8000, 16, Use::In),
            (0x1000, 16, Use::Out),
            (0x2000, 16, Use::Out),
            (0x3000, 16, Use::Out)
        ]
    );
    // Rank 1's input as its own output: in place; as rank 2's: not.
    assert!(!gather(0x2000).layout(1, 3).overlaps_outside_own_block(1));
    assert!(gather(0x2000).layout(0, 3).overlaps_outside_own_block(0));
    assert!(gather(0x2008).layout(1, 3).overlaps_outside_own_block(1));
    // Off the root the lists are empty: nothing to visit or overlap.
    let off = Op::scatter(p(0x1000), Vec::new(), 2, DType::F64, 0);
    assert_eq!(visited(&off, 1, 3), [(0x1000, 16, Use::Out)]);
    assert!(!off.layout(1, 3).overlaps_outside_own_block(1));
    assert_eq!(off.layout(1, 3).own_and_block(1), None);
}

#[test]
fn gather_single_output_is_the_roots_only() {
    let op = Op::gather_single(p(0x1000), p(0x1008), 2, DType::F32, 1);
    assert_eq!(
        visited(&op, 1, 2),
        [(0x1008, 8, Use::In), (0x1000, 16, Use::Out)]
    );
    assert!(!op.layout(1, 2).overlaps_outside_own_block(1));
    assert_eq!(visited(&op, 0, 2), [(0x1008, 8, Use::In)]);
    assert!(!op.layout(0, 2).overlaps_outside_own_block(0));
}

#[test]
fn all_to_all_v_sides_have_their_own_totals() {
    let op = |output, output_counts: Vec<usize>| {
        Op::all_to_all_v_single(
            p(output),
            output_counts,
            p(0x1000),
            vec![1, 1, 2],
            DType::I32,
        )
    };
    assert_eq!(
        visited(&op(0x2000, vec![3, 0, 1]), 0, 3),
        [(0x1000, 16, Use::In), (0x2000, 16, Use::Out)]
    );
    assert_eq!(
        visited(&op(0x2000, vec![3, 0, 2]), 0, 3),
        [(0x1000, 16, Use::In), (0x2000, 20, Use::Out)]
    );
    // In place with the same splits; the same address cut otherwise is not.
    assert!(op(0x1000, vec![1, 1, 2])
        .layout(0, 3)
        .same_blocks_in_place());
    assert!(!op(0x1000, vec![2, 1, 1])
        .layout(0, 3)
        .same_blocks_in_place());
    assert!(op(0x1000, vec![2, 1, 1])
        .layout(0, 3)
        .inputs_overlap_outputs());
    // The output just past the input's 16 bytes.
    assert!(!op(0x1010, vec![1, 1, 2])
        .layout(0, 3)
        .inputs_overlap_outputs());
    assert!(op(0x100f, vec![1, 1, 2])
        .layout(0, 3)
        .inputs_overlap_outputs());
}

#[test]
fn single_buffer_ops_and_batches() {
    let all_reduce = Op::all_reduce(p(0x1000), 5, DType::F16, ReduceOp::SUM);
    assert_eq!(visited(&all_reduce, 0, 2), [(0x1000, 10, Use::InOut)]);
    assert_eq!(all_reduce.layout(0, 2).inputs(), [span(0x1000, 10)]);
    let batch = Op::batch(vec![
        P2p {
            is_send: true,
            buf: p(0x1000),
            count: 3,
            dtype: DType::I64,
            peer: 1,
            tag: 0,
            source: None,
        },
        P2p {
            is_send: false,
            buf: p(0x2000),
            count: 2,
            dtype: DType::U8,
            peer: 1,
            tag: 0,
            source: None,
        },
    ]);
    assert_eq!(
        visited(&batch, 0, 2),
        [(0x1000, 24, Use::In), (0x2000, 2, Use::Out)]
    );
    assert_eq!(batch.layout(0, 2).inputs(), [span(0x1000, 24)]);
    assert!(visited(&Op::Barrier, 0, 2).is_empty());
}

/// Every kind of op, with distinct addresses, for the walk below.
fn one_of_each() -> Vec<Op> {
    let (count, dtype) = (2, DType::F32);
    let list = |a: usize| vec![p(a), p(a + 0x100), p(a + 0x200)];
    let sum = || ReduceOp::SUM;
    vec![
        Op::all_gather(list(0x1000), p(0x9000), count, dtype),
        Op::all_gather_v(p(0x1000), p(0x9000), vec![1, 2, 3], dtype),
        Op::reduce_scatter(p(0x1000), list(0x9000), count, dtype, sum()),
        Op::all_to_all(list(0x1000), list(0x9000), count, dtype),
        Op::all_to_all_single(p(0x1000), p(0x9000), count, dtype),
        Op::gather_single(p(0x1000), p(0x9000), count, dtype, 0),
        Op::scatter(p(0x1000), list(0x9000), count, dtype, 1),
        Op::broadcast(p(0x1000), count, dtype, 0),
    ]
}

#[test]
fn for_each_buffer_walks_the_layout_and_rewrites_its_fields() {
    for op in one_of_each() {
        let expected: Vec<(usize, usize, Use)> = visited(&op, 1, 3)
            .into_iter()
            .map(|(a, b, u)| (a + 1, b, u))
            .collect();
        let mut moved = op.clone();
        let mut seen = Vec::new();
        for_each_buffer(&mut moved, 1, 3, &mut |ptr, bytes, u| {
            seen.push((ptr.0 as usize, bytes, u));
            *ptr = Ptr(ptr.as_u8().wrapping_add(1).cast());
            Ok(())
        })
        .unwrap();
        // Each field was moved by one byte, and only the visited ones.
        assert_eq!(visited(&moved, 1, 3), expected, "{}", op.name());
        assert_eq!(seen.len(), expected.len(), "{}", op.name());
    }
    // Off the root, gather_single's (ignored) output is left alone.
    let mut off = Op::gather_single(p(0x1000), p(0x9000), 1, DType::U8, 0);
    for_each_buffer(&mut off, 1, 2, &mut |ptr, _, _| {
        *ptr = p(0);
        Ok(())
    })
    .unwrap();
    let Op::Gather(Gather {
        input,
        kind: GatherKind::GatherSingle { output, .. },
        ..
    }) = off
    else {
        unreachable!()
    };
    assert_eq!((output, input), (p(0x1000), p(0)));
}
