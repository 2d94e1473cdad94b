//! Unit tests of `Op::validate`: for every operation a valid call and each
//! refusal, by kind and the argument named.

use super::*;
use crate::error::ErrorKind;
use crate::types::{RedKind, ReduceOp};
use std::ffi::c_void;

fn p(x: usize) -> Ptr {
    Ptr(x as *mut c_void)
}
const NULL: Ptr = Ptr(std::ptr::null_mut());
/// 2^62 one-byte elements: fits the address space, but not four times.
const HUGE: usize = 1 << 62;

/// The error `op` gets from rank `rank` of `size`, as (kind, message).
fn refusal(op: &Op, rank: i32, size: i32) -> (ErrorKind, String) {
    let e = op
        .validate(rank, size)
        .expect_err("the operation must be refused");
    (e.kind, e.message)
}

/// Refused with `kind`, the message naming `arg`.
fn assert_refused(op: &Op, rank: i32, size: i32, kind: ErrorKind, arg: &str) {
    let (k, m) = refusal(op, rank, size);
    assert_eq!(k, kind, "{}: {m}", op.name());
    assert!(m.contains(&format!("'{arg}'")), "{}: {m}", op.name());
}

fn band() -> ReduceOp {
    ReduceOp {
        kind: RedKind::BAnd,
        ..ReduceOp::SUM
    }
}

#[test]
fn send_and_recv_check_peer_and_buffer() {
    let send = |buf, count, peer| Op::send(buf, count, DType::F32, peer, 0);
    send(p(8), 4, 1).validate(0, 2).unwrap();
    send(NULL, 0, 1).validate(0, 2).unwrap();
    assert_refused(&send(p(8), 4, 2), 0, 2, ErrorKind::InvalidArgument, "peer");
    assert_refused(&send(NULL, 4, 1), 0, 2, ErrorKind::NullArgument, "buf");
    assert_refused(
        &send(p(8), usize::MAX / 2, 1),
        0,
        2,
        ErrorKind::InvalidArgument,
        "buf",
    );
    let recv = Op::recv(p(8), 1, DType::U8, -2, 0);
    assert_refused(&recv, 0, 2, ErrorKind::InvalidArgument, "peer");
}

#[test]
fn any_source_only_on_a_receive_alone_among_several_ranks() {
    let (any, slot) = Op::recv_any(p(8), 1, DType::U8, 3);
    any.validate(0, 2).unwrap();
    assert_eq!(slot.get(), None, "no sender before a match");
    assert_refused(&any, 0, 1, ErrorKind::InvalidUsage, "peer");
    let send = Op::send(p(8), 1, DType::U8, ANY_SOURCE, 0);
    assert_refused(&send, 0, 2, ErrorKind::InvalidArgument, "peer");
    let member = P2p {
        is_send: false,
        buf: p(8),
        count: 1,
        dtype: DType::U8,
        peer: ANY_SOURCE,
        tag: 0,
        source: None,
    };
    let batch = Op::batch(vec![member]);
    assert_refused(&batch, 0, 2, ErrorKind::Unsupported, "batch[0].peer");
}

#[test]
fn batch_checks_every_member() {
    let member = |buf, peer| P2p {
        is_send: true,
        buf,
        count: 2,
        dtype: DType::I32,
        peer,
        tag: 0,
        source: None,
    };
    let ok = Op::batch(vec![member(p(8), 0), member(p(16), 2)]);
    ok.validate(1, 3).unwrap();
    let bad_peer = Op::batch(vec![member(p(8), 0), member(p(16), 3)]);
    assert_refused(&bad_peer, 1, 3, ErrorKind::InvalidArgument, "batch[1].peer");
    let null = Op::batch(vec![member(NULL, 0)]);
    assert_refused(&null, 1, 3, ErrorKind::NullArgument, "batch[0].buf");
}

#[test]
fn broadcast_and_reduce_check_root_buffer_and_reduce_op() {
    let bcast = |buf, root| Op::broadcast(buf, 3, DType::F64, root);
    bcast(p(8), 3).validate(0, 4).unwrap();
    assert_refused(&bcast(p(8), 4), 0, 4, ErrorKind::InvalidArgument, "root");
    assert_refused(&bcast(NULL, 0), 0, 4, ErrorKind::NullArgument, "buf");
    let reduce = |root, dtype, op| Op::reduce(p(8), 3, dtype, root, op);
    reduce(0, DType::I32, band()).validate(1, 2).unwrap();
    assert_refused(
        &reduce(-1, DType::I32, ReduceOp::SUM),
        1,
        2,
        ErrorKind::InvalidArgument,
        "root",
    );
    let (k, m) = refusal(&reduce(0, DType::F32, band()), 1, 2);
    assert_eq!(k, ErrorKind::Unsupported, "{m}");
}

