//! Collectives that the ranks call differently, with the full check
//! (`TORCHCOMM_CHECK_COLLECTIVES=1`) off, on both paths of the gloo backend,
//! with real processes: a count, a dtype, a reduce op, a root, an operation,
//! a barrier against an all_reduce, and one extra call on one rank.
//!
//! - Shared memory (the default on one host): every rank fails at once with
//!   `TC_ERR_INVALID_USAGE` naming the rank and the field that differ,
//!   nothing lands in any buffer, and the comm stays usable.
//! - Gloo (`TORCHCOMM_GLOO_SHM=0`): no process dies; every rank fails with
//!   an error that points to `TORCHCOMM_CHECK_COLLECTIVES=1`, nothing lands,
//!   and the comm fails cleanly afterwards.

mod gloo_common;

use gloo_common::*;
use std::time::Duration;
use torchcomm::comm::{Comm, Op, OpOptions, Ptr};
use torchcomm::error::{Error, ErrorKind};
use torchcomm::types::{DType, PremulFactor, RedKind, ReduceOp};

/// The Gloo path sees a mismatch only at the operation's timeout: the
/// mismatched calls get a short one, the comm (connecting, the calls that
/// agree) a long one, for loaded machines.
const GLOO_OP_TIMEOUT: Duration = Duration::from_secs(3);
const SHM_OP_TIMEOUT: Duration = Duration::from_secs(20);
const COMM_TIMEOUT: Duration = Duration::from_secs(60);
const COUNT: usize = 8;

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(1.0),
    }
}

fn shm_path() -> bool {
    std::env::var("TORCHCOMM_GLOO_SHM").as_deref() != Ok("0")
}

/// A buffer every byte of which is this rank's mark, so that any write by
/// a collective shows.
struct Marked {
    bytes: Vec<u8>,
    mark: u8,
}

impl Marked {
    fn new(me: i32) -> Marked {
        let mark = 0x11 * (me as u8 + 1);
        Marked {
            bytes: vec![mark; 8 * COUNT],
            mark,
        }
    }
    fn ptr(&mut self) -> Ptr {
        Ptr(self.bytes.as_mut_ptr() as *mut std::ffi::c_void)
    }
    fn untouched(&self) -> bool {
        self.bytes.iter().all(|b| *b == self.mark)
    }
}

fn all_reduce(buf: &mut Marked, count: usize, dtype: DType, kind: RedKind) -> Op {
    Op::all_reduce(buf.ptr(), count, dtype, red(kind))
}

fn broadcast(buf: &mut Marked, root: i32) -> Op {
    Op::broadcast(buf.ptr(), COUNT, DType::F32, root)
}

/// What rank `me` calls in case `case`: the odd rank out calls something
/// else.
fn mismatched_op(case: &str, me: i32, n: i32, buf: &mut Marked) -> Op {
    let odd = me == n - 1;
    match case {
        "count" => all_reduce(
            buf,
            if odd { COUNT - 2 } else { COUNT },
            DType::F32,
            RedKind::Sum,
        ),
        "dtype" => all_reduce(
            buf,
            COUNT,
            if odd { DType::I32 } else { DType::F32 },
            RedKind::Sum,
        ),
        "reduce-op" => all_reduce(
            buf,
            COUNT,
            DType::F32,
            if odd { RedKind::Max } else { RedKind::Sum },
        ),
        "root" => broadcast(buf, i32::from(odd)),
        "operation" if odd => broadcast(buf, 0),
        "operation" => all_reduce(buf, COUNT, DType::F32, RedKind::Sum),
        "barrier" if odd => all_reduce(buf, COUNT, DType::F32, RedKind::Sum),
        "barrier" => Op::Barrier,
        other => panic!("unknown case {other}"),
    }
}

