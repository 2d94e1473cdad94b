//! Collectives that the ranks call differently over the UCX host transport
//! (TCP loopback, shared memory off, `UCX_TLS=tcp,self`), with real
//! processes: a count, a dtype, a reduce op, a root, an operation, a
//! barrier against an all_reduce or an all_gather, and per-rank counts; and
//! for every collective family (all_reduce, reduce, reduce_scatter,
//! all_gather, broadcast, gather, scatter, all_to_all) a count or a dtype
//! (float32 against int32: the same bytes, which nothing but the check
//! tells apart) on 2 and 3 ranks, where the first step's message to the
//! right-hand neighbour travels inside the check message, and counts on
//! either side of the largest message it carries (64 KiB), where one rank
//! folds and the other does not; and, on the default between hosts, counts
//! on either side of the largest collective UCX carries (one side handing
//! the call on to Gloo); and ranks 0 and 1 against the rest on 3, 4 and
//! 5 ranks, where every other pair of ranks that compares calls agrees.
//! The (first) odd rank and rank 0, the right-hand neighbours of an odd
//! rank, fail the call well before the 20 s timeout, naming an odd rank
//! and the field that differs; every other rank fails it as promptly
//! naming an odd rank, or (when its part completed before it heard) fails
//! its next call; no process dies. Says SKIPPED (and passes) where libucp.so.0 is
//! missing.

mod gloo_common;
mod ucx_common;

use gloo_common::*;
use std::time::{Duration, Instant};
use torchcomm::{DType, ErrorKind, RedKind, ReduceOp};
use torchcomm::{Op, OpOptions, PremulFactor, Ptr};
use ucx_common::*;

const OP_TIMEOUT: Duration = Duration::from_secs(20);
/// A mismatch must fail every rank within this.
const PROMPT: Duration = Duration::from_secs(5);
const COUNT: usize = 8;
/// Elements of float32 in the largest message the check message carries.
const FOLDED: usize = 65536 / 4;
/// The buffer every case splits into input and output.
const BUF_BYTES: usize = 4 * 4 * (FOLDED + 2) * 2;

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(1.0),
    }
}

fn ptr(v: &mut [u8]) -> Ptr {
    Ptr(v.as_mut_ptr() as *mut std::ffi::c_void)
}

/// `family` over `count` elements of `dtype` per rank (reduce op `kind`
/// where it takes one; root 0), the input in the first half of `buf`, the
/// output in the second.
fn family_op(family: &str, buf: &mut [u8], count: usize, dtype: DType, kind: RedKind) -> Op {
    let n = size() as usize;
    let (input, output) = buf.split_at_mut(buf.len() / 2);
    let inputs: Vec<Ptr> = input
        .chunks_mut(count * dtype.size())
        .take(n)
        .map(ptr)
        .collect();
    let (i, o) = (ptr(input), ptr(output));
    match family {
        "all_reduce" => Op::all_reduce(i, count, dtype, red(kind)),
        "reduce" => Op::reduce(i, count, dtype, 0, red(kind)),
        "reduce_scatter" => Op::reduce_scatter_single(o, i, count, dtype, red(kind)),
        "all_gather" => Op::all_gather_single(o, i, count, dtype),
        "broadcast" => Op::broadcast(i, count, dtype, 0),
        "gather" => Op::gather_single(o, i, count, dtype, 0),
        "scatter" => Op::scatter(o, inputs, count, dtype, 0),
        "all_to_all" => Op::all_to_all_single(o, i, count, dtype),
        other => panic!("unknown family {other}"),
    }
}

