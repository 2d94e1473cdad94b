//! Unit tests of the operation families: every constructor builds the
//! member whose code (exchanged between ranks by the collective checks, so
//! fixed) and name the C API has, and what a family shares is where
//! `signature`, `elements`, `dtype` and `agreed_counts` read it.

use super::{Op, P2p, Ptr, OP_NAMES};
use crate::types::{DType, ReduceOp};
use std::ffi::c_void;

fn p(a: usize) -> Ptr {
    Ptr(a as *mut c_void)
}

#[test]
fn every_constructor_keeps_its_code_and_name() {
    let (b, f, sum) = (p(8), DType::F32, ReduceOp::SUM);
    let cases = [
        (Op::send(b, 1, f, 1, 0), 0),
        (Op::recv(b, 1, f, 1, 0), 1),
        (Op::batch(Vec::new()), 2),
        (Op::broadcast(b, 1, f, 0), 3),
        (Op::reduce(b, 1, f, 0, sum), 4),
        (Op::all_reduce(b, 1, f, sum), 5),
        (Op::all_gather(vec![b], b, 1, f), 6),
        (Op::all_gather_single(b, b, 1, f), 7),
        (Op::all_gather_v(b, b, vec![1], f), 8),
        (Op::reduce_scatter(b, vec![b], 1, f, sum), 9),
        (Op::reduce_scatter_single(b, b, 1, f, sum), 10),
        (Op::reduce_scatter_v(b, b, vec![1], f, sum), 11),
        (Op::all_to_all(vec![b], vec![b], 1, f), 12),
        (Op::all_to_all_single(b, b, 1, f), 13),
        (Op::all_to_all_v_single(b, vec![1], b, vec![1], f), 14),
        (Op::Barrier, 15),
        (Op::scatter(b, vec![b], 1, f, 0), 16),
        (Op::gather(vec![b], b, 1, f, 0), 17),
        (Op::gather_single(b, b, 1, f, 0), 18),
    ];
    let names = [
        "send",
        "recv",
        "batch_p2p",
        "broadcast",
        "reduce",
        "all_reduce",
        "all_gather",
        "all_gather_single",
        "all_gather_v",
        "reduce_scatter",
        "reduce_scatter_single",
        "reduce_scatter_v",
        "all_to_all",
        "all_to_all_single",
        "all_to_all_v_single",
        "barrier",
        "scatter",
        "gather",
        "gather_single",
    ];
    for ((op, code), name) in cases.iter().zip(names) {
        assert_eq!((op.code(), op.name()), (*code, name), "{op:?}");
        assert_eq!(OP_NAMES[*code as usize], name);
    }
}

#[test]
fn each_family_shares_what_the_signature_reads() {
    let (b, f) = (p(8), DType::I32);
    let max = ReduceOp {
        kind: crate::types::RedKind::Max,
        ..ReduceOp::SUM
    };
    let reduce = Op::reduce(b, 3, f, 1, max);
    assert_eq!(reduce.signature(), Some((Some(f), 3, 1)));
    assert_eq!(reduce.reduce_op().map(|r| r.kind), Some(max.kind));
    // A scatter family member: dtype, per-rank count and root shared.
    let bcast = Op::broadcast(b, 5, f, 2);
    assert_eq!(bcast.signature(), Some((Some(f), 5, 2)));
    assert!(bcast.reduce_op().is_none());
    // The v-variants: the total of the counts, which every rank passes
    // alike; all_to_all_v_single's counts differ between ranks.
    let agv = Op::all_gather_v(b, b, vec![1, 2], f);
    assert_eq!(agv.signature(), Some((Some(f), 3, -1)));
    assert_eq!(agv.agreed_counts(), Some(&[1, 2][..]));
    let rsv = Op::reduce_scatter_v(b, b, vec![4, 0], f, max);
    assert_eq!(rsv.agreed_counts(), Some(&[4, 0][..]));
    let a2av = Op::all_to_all_v_single(b, vec![1, 1], b, vec![2, 5], f);
    assert_eq!(a2av.signature(), Some((Some(f), 0, -1)));
    assert_eq!((a2av.elements(), a2av.agreed_counts()), (7, None));
    let gs = Op::gather_single(b, b, 6, f, 1);
    assert_eq!(gs.signature(), Some((Some(f), 6, 1)));
    // Point-to-point: no signature; a batch mixing dtypes has no dtype.
    let member = |dtype, count| P2p {
        is_send: true,
        buf: b,
        count,
        dtype,
        peer: 1,
        tag: 0,
        source: None,
    };
    let mixed = Op::batch(vec![member(f, 2), member(DType::F64, 3)]);
    assert_eq!((mixed.signature(), mixed.dtype()), (None, None));
    assert_eq!(mixed.elements(), 5);
    let same = Op::batch(vec![member(f, 2), member(f, 3)]);
    assert_eq!(same.dtype(), Some(f));
    let tagged = Op::recv(b, 4, f, 0, 9);
    assert_eq!(tagged.nonzero_tag(), Some(("opts.tag".into(), 9)));
    assert_eq!((tagged.dtype(), tagged.elements()), (Some(f), 4));
}
