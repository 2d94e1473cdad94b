//! Unit tests of the nccl backend's hint parsing and overlap staging.

use super::checks::{hazardous_inputs, with_inputs};
use super::creation::parse_hints;
use super::*;
use crate::op::{AllToAll, AllToAllKind, P2p, PointToPoint, Ptr};
use crate::types::{DType, Hints, PremulFactor, RedKind, ReduceOp};

#[test]
fn hints_map_onto_config_fields() {
    let hints: Hints = vec![
        ("blocking".into(), "0".into()),
        ("nccl.max_ctas".into(), "8".into()),
        ("net_name".into(), "Socket".into()),
        ("gloo.iface".into(), "lo".into()),
        ("mystery".into(), "1".into()),
    ];
    let s = parse_hints(&hints, version_code(2, 28, 9), "c0").unwrap();
    assert_eq!(s.config.blocking, 0);
    assert_eq!(s.config.max_ctas, 8);
    assert_eq!(s.config.min_ctas, NCCL_CONFIG_UNDEF_INT);
    let net = unsafe { std::ffi::CStr::from_ptr(s.config.net_name) };
    assert_eq!(net.to_str().unwrap(), "Socket");
    let name = unsafe { std::ffi::CStr::from_ptr(s.config.comm_name) };
    assert_eq!(name.to_str().unwrap(), "c0");
}

// The overlap staging cases: rank 1 of 4, 8 float32 (32 bytes) per block.
const N: usize = 4;
const ME: usize = 1;
const COUNT: usize = 8;
const DTYPE: DType = DType::F32;
const B: usize = 32;

fn p(a: usize) -> Ptr {
    Ptr(a as *mut c_void)
}

#[test]
fn all_to_all_overlaps_are_staged_in_place_included() {
    let (n, me, count, dtype, b) = (N, ME, COUNT, DTYPE, B);
    // all_to_all_single: any overlap, in place included
    let a2a = |o, i| Op::all_to_all_single(p(o), p(i), count, dtype);
    assert_eq!(hazardous_inputs(&a2a(0x1000, 0x1000), n, me).len(), 1);
    assert_eq!(
        hazardous_inputs(&a2a(0x1000, 0x1000 + 4 * b - 4), n, me).len(),
        1
    );
    assert!(hazardous_inputs(&a2a(0x1000, 0x1000 + 4 * b), n, me).is_empty());
    // all_to_all_v_single: overlap of the used lengths only
    let v = |o, i| Op::all_to_all_v_single(p(o), vec![1, 0, 2, 1], p(i), vec![2, 2, 0, 0], dtype);
    assert_eq!(
        hazardous_inputs(&v(0x1000, 0x1000), n, me),
        vec![(p(0x1000), 16)]
    );
    assert!(hazardous_inputs(&v(0x1000, 0x1000 + 16), n, me).is_empty());
}

#[test]
fn single_forms_are_in_place_at_this_ranks_block_only() {
    let (n, me, count, dtype, b) = (N, ME, COUNT, DTYPE, B);
    // all_gather_single: in place is the input at this rank's block
    let ag = |o, i| Op::all_gather_single(p(o), p(i), count, dtype);
    assert!(hazardous_inputs(&ag(0x1000, 0x1000 + b), n, me).is_empty());
    assert_eq!(
        hazardous_inputs(&ag(0x1000, 0x1000), n, me),
        vec![(p(0x1000), b)]
    );
    // reduce_scatter_single: in place is the output at this rank's block
    let rs = |o, i| {
        Op::reduce_scatter_single(
            p(o),
            p(i),
            count,
            dtype,
            ReduceOp {
                kind: RedKind::Sum,
                factor: PremulFactor::Host(1.0),
            },
        )
    };
    assert!(hazardous_inputs(&rs(0x1000 + b, 0x1000), n, me).is_empty());
    assert_eq!(
        hazardous_inputs(&rs(0x1000, 0x1000), n, me),
        vec![(p(0x1000), 4 * b)]
    );
}