/// What rank `me` calls in case `case` (the odd rank out, n - 1, calls
/// something else), and the field the error must name. A case "FAMILY
/// FIELD" is that family with the count (8 against 6), the dtype (float32
/// against int32) or the reduce op (sum against max) differing; "FAMILY
/// count across 64 KiB" has 64 KiB of float32 against 8 bytes more.
fn mismatched_op(case: &str, me: usize, n: usize, buf: &mut [u8]) -> (Op, &'static str) {
    let odd = me >= first_odd(case, n);
    let all_reduce =
        |buf: &mut [u8], count, dtype, kind| Op::all_reduce(ptr(buf), count, dtype, red(kind));
    const FAMILIES: &[&str] = &[
        "all_reduce",
        "reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "gather",
        "scatter",
        "all_to_all",
    ];
    const FIELDS: &[&str] = &[
        "count",
        "count across 64 KiB",
        "count above UCX's largest",
        "count below UCX's largest",
        "dtype",
        "reduce op",
        "against barrier",
    ];
    let family_case = case
        .split_once(' ')
        .filter(|(family, field)| FAMILIES.contains(family) && FIELDS.contains(field));
    if let Some((family, field)) = family_case {
        let (mut count, mut dtype, mut kind) = (COUNT, DType::F32, RedKind::Sum);
        let field = match field {
            "count" => {
                count -= 2 * usize::from(odd);
                "count"
            }
            "count across 64 KiB" => {
                count = FOLDED + 2 * usize::from(odd);
                "count"
            }
            // With the default between hosts (see `straddling_case`):
            // one side of the call on UCX, the other handed on to Gloo.
            "count above UCX's largest" => {
                count = UCX_LARGEST / 4 + usize::from(odd);
                "count"
            }
            "count below UCX's largest" => {
                count = UCX_LARGEST / 4 + usize::from(!odd);
                "count"
            }
            "dtype" => {
                dtype = if odd { DType::I32 } else { DType::F32 };
                "dtype"
            }
            "reduce op" => {
                kind = if odd { RedKind::Max } else { RedKind::Sum };
                "reduce op"
            }
            "against barrier" => {
                let op = match odd {
                    true => Op::Barrier,
                    false => family_op(family, buf, count, dtype, kind),
                };
                return (op, "operation");
            }
            _ => unreachable!(),
        };
        return (family_op(family, buf, count, dtype, kind), field);
    }
    let op = match case {
        "count" | "count from rank 2" => {
            all_reduce(buf, COUNT - 2 * usize::from(odd), DType::F32, RedKind::Sum)
        }
        "dtype" | "dtype from rank 2" => {
            let dtype = if odd { DType::I32 } else { DType::F32 };
            all_reduce(buf, COUNT, dtype, RedKind::Sum)
        }
        "reduce op" => {
            let kind = if odd { RedKind::Max } else { RedKind::Sum };
            all_reduce(buf, COUNT, DType::F32, kind)
        }
        "root" => Op::broadcast(ptr(buf), COUNT, DType::F32, i32::from(odd)),
        "operation" if odd => Op::broadcast(ptr(buf), COUNT, DType::F32, 0),
        "operation" => all_reduce(buf, COUNT, DType::F32, RedKind::Sum),
        "barrier" if odd => all_reduce(buf, COUNT, DType::F32, RedKind::Sum),
        "barrier" => Op::Barrier,
        "per-rank counts" => {
            // The same total, split differently on the odd rank.
            let counts = match odd {
                true => [vec![3, 1], vec![2; n - 2]].concat(),
                false => vec![2; n],
            };
            let (input, output) = buf.split_at_mut(32);
            let kind = red(RedKind::Sum);
            Op::reduce_scatter_v(ptr(output), ptr(input), counts, DType::F32, kind)
        }
        other => panic!("unknown case {other}"),
    };
    let field = match case {
        "barrier" => "operation",
        "count" | "count from rank 2" => "count",
        "dtype" | "dtype from rank 2" => "dtype",
        "reduce op" => "reduce op",
        "root" => "root",
        "operation" => "operation",
        _ => "per-rank counts",
    };
    (op, field)
}

/// The first rank of the odd ones out (they run to the last rank): rank
/// 2 in "... from rank 2", where ranks 0 and 1 agree, and so do the rest
/// (recursive doubling's first partners on 4 ranks, and on 3 and 5 the
/// pair that starts by folding into one), so only a check between ranks
/// 1 and 2 tells the groups apart (with the dtype, float32 against int32,
/// nothing else does: every message has its expected size); else the last
/// rank.
fn first_odd(case: &str, n: usize) -> usize {
    match case {
        "count from rank 2" | "dtype from rank 2" => 2,
        _ => n - 1,
    }
}