#[test]
fn all_reduce_checks_buffer_and_reduce_op() {
    let ar = |buf, dtype, op| Op::all_reduce(buf, 5, dtype, op);
    ar(p(8), DType::F32, ReduceOp::SUM).validate(0, 2).unwrap();
    assert_refused(
        &ar(NULL, DType::F32, ReduceOp::SUM),
        0,
        2,
        ErrorKind::NullArgument,
        "buf",
    );
    let (k, m) = refusal(&ar(p(8), DType::BF16, band()), 0, 2);
    assert_eq!(k, ErrorKind::Unsupported, "{m}");
}

#[test]
fn all_gather_checks_input_and_one_output_per_rank() {
    let ag = |outputs: Vec<Ptr>, input| Op::all_gather(outputs, input, 2, DType::I64);
    ag(vec![p(8), p(16)], p(24)).validate(0, 2).unwrap();
    assert_refused(
        &ag(vec![p(8)], p(24)),
        0,
        2,
        ErrorKind::InvalidArgument,
        "outputs",
    );
    assert_refused(
        &ag(vec![p(8), NULL], p(24)),
        0,
        2,
        ErrorKind::NullArgument,
        "outputs[1]",
    );
    assert_refused(
        &ag(vec![p(8), p(16)], NULL),
        0,
        2,
        ErrorKind::NullArgument,
        "input",
    );
}

#[test]
fn all_gather_single_checks_the_size_times_count() {
    let ags = |output, count| Op::all_gather_single(output, p(8), count, DType::U8);
    ags(p(16), 4).validate(0, 4).unwrap();
    assert_refused(&ags(p(16), HUGE), 0, 4, ErrorKind::InvalidArgument, "count");
    assert_refused(
        &ags(p(16), HUGE),
        0,
        2,
        ErrorKind::InvalidArgument,
        "output",
    );
    assert_refused(&ags(NULL, 4), 0, 4, ErrorKind::NullArgument, "output");
}

#[test]
fn all_gather_v_checks_counts_and_this_ranks_input() {
    let agv = |input, counts: Vec<usize>| Op::all_gather_v(p(8), input, counts, DType::F32);
    agv(p(16), vec![1, 2, 0]).validate(1, 3).unwrap();
    // Rank 2 contributes nothing: its input may be NULL.
    agv(NULL, vec![1, 2, 0]).validate(2, 3).unwrap();
    assert_refused(
        &agv(p(16), vec![1, 2]),
        1,
        3,
        ErrorKind::InvalidArgument,
        "counts",
    );
    assert_refused(
        &agv(NULL, vec![1, 2, 0]),
        1,
        3,
        ErrorKind::NullArgument,
        "input",
    );
    let overflow = agv(p(16), vec![usize::MAX, 1, 0]);
    assert_refused(&overflow, 1, 3, ErrorKind::InvalidArgument, "counts");
}

#[test]
fn reduce_scatter_checks_inputs_output_and_reduce_op() {
    let rs = |output, inputs: Vec<Ptr>, op| Op::reduce_scatter(output, inputs, 2, DType::I32, op);
    rs(p(8), vec![p(16), p(24)], band()).validate(0, 2).unwrap();

    assert_refused(
        &rs(p(8), vec![p(16)], ReduceOp::SUM),
        0,
        2,
        ErrorKind::InvalidArgument,
        "inputs",
    );
    assert_refused(
        &rs(NULL, vec![p(16), p(24)], ReduceOp::SUM),
        0,
        2,
        ErrorKind::NullArgument,
        "output",
    );
    let float_band = Op::reduce_scatter(p(8), vec![p(16), p(24)], 2, DType::F16, band());
    assert_eq!(refusal(&float_band, 0, 2).0, ErrorKind::Unsupported);
}

#[test]
fn reduce_scatter_single_checks_the_size_times_count() {
    let rss =
        |input, count| Op::reduce_scatter_single(p(8), input, count, DType::U8, ReduceOp::SUM);
    rss(p(16), 3).validate(0, 4).unwrap();
    assert_refused(&rss(p(16), HUGE), 0, 4, ErrorKind::InvalidArgument, "count");
    assert_refused(&rss(NULL, 3), 0, 4, ErrorKind::NullArgument, "input");
}