/// What the error names on the shared-memory path: the field and the
/// words that name the odd rank's and rank 0's calls.
fn named_field(case: &str) -> (&'static str, &'static str, &'static str) {
    match case {
        "count" => ("count", "count 6", "count 8"),
        "dtype" => ("dtype", "dtype int32", "dtype float32"),
        "reduce-op" => ("reduce op", "op max", "op sum"),
        "root" => ("root", "root 1", "root 0"),
        "operation" => ("operation", "broadcast(", "all_reduce("),
        "barrier" => ("operation", "all_reduce(", "barrier()"),
        other => panic!("unknown case {other}"),
    }
}

/// Checks the error of a mismatched call on this rank's path.
fn check_mismatch_error(case: &str, e: &Error, n: i32) {
    println!("RESULT {case}: {:?} {}", e.kind, e.message);
    if shm_path() {
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        let (field, odd, first) = named_field(case);
        let msg = &e.message;
        assert!(msg.contains(&format!("rank {}", n - 1)), "{e}");
        assert!(msg.contains(&format!("the {field} differs")), "{e}");
        assert!(msg.contains(odd) && msg.contains(first), "{e}");
        assert!(msg.contains("nothing was transferred"), "{e}");
    } else {
        assert!(
            matches!(e.kind, ErrorKind::Timeout | ErrorKind::Remote),
            "{e}"
        );
        assert!(msg_points_to_check(&e.message), "{e}");
    }
}

fn msg_points_to_check(msg: &str) -> bool {
    msg.contains("TORCHCOMM_CHECK_COLLECTIVES=1")
}

/// After the failure: on shared memory the comm still works (a matching
/// all_reduce gives the right sum); on Gloo it fails cleanly.
fn check_afterwards(comm: &Comm, me: i32, n: i32) {
    let mut x = vec![me as f32 + 1.0; COUNT];
    let r = run(
        comm,
        Op::all_reduce(
            Ptr(x.as_mut_ptr() as *mut std::ffi::c_void),
            COUNT,
            DType::F32,
            ReduceOp::SUM,
        ),
    );
    if shm_path() {
        r.unwrap();
        let want = (n * (n + 1) / 2) as f32;
        assert_eq!(x, vec![want; COUNT]);
        println!("RESULT usable afterwards");
    } else {
        let e = r.unwrap_err();
        println!("RESULT afterwards: {:?} {}", e.kind, e.message);
        assert!(comm.finalize().is_err());
    }
}

/// Runs a call that may not match the other ranks' calls.
fn run_mismatched(comm: &Comm, op: Op) -> torchcomm::error::Result<()> {
    let timeout = if shm_path() {
        SHM_OP_TIMEOUT
    } else {
        GLOO_OP_TIMEOUT
    };
    let options = OpOptions {
        timeout: Some(timeout),
        ..Default::default()
    };
    comm.submit(op, &options).map(|_| ())
}

fn mismatch_child(case: &str) {
    let comm = child_comm(case, COMM_TIMEOUT);
    let (me, n) = (comm.rank(), comm.size());
    run(&comm, Op::Barrier).unwrap();
    let mut buf = Marked::new(me);
    let op = mismatched_op(case, me, n, &mut buf);
    match run_mismatched(&comm, op) {
        Err(e) => {
            check_mismatch_error(case, &e, n);
            // On Gloo, ranks whose calls agree exchange data among
            // themselves before the odd rank's timeout; with two ranks no
            // subset agrees.
            if shm_path() || n == 2 {
                assert!(buf.untouched(), "rank {me}: the buffer was written");
            }
        }
        Ok(()) => {
            // Only on Gloo, only a rank whose call matched every peer it
            // talks to in this collective; its next call fails below.
            assert!(!shm_path() && me != n - 1, "rank {me}: the call succeeded");
            println!("RESULT {case}: the call matched its peers' and completed");
        }
    }
    check_afterwards(&comm, me, n);
}