fn child() {
    let case = std::env::var("TC_MISMATCH_CASE").unwrap();
    let transport = std::env::var("TC_MISMATCH_TRANSPORT").unwrap_or("ucx".into());
    if transport == "auto" {
        // Each rank a host of its own: UCX between them by default.
        std::env::set_var("TORCHCOMM_HOST_ID", format!("host-{}", rank()));
    }
    let comm = comm_with("mismatch", &transport, Duration::from_secs(60));
    let v = comm.backend_version().to_string_lossy().into_owned();
    assert!(v.contains("UCX 1."), "{v}");
    let (me, n) = (rank() as usize, size() as usize);
    if let Err(e) = comm.submit(Op::Barrier, &OpOptions::default()) {
        // A rank still waiting for a barrier message (descheduled: up to
        // 5 ranks share 2 cores here) may hear of the mismatch first, from
        // ranks that left the barrier and failed the next call: it fails
        // the barrier, naming the calls.
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        assert!(e.message.contains("the ranks called different"), "{e}");
        println!("RESULT {case}: failed the barrier before it: {}", e.message);
        println!("RESULT afterwards: (the comm failed at the barrier)");
        return;
    }
    let mut buf = vec![0u8; BUF_BYTES];
    let (op, field) = mismatched_op(&case, me, n, &mut buf);
    let options = OpOptions {
        timeout: Some(OP_TIMEOUT),
        ..Default::default()
    };
    let start = Instant::now();
    let r = comm.submit(op, &options).map(|_| ());
    let took = start.elapsed();
    assert!(
        took < PROMPT,
        "rank {me} returned only after {took:?}: {r:?}"
    );
    // The ranks that compare an odd rank's call with another see the
    // difference: the first odd rank (its left-hand neighbour's) and rank 0
    // (the last rank's); a rank whose part of the call completed before it
    // heard of it fails its next call.
    let odd = first_odd(&case, n);
    let sees_it = me == odd || me == 0;
    match r {
        Ok(()) => {
            assert!(!sees_it, "rank {me}: the mismatched call succeeded");
            println!("RESULT {case}: completed its part before the failure");
        }
        Err(e) => {
            println!("RESULT {case}: {:?} after {took:?}: {}", e.kind, e.message);
            assert!(
                matches!(e.kind, ErrorKind::InvalidUsage | ErrorKind::Remote),
                "{e}"
            );
            // An odd rank is named (a rank that saw a message of the wrong
            // size names its sender, which may be another odd one).
            let odd_named = (odd..n).any(|r| e.message.contains(&format!("rank {r}")));
            assert!(odd_named, "{e}");
            let named = e.message.contains(&format!("the {field} differs"))
                || !sees_it && e.message.contains("different operations or sizes");
            assert!(named, "{e}");
        }
    }
    // The comm fails cleanly afterwards.
    let mut x = vec![0u8; 4 * COUNT];
    let again = comm.submit(
        Op::all_reduce(ptr(&mut x), COUNT, DType::F32, ReduceOp::SUM),
        &options,
    );
    assert!(
        again.is_err(),
        "rank {me}: the comm ran a call after the mismatch"
    );
    println!("RESULT afterwards: {}", again.err().unwrap().message);
}

fn case(test: &str, case: &str, n: usize) {
    case_in(test, case, n, &[]);
}

/// The largest collective UCX carries in [`straddling_case`].
const UCX_LARGEST: usize = 4096;

/// A case on the default transport between hosts, UCX carrying
/// collectives up to [`UCX_LARGEST`] bytes and Gloo the larger ones: the
/// ranks whose call is larger hand it on, so the check must hold across
/// the two transports.
fn straddling_case(test: &str, case: &str, n: usize) {
    let env = [
        ("TC_MISMATCH_TRANSPORT", "auto"),
        ("TORCHCOMM_UCX_LARGEST", "4096"),
    ];
    case_in(test, case, n, &env);
}

