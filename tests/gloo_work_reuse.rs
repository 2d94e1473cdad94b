//! The host executor reuses a work once nobody holds it any more
//! (`host_executor/recycled_works.rs`): real processes of 2, 3 and 4 ranks
//! make more calls than the executor keeps works (128) and the flight
//! recorder keeps entries (64), blocking and asynchronous, while holding
//! some of their works. A work still held must never be handed out again:
//! every work held at once is a distinct object, a held work keeps its
//! outcome however many calls follow, and every call's result is exact
//! (integer sums in float32) and the same bytes on every rank. The flight
//! recorder still counts every operation.

mod gloo_common;

use gloo_common::*;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use torchcomm::{Comm, DType, Op, OpOptions, PremulFactor, Ptr, RedKind, ReduceOp, Work};
use torchcomm::{ErrorKind, WorkStatus};

const CALLS: usize = 300;

fn sum() -> ReduceOp {
    ReduceOp {
        kind: RedKind::Sum,
        factor: PremulFactor::Host(1.0),
    }
}

/// All_reduce of `x` (4 floats), blocking or not; its work.
fn all_reduce(comm: &Comm, x: &mut [f32; 4], async_op: bool) -> Arc<dyn Work> {
    let op = Op::all_reduce(Ptr(x.as_mut_ptr().cast()), 4, DType::F32, sum());
    let opts = OpOptions {
        async_op,
        ..OpOptions::default()
    };
    comm.submit(op, &opts).unwrap()
}

/// Rank `r`'s input of call `i`, and the sum over `n` ranks.
fn input(r: usize, i: usize) -> [f32; 4] {
    std::array::from_fn(|k| ((r * 7 + i * 3 + k) % 97) as f32)
}
fn expected(n: usize, i: usize) -> [f32; 4] {
    std::array::from_fn(|k| (0..n).map(|r| input(r, i)[k]).sum())
}

/// The address of a work, to tell objects apart.
fn addr(w: &Arc<dyn Work>) -> *const () {
    Arc::as_ptr(w) as *const ()
}

fn child() {
    let comm = child_comm("work-reuse", Duration::from_secs(60));
    let (me, n) = (comm.rank() as usize, comm.size() as usize);
    // Blocking calls, holding every 10th work.
    let mut held = Vec::new();
    let mut results = Vec::new();
    for i in 0..CALLS {
        let mut x = input(me, i);
        let work = all_reduce(&comm, &mut x, false);
        assert_eq!(work.status(), WorkStatus::Completed, "call {i}");
        assert_eq!(x, expected(n, i), "call {i}: rank {me}'s sum");
        results.extend(x.iter().flat_map(|v| v.to_le_bytes()));
        if i % 10 == 0 {
            held.push(work);
        }
    }
    let distinct: HashSet<_> = held.iter().map(addr).collect();
    assert_eq!(
        distinct.len(),
        held.len(),
        "a held work was handed out again"
    );
    for w in &held {
        assert_eq!(w.status(), WorkStatus::Completed);
        w.wait_blocking().unwrap();
    }
    // Asynchronous calls, every work held until all were issued.
    let mut bufs: Vec<[f32; 4]> = (0..CALLS).map(|i| input(me, CALLS + i)).collect();
    let works: Vec<_> = bufs
        .iter_mut()
        .map(|x| all_reduce(&comm, x, true))
        .collect();
    let distinct: HashSet<_> = works.iter().chain(&held).map(addr).collect();
    assert_eq!(
        distinct.len(),
        works.len() + held.len(),
        "a held work was handed out again"
    );
    for (i, (w, x)) in works.iter().zip(&bufs).enumerate() {
        w.wait_blocking().unwrap();
        assert_eq!(w.status(), WorkStatus::Completed);
        assert_eq!(
            *x,
            expected(n, CALLS + i),
            "async call {i}: rank {me}'s sum"
        );
        results.extend(x.iter().flat_map(|v| v.to_le_bytes()));
    }
    let dump = comm.dump_flight_recorder();
    assert!(
        dump.contains(&format!("of {} operations", 2 * CALLS)),
        "the recorder must count every operation: {dump}"
    );
    // The same bytes on every rank: rank 0's broadcast against ours.
    let mut theirs = results.clone();
    let op = Op::broadcast(Ptr(theirs.as_mut_ptr().cast()), theirs.len(), DType::U8, 0);
    run(&comm, op).unwrap();
    assert!(
        theirs == results,
        "rank {me}'s results differ from rank 0's"
    );
    println!("RESULT ok");
}

/// A rank killed between calls: a survivor's next call fails naming it,
/// and the works it held keep their outcome.
fn child_dead_peer() {
    let comm = child_comm("work-reuse-dead", Duration::from_secs(10));
    let me = comm.rank() as usize;
    let mut held = Vec::new();
    for i in 0..CALLS {
        let mut x = input(me, i);
        held.push(all_reduce(&comm, &mut x, false));
    }
    if comm.rank() == 1 {
        // SAFETY: ends this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let mut x = input(me, 0);
    let op = Op::all_reduce(Ptr(x.as_mut_ptr().cast()), 4, DType::F32, sum());
    let e = run(&comm, op).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Remote, "{e}");
    assert!(e.message.contains("rank 1"), "{e}");
    assert!(held.iter().all(|w| w.status() == WorkStatus::Completed));
    println!("RESULT ok");
}

fn world(test: &str, n: usize) {
    let out = launch(test, "reuse", n, &[], Duration::from_secs(300));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results(), vec!["ok".to_string()], "{}", o.describe());
    }
}

#[test]
fn gloo_work_reuse_2() {
    if role().is_some() {
        return child();
    }
    world("gloo_work_reuse_2", 2);
}

#[test]
fn gloo_work_reuse_3() {
    if role().is_some() {
        return child();
    }
    world("gloo_work_reuse_3", 3);
}

#[test]
fn gloo_work_reuse_4() {
    if role().is_some() {
        return child();
    }
    world("gloo_work_reuse_4", 4);
}

#[test]
fn gloo_work_reuse_dead_peer_named() {
    if role().is_some() {
        return child_dead_peer();
    }
    let out = launch(
        "gloo_work_reuse_dead_peer_named",
        "reuse-dead",
        3,
        &[],
        Duration::from_secs(120),
    );
    for (r, o) in out.iter().enumerate().filter(|(r, _)| *r != 1) {
        assert!(o.ok(), "rank {r}: {}", o.describe());
        assert_eq!(o.results(), vec!["ok".to_string()], "{}", o.describe());
    }
    assert!(!out[1].ok(), "rank 1 was to be killed");
}