/// Rank 0 calls one all_reduce more than rank 1, which calls a barrier
/// next: both fail on that call. Rank 1 then destroys its comm while rank
/// 0 calls a barrier, which must fail, not hang.
fn extra_call_child() {
    let comm = child_comm("extra", COMM_TIMEOUT);
    let me = comm.rank();
    let mut buf = Marked::new(me);
    run(&comm, all_reduce(&mut buf, COUNT, DType::I32, RedKind::Max)).unwrap();
    let mut buf = Marked::new(me);
    let op = if me == 0 {
        all_reduce(&mut buf, COUNT, DType::F32, RedKind::Sum)
    } else {
        Op::Barrier
    };
    let e = run_mismatched(&comm, op).unwrap_err();
    println!("RESULT extra: {:?} {}", e.kind, e.message);
    assert!(buf.untouched(), "rank {me}: the buffer was written");
    if shm_path() {
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(e.message.contains("rank 1"), "{e}");
        assert!(e.message.contains("the operation differs"), "{e}");
    } else {
        assert!(msg_points_to_check(&e.message), "{e}");
    }
    if me == 1 {
        let _ = comm.finalize();
        drop(comm);
        println!("RESULT destroyed");
        // Alive, so that rank 0 learns from the comm, not from the exit.
        std::thread::sleep(Duration::from_secs(3));
        return;
    }
    let e = run_mismatched(&comm, Op::Barrier).unwrap_err();
    println!("RESULT extra barrier: {:?} {}", e.kind, e.message);
    if shm_path() {
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        assert!(e.message.contains("rank 1 left the comm"), "{e}");
    }
}

fn launch_case(test: &str, case: &str, n: usize, shm: bool) {
    let mut env = vec![("TC_MISMATCH_CASE", case)];
    if !shm {
        env.push(("TORCHCOMM_GLOO_SHM", "0"));
    }
    let role = if shm { "shm" } else { "gloo" };
    let out = launch(test, role, n, &env, Duration::from_secs(120));
    let all = out
        .iter()
        .map(|o| o.describe())
        .collect::<Vec<_>>()
        .join("\n");
    for o in &out {
        for r in o.results() {
            eprintln!("{case} {role} rank {}: {r}", o.rank);
        }
        assert!(
            o.ok(),
            "{case} on the {role} path: rank {} did not survive: {all}",
            o.rank,
        );
        assert!(!o.stderr.contains("terminate called"), "{}", o.describe());
        assert!(
            o.results().len() >= 2,
            "{case} on the {role} path: {}",
            o.describe()
        );
    }
}

/// The child's job: the case named by the parent.
fn child() -> bool {
    if role().is_none() {
        return false;
    }
    match std::env::var("TC_MISMATCH_CASE").unwrap().as_str() {
        "extra" => extra_call_child(),
        case => mismatch_child(case),
    }
    true
}

fn both_paths(test: &str, case: &str, n: usize) {
    if child() {
        return;
    }
    launch_case(test, case, n, true);
    launch_case(test, case, n, false);
}

#[test]
fn mismatch_count_3_ranks() {
    both_paths("mismatch_count_3_ranks", "count", 3);
}

#[test]
fn mismatch_dtype_2_ranks() {
    both_paths("mismatch_dtype_2_ranks", "dtype", 2);
}

#[test]
fn mismatch_reduce_op_2_ranks() {
    both_paths("mismatch_reduce_op_2_ranks", "reduce-op", 2);
}

#[test]
fn mismatch_root_4_ranks() {
    both_paths("mismatch_root_4_ranks", "root", 4);
}

#[test]
fn mismatch_operation_2_ranks() {
    both_paths("mismatch_operation_2_ranks", "operation", 2);
}

#[test]
fn mismatch_barrier_against_all_reduce_3_ranks() {
    both_paths("mismatch_barrier_against_all_reduce_3_ranks", "barrier", 3);
}

#[test]
fn mismatch_extra_call_2_ranks() {
    both_paths("mismatch_extra_call_2_ranks", "extra", 2);
}
