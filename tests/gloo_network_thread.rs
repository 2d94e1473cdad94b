//! Gloo's network thread, created with a comm's Gloo device, runs under
//! SCHED_BATCH, and the thread that made the comm keeps its own policy:
//! on a rank bound to one CPU a woken network thread that preempted its
//! caller mid-send polled epoll for a whole time slice (a 16-byte
//! all_reduce over TCP took 3.6 ms instead of 0.3). 2 and 3 processes,
//! Gloo over TCP (`TORCHCOMM_GLOO_SHM=0`), an all_reduce checked.

mod gloo_common;

use gloo_common::*;
use std::collections::BTreeSet;
use std::time::Duration;
use torchcomm::{DType, Op, ReduceOp};

/// This process's threads and their scheduling policies.
fn policies() -> Vec<(i32, i32)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .map(|tid| (tid, unsafe { libc::sched_getscheduler(tid) }))
        .collect()
}

fn this_thread() -> i32 {
    unsafe { libc::gettid() }
}

fn child() {
    let before: BTreeSet<i32> = policies().into_iter().map(|(tid, _)| tid).collect();
    let comm = child_comm("network_thread", Duration::from_secs(30));
    let after = policies();
    let own = after
        .iter()
        .find(|(tid, _)| *tid == this_thread())
        .unwrap()
        .1;
    assert_eq!(
        own,
        libc::SCHED_OTHER,
        "the creating thread's policy changed"
    );
    let batch: Vec<i32> = after
        .iter()
        .filter(|(tid, policy)| !before.contains(tid) && *policy == libc::SCHED_BATCH)
        .map(|(tid, _)| *tid)
        .collect();
    assert!(
        !batch.is_empty(),
        "no thread created with the comm runs under SCHED_BATCH: {after:?}"
    );
    let mut x = [rank() as f32 + 1.0];
    let op = Op::all_reduce(ptr(&mut x), 1, DType::F32, ReduceOp::SUM);
    run(&comm, op).unwrap();
    let n = size() as f32;
    assert_eq!(x[0], n * (n + 1.0) / 2.0);
    println!("RESULT batch_threads={}", batch.len());
}

fn job(test: &str, n: usize) {
    if role().is_some() {
        return child();
    }
    let env = [("TORCHCOMM_GLOO_SHM", "0")];
    let out = launch(test, "network", n, &env, Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

#[test]
fn gloo_network_thread_batch_2() {
    job("gloo_network_thread_batch_2", 2);
}

#[test]
fn gloo_network_thread_batch_3() {
    job("gloo_network_thread_batch_3", 3);
}