#[test]
fn reduce_scatter_v_checks_counts_and_this_ranks_output() {
    let rsv = |output, counts: Vec<usize>| {
        Op::reduce_scatter_v(output, p(8), counts, DType::F32, ReduceOp::SUM)
    };
    rsv(p(16), vec![2, 1]).validate(1, 2).unwrap();
    rsv(NULL, vec![2, 0]).validate(1, 2).unwrap();
    assert_refused(
        &rsv(p(16), vec![2, 1, 1]),
        1,
        2,
        ErrorKind::InvalidArgument,
        "counts",
    );
    assert_refused(
        &rsv(NULL, vec![2, 1]),
        1,
        2,
        ErrorKind::NullArgument,
        "output",
    );
}

#[test]
fn all_to_all_checks_both_lists() {
    let a2a = |outputs: Vec<Ptr>, inputs: Vec<Ptr>| Op::all_to_all(outputs, inputs, 1, DType::F32);
    a2a(vec![p(8), p(16)], vec![p(24), p(32)])
        .validate(0, 2)
        .unwrap();
    let short = a2a(vec![p(8), p(16)], vec![p(24)]);
    assert_refused(&short, 0, 2, ErrorKind::InvalidArgument, "inputs");
    let null = a2a(vec![NULL, p(16)], vec![p(24), p(32)]);
    assert_refused(&null, 0, 2, ErrorKind::NullArgument, "outputs[0]");
}

#[test]
fn all_to_all_single_checks_the_size_times_count() {
    let a2as = |output, count| Op::all_to_all_single(output, p(8), count, DType::U8);
    a2as(p(16), 2).validate(0, 4).unwrap();
    assert_refused(
        &a2as(p(16), HUGE),
        0,
        4,
        ErrorKind::InvalidArgument,
        "count",
    );
    assert_refused(&a2as(NULL, 2), 0, 4, ErrorKind::NullArgument, "output");
}

#[test]
fn all_to_all_v_single_checks_both_count_lists() {
    let a2av = |output_counts: Vec<usize>, input_counts: Vec<usize>| {
        Op::all_to_all_v_single(p(8), output_counts, p(16), input_counts, DType::I64)
    };
    a2av(vec![1, 2], vec![3, 0]).validate(0, 2).unwrap();
    let short = a2av(vec![1], vec![3, 0]);
    assert_refused(&short, 0, 2, ErrorKind::InvalidArgument, "output_counts");
    let overflow = a2av(vec![1, 2], vec![usize::MAX, 1]);
    assert_refused(&overflow, 0, 2, ErrorKind::InvalidArgument, "input_counts");
    let null_input = Op::all_to_all_v_single(p(8), vec![1, 2], NULL, vec![3, 0], DType::I64);
    assert_refused(&null_input, 0, 2, ErrorKind::NullArgument, "input");
}

#[test]
fn barrier_is_valid_on_every_comm() {
    for size in 1..4 {
        Op::Barrier.validate(size - 1, size).unwrap();
    }
}

#[test]
fn scatter_checks_inputs_on_the_root_only() {
    let scatter = |inputs: Vec<Ptr>, root| Op::scatter(p(8), inputs, 2, DType::F32, root);
    scatter(vec![p(16), p(24)], 0).validate(0, 2).unwrap();
    scatter(vec![], 0).validate(1, 2).unwrap();
    assert_refused(
        &scatter(vec![], 0),
        0,
        2,
        ErrorKind::InvalidArgument,
        "inputs",
    );
    assert_refused(
        &scatter(vec![], 2),
        1,
        2,
        ErrorKind::InvalidArgument,
        "root",
    );
    let null_output = Op::scatter(NULL, vec![], 2, DType::F32, 0);
    assert_refused(&null_output, 1, 2, ErrorKind::NullArgument, "output");
}

#[test]
fn gather_checks_outputs_on_the_root_only() {
    let gather = |outputs: Vec<Ptr>, root| Op::gather(outputs, p(8), 2, DType::F32, root);
    gather(vec![p(16), p(24)], 1).validate(1, 2).unwrap();
    gather(vec![], 1).validate(0, 2).unwrap();
    assert_refused(
        &gather(vec![p(16), NULL], 1),
        1,
        2,
        ErrorKind::NullArgument,
        "outputs[1]",
    );
    assert_refused(
        &gather(vec![], -2),
        0,
        2,
        ErrorKind::InvalidArgument,
        "root",
    );
    let null_input = Op::gather(vec![], NULL, 2, DType::F32, 1);
    assert_refused(&null_input, 0, 2, ErrorKind::NullArgument, "input");
}