fn case_in(test: &str, case: &str, n: usize, extra: &[(&str, &str)]) {
    if role().is_some() {
        return child();
    }
    if ucx_missing() {
        return;
    }
    let mut env = LOOPBACK_ENV.to_vec();
    env.push(("TC_MISMATCH_CASE", case));
    env.extend_from_slice(extra);
    let out = launch(test, "child", n, &env, Duration::from_secs(120));
    for o in &out {
        for r in o.results() {
            eprintln!("{case} rank {}: {r}", o.rank);
        }
    }
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 2, "{}", o.describe());
    }
}

#[test]
fn ucx_mismatch_count_3_ranks() {
    case("ucx_mismatch_count_3_ranks", "count", 3);
}

#[test]
fn ucx_mismatch_dtype_2_ranks() {
    case("ucx_mismatch_dtype_2_ranks", "dtype", 2);
}

#[test]
fn ucx_mismatch_reduce_op_2_ranks() {
    case("ucx_mismatch_reduce_op_2_ranks", "reduce op", 2);
}

#[test]
fn ucx_mismatch_dtype_from_rank_2_3_ranks() {
    case(
        "ucx_mismatch_dtype_from_rank_2_3_ranks",
        "dtype from rank 2",
        3,
    );
}

#[test]
fn ucx_mismatch_dtype_from_rank_2_4_ranks() {
    case(
        "ucx_mismatch_dtype_from_rank_2_4_ranks",
        "dtype from rank 2",
        4,
    );
}

#[test]
fn ucx_mismatch_count_from_rank_2_4_ranks() {
    case(
        "ucx_mismatch_count_from_rank_2_4_ranks",
        "count from rank 2",
        4,
    );
}

#[test]
fn ucx_mismatch_dtype_from_rank_2_5_ranks() {
    case(
        "ucx_mismatch_dtype_from_rank_2_5_ranks",
        "dtype from rank 2",
        5,
    );
}

#[test]
fn ucx_mismatch_root_4_ranks() {
    case("ucx_mismatch_root_4_ranks", "root", 4);
}

#[test]
fn ucx_mismatch_operation_2_ranks() {
    case("ucx_mismatch_operation_2_ranks", "operation", 2);
}

#[test]
fn ucx_mismatch_barrier_against_all_reduce_3_ranks() {
    case(
        "ucx_mismatch_barrier_against_all_reduce_3_ranks",
        "barrier",
        3,
    );
}

#[test]
fn ucx_mismatch_per_rank_counts_3_ranks() {
    case("ucx_mismatch_per_rank_counts_3_ranks", "per-rank counts", 3);
}

#[test]
fn ucx_mismatch_count_2_ranks() {
    case("ucx_mismatch_count_2_ranks", "count", 2);
}

#[test]
fn ucx_mismatch_dtype_3_ranks() {
    case("ucx_mismatch_dtype_3_ranks", "dtype", 3);
}

#[test]
fn ucx_mismatch_all_reduce_count_across_64_kib_2_ranks() {
    let test = "ucx_mismatch_all_reduce_count_across_64_kib_2_ranks";
    case(test, "all_reduce count across 64 KiB", 2);
}

#[test]
fn ucx_mismatch_all_reduce_count_across_64_kib_3_ranks() {
    let test = "ucx_mismatch_all_reduce_count_across_64_kib_3_ranks";
    case(test, "all_reduce count across 64 KiB", 3);
}

#[test]
fn ucx_mismatch_reduce_dtype_2_ranks() {
    case("ucx_mismatch_reduce_dtype_2_ranks", "reduce dtype", 2);
}

#[test]
fn ucx_mismatch_reduce_reduce_op_3_ranks() {
    case(
        "ucx_mismatch_reduce_reduce_op_3_ranks",
        "reduce reduce op",
        3,
    );
}

#[test]
fn ucx_mismatch_reduce_scatter_dtype_2_ranks() {
    let test = "ucx_mismatch_reduce_scatter_dtype_2_ranks";
    case(test, "reduce_scatter dtype", 2);
}

#[test]
fn ucx_mismatch_reduce_scatter_count_3_ranks() {
    let test = "ucx_mismatch_reduce_scatter_count_3_ranks";
    case(test, "reduce_scatter count", 3);
}