#[test]
fn list_inputs_are_all_staged_and_replaced_in_order() {
    let (n, me, count, dtype, b) = (N, ME, COUNT, DTYPE, B);
    // lists: every input block is staged, and replaced in order
    let l = Op::all_to_all(
        (0..4).map(|q| p(0x1000 + q * b)).collect(),
        (0..4).map(|q| p(0x1000 + q * b)).collect(),
        count,
        dtype,
    );
    let h = hazardous_inputs(&l, n, me);
    assert_eq!(h.len(), 4);
    let staged: Vec<Ptr> = (0..4).map(|q| p(0x9000 + q * b)).collect();
    match with_inputs(&l, &staged) {
        Op::AllToAll(AllToAll {
            kind: AllToAllKind::Lists {
                inputs, outputs, ..
            },
            ..
        }) => {
            assert_eq!(
                inputs.iter().map(|x| x.0 as usize).collect::<Vec<_>>(),
                vec![0x9000, 0x9020, 0x9040, 0x9060]
            );
            assert_eq!(outputs[0].0 as usize, 0x1000);
        }
        _ => unreachable!(),
    }
}

#[test]
fn gather_and_scatter_roots_may_keep_their_own_block_in_place() {
    let (n, me, count, dtype, b) = (N, ME, COUNT, DTYPE, B);
    // gather/scatter: the root's own block in place is fine; partial overlap is not
    let g = |i| {
        Op::gather(
            (0..4).map(|q| p(0x1000 + q * b)).collect(),
            p(i),
            count,
            dtype,
            1,
        )
    };
    assert!(hazardous_inputs(&g(0x1000 + b), n, me).is_empty());
    assert_eq!(hazardous_inputs(&g(0x1000 + 2 * b), n, me).len(), 1);
    let sc = |o| {
        Op::scatter(
            p(o),
            (0..4).map(|q| p(0x1000 + q * b)).collect(),
            count,
            dtype,
            1,
        )
    };
    assert!(hazardous_inputs(&sc(0x1000 + b), n, me).is_empty());
    assert!(
        hazardous_inputs(&sc(0x1000 + 2 * b), n, me).is_empty(),
        "another block is sent before the root's copy"
    );
    assert_eq!(hazardous_inputs(&sc(0x1000 + b + 4), n, me).len(), 4);
    // non-root gather/scatter pass empty lists
    assert!(hazardous_inputs(&Op::gather(vec![], p(0x1000), count, dtype, 0), n, me).is_empty());
}

#[test]
fn batch_sends_overlapping_a_receive_are_staged() {
    let (n, me, count, dtype, b) = (N, ME, COUNT, DTYPE, B);
    // batch: only the sends that overlap a receive of the same batch
    let send = |a, peer| P2p {
        is_send: true,
        buf: p(a),
        count,
        dtype,
        peer,
        tag: 0,
        source: None,
    };
    let recv = |a, peer| P2p {
        is_send: false,
        buf: p(a),
        count,
        dtype,
        peer,
        tag: 0,
        source: None,
    };
    let ok = Op::batch(vec![send(0x1000, 2), send(0x1000, 3), recv(0x1000 + b, 0)]);
    assert!(
        hazardous_inputs(&ok, n, me).is_empty(),
        "sends may share a buffer; a receive apart is fine"
    );
    let ring = Op::batch(vec![
        send(0x2000, 2),
        recv(0x1000, 0),
        send(0x1000 + b - 4, 3),
    ]);
    assert_eq!(hazardous_inputs(&ring, n, me), vec![(p(0x1000 + b - 4), b)]);
    match with_inputs(&ring, &[p(0x9000)]) {
        Op::PointToPoint(PointToPoint::Batch(ops)) => {
            assert_eq!(
                ops.iter().map(|x| x.buf.0 as usize).collect::<Vec<_>>(),
                vec![0x2000, 0x1000, 0x9000]
            );
        }
        _ => unreachable!(),
    }
}

#[test]
fn malformed_hint_is_an_invalid_argument() {
    for (k, v) in [
        ("blocking", "yes"),
        ("min_ctas", "0"),
        ("nccl.split_share", "2"),
        ("high_priority_stream", ""),
    ] {
        let e = parse_hints(&vec![(k.to_string(), v.to_string())], 22809, "c")
            .err()
            .expect("must fail");
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{k}={v}");
        assert!(e.message.contains(k), "{}", e.message);
    }
}
