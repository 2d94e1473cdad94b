//! Gloo's network thread, created with a comm's Gloo device, runs under
//! SCHED_BATCH when the rank is bound to one CPU, and under the default
//! policy otherwise; the thread that made the comm keeps its own policy.
//! Bound, a woken network thread that preempted its caller mid-send
//! polled epoll for a whole time slice (a 16-byte all_reduce over TCP took
//! 3.6 ms instead of 0.15). 2 and 3 processes, Gloo over TCP
//! (`TORCHCOMM_GLOO_SHM=0`), an all_reduce checked.

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

/// The CPUs this thread may run on.
fn cpus() -> Vec<usize> {
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
    (0..1024)
        .filter(|c| unsafe { libc::CPU_ISSET(*c, &set) })
        .collect()
}

/// Binds this thread to `cpu`.
fn bind_to(cpu: usize) {
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &set) }, 0);
}

fn child() {
    let available = cpus();
    let bound = std::env::var("TC_TEST_BIND").is_ok();
    if bound {
        bind_to(available[rank() as usize % available.len()]);
    } else if available.len() < 2 {
        println!("RESULT skipped=one_cpu");
        return;
    }
    let before: BTreeSet<i32> = policies().into_iter().map(|(tid, _)| tid).collect();
    let comm = child_comm("network_thread", Duration::from_secs(30));
    let after = policies();
    let own = after
        .iter()
        .find(|(tid, _)| *tid == unsafe { libc::gettid() })
        .unwrap()
        .1;
    assert_eq!(
        own,
        libc::SCHED_OTHER,
        "the creating thread's policy changed"
    );
    let batch = after
        .iter()
        .filter(|(tid, policy)| !before.contains(tid) && *policy == libc::SCHED_BATCH)
        .count();
    match bound {
        true => assert!(
            batch > 0,
            "bound to one CPU, no thread created with the comm runs under SCHED_BATCH: {after:?}"
        ),
        false => assert_eq!(
            batch,
            0,
            "with {} CPUs a thread created with the comm runs under SCHED_BATCH: {after:?}",
            available.len()
        ),
    }
    let mut x = [rank() as f32 + 1.0];
    let op = Op::all_reduce(ptr(&mut x), 1, DType::F32, ReduceOp::SUM);
    run(&comm, op).unwrap();
    let n = size() as f32;
    assert_eq!(x[0], n * (n + 1.0) / 2.0);
    println!("RESULT batch_threads={batch}");
}

fn job(test: &str, n: usize, bound: bool) {
    if role().is_some() {
        return child();
    }
    let mut env = vec![("TORCHCOMM_GLOO_SHM", "0")];
    if bound {
        env.push(("TC_TEST_BIND", "1"));
    }
    let out = launch(test, "network", n, &env, Duration::from_secs(120));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

#[test]
fn gloo_network_thread_bound_2() {
    job("gloo_network_thread_bound_2", 2, true);
}

#[test]
fn gloo_network_thread_bound_3() {
    job("gloo_network_thread_bound_3", 3, true);
}

#[test]
fn gloo_network_thread_unbound_2() {
    job("gloo_network_thread_unbound_2", 2, false);
}