#[test]
fn ucx_mismatch_reduce_scatter_count_across_64_kib_2_ranks() {
    let test = "ucx_mismatch_reduce_scatter_count_across_64_kib_2_ranks";
    case(test, "reduce_scatter count across 64 KiB", 2);
}

#[test]
fn ucx_mismatch_all_gather_count_2_ranks() {
    case(
        "ucx_mismatch_all_gather_count_2_ranks",
        "all_gather count",
        2,
    );
}

#[test]
fn ucx_mismatch_all_gather_dtype_3_ranks() {
    case(
        "ucx_mismatch_all_gather_dtype_3_ranks",
        "all_gather dtype",
        3,
    );
}

#[test]
fn ucx_mismatch_all_gather_count_across_64_kib_3_ranks() {
    let test = "ucx_mismatch_all_gather_count_across_64_kib_3_ranks";
    case(test, "all_gather count across 64 KiB", 3);
}

#[test]
fn ucx_mismatch_broadcast_dtype_2_ranks() {
    case("ucx_mismatch_broadcast_dtype_2_ranks", "broadcast dtype", 2);
}

#[test]
fn ucx_mismatch_broadcast_count_3_ranks() {
    case("ucx_mismatch_broadcast_count_3_ranks", "broadcast count", 3);
}

#[test]
fn ucx_mismatch_gather_dtype_2_ranks() {
    case("ucx_mismatch_gather_dtype_2_ranks", "gather dtype", 2);
}

#[test]
fn ucx_mismatch_gather_count_3_ranks() {
    case("ucx_mismatch_gather_count_3_ranks", "gather count", 3);
}

#[test]
fn ucx_mismatch_scatter_count_2_ranks() {
    case("ucx_mismatch_scatter_count_2_ranks", "scatter count", 2);
}

#[test]
fn ucx_mismatch_scatter_dtype_3_ranks() {
    case("ucx_mismatch_scatter_dtype_3_ranks", "scatter dtype", 3);
}

#[test]
fn ucx_mismatch_all_to_all_dtype_2_ranks() {
    case(
        "ucx_mismatch_all_to_all_dtype_2_ranks",
        "all_to_all dtype",
        2,
    );
}

#[test]
fn ucx_mismatch_all_to_all_count_3_ranks() {
    case(
        "ucx_mismatch_all_to_all_count_3_ranks",
        "all_to_all count",
        3,
    );
}

#[test]
fn ucx_mismatch_all_gather_against_barrier_2_ranks() {
    let test = "ucx_mismatch_all_gather_against_barrier_2_ranks";
    case(test, "all_gather against barrier", 2);
}

#[test]
fn ucx_mismatch_all_reduce_against_barrier_2_ranks() {
    let test = "ucx_mismatch_all_reduce_against_barrier_2_ranks";
    case(test, "all_reduce against barrier", 2);
}

#[test]
fn ucx_mismatch_all_reduce_count_above_ucx_largest_2_ranks() {
    let test = "ucx_mismatch_all_reduce_count_above_ucx_largest_2_ranks";
    straddling_case(test, "all_reduce count above UCX's largest", 2);
}

#[test]
fn ucx_mismatch_all_reduce_count_above_ucx_largest_3_ranks() {
    let test = "ucx_mismatch_all_reduce_count_above_ucx_largest_3_ranks";
    straddling_case(test, "all_reduce count above UCX's largest", 3);
}

/// Two ranks hand the call on, the odd one runs it on UCX: the middle rank,
/// whose neighbours on either side called as it did, must not go on alone.
#[test]
fn ucx_mismatch_all_gather_count_below_ucx_largest_3_ranks() {
    let test = "ucx_mismatch_all_gather_count_below_ucx_largest_3_ranks";
    straddling_case(test, "all_gather count below UCX's largest", 3);
}

#[test]
fn ucx_mismatch_reduce_count_below_ucx_largest_4_ranks() {
    let test = "ucx_mismatch_reduce_count_below_ucx_largest_4_ranks";
    straddling_case(test, "reduce count below UCX's largest", 4);
}
