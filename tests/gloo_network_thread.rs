//! Gloo's network thread runs under SCHED_BATCH while an operation over
//! Gloo's TCP runs on its caller's thread (a blocking call), and under the
//! default policy while one runs on the comm's progress thread (an
//! asynchronous call, which the application's computation overlaps); the
//! thread that made the comm keeps its own policy. Without it, a woken
//! network thread that preempted its caller mid-send polled epoll for a
//! whole time slice (ranks bound one per core: a 16-byte all_reduce took
//! 3.6 ms instead of 0.15). 2 and 3 processes, bound one per CPU and not,
//! Gloo over TCP (`TORCHCOMM_GLOO_SHM=0`), every all_reduce checked.

mod gloo_common;

use gloo_common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use torchcomm::{Comm, DType, Op, OpOptions, ReduceOp};

/// This process's threads and their scheduling policies.
fn policies() -> Vec<(i32, i32)> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .map(|tid| (tid, unsafe { libc::sched_getscheduler(tid) }))
        .collect()
}

/// Binds this thread to one of the CPUs it may run on, by rank.
fn bind_by_rank() {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
    let cpus: Vec<usize> = (0..1024)
        .filter(|c| unsafe { libc::CPU_ISSET(*c, &set) })
        .collect();
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpus[rank() as usize % cpus.len()], &mut one) };
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &one) }, 0);
}

fn all_reduce(comm: &Comm, async_op: bool) {
    let mut x = [rank() as f32 + 1.0];
    let op = Op::all_reduce(ptr(&mut x), 1, DType::F32, ReduceOp::SUM);
    let opts = OpOptions {
        async_op,
        ..Default::default()
    };
    let work = comm.submit(op, &opts).unwrap();
    // Not waited for: a waiter may run a queued operation itself.
    let give_up = Instant::now() + Duration::from_secs(30);
    while !work.status().is_finished() {
        assert!(Instant::now() < give_up, "the all_reduce did not finish");
        std::thread::sleep(Duration::from_micros(200));
    }
    work.wait_blocking().unwrap();
    let n = size() as f32;
    assert_eq!(x[0], n * (n + 1.0) / 2.0);
}

/// The threads created with the comm that run under SCHED_BATCH.
fn batch_threads(created_with_comm: &BTreeSet<i32>) -> Vec<i32> {
    policies()
        .into_iter()
        .filter(|(tid, p)| created_with_comm.contains(tid) && *p == libc::SCHED_BATCH)
        .map(|(tid, _)| tid)
        .collect()
}

fn child() {
    if std::env::var("TC_TEST_BIND").is_ok() {
        bind_by_rank();
    }
    let before: BTreeSet<i32> = policies().into_iter().map(|(tid, _)| tid).collect();
    let comm = child_comm("network_thread", Duration::from_secs(30));
    let created: BTreeSet<i32> = policies()
        .into_iter()
        .map(|(tid, _)| tid)
        .filter(|tid| !before.contains(tid))
        .collect();
    let me = unsafe { libc::gettid() };
    all_reduce(&comm, false);
    let after_blocking = batch_threads(&created);
    assert_eq!(
        after_blocking.len(),
        1,
        "after a blocking call, exactly one thread created with the comm (Gloo's network thread) \
         must run under SCHED_BATCH: {:?}",
        policies()
    );
    all_reduce(&comm, true);
    assert!(
        batch_threads(&created).is_empty(),
        "after an asynchronous call (run on the progress thread), no thread may run under \
         SCHED_BATCH: {:?}",
        policies()
    );
    all_reduce(&comm, false);
    assert_eq!(batch_threads(&created), after_blocking, "blocking again");
    let own = policies()
        .into_iter()
        .find(|(tid, _)| *tid == me)
        .unwrap()
        .1;
    assert_eq!(
        own,
        libc::SCHED_OTHER,
        "the calling thread's policy changed"
    );
    println!("RESULT network_thread={}", after_blocking[0]);
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
fn gloo_network_thread_unbound_3() {
    job("gloo_network_thread_unbound_3", 3, false);
}
