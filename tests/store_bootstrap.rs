//! Bootstrap from MASTER_ADDR/MASTER_PORT with rank 0 hosting the store
//! (hand launches: no tc-run, no agent store): many comms alive at once,
//! created from several threads, destroyed in differing orders, and a
//! create/destroy loop, with 2 and 3 ranks launched as plain processes.

mod store_common;

use std::sync::Arc;
use std::time::Duration;
use store_common::*;
use torchcomm::comm::{Comm, CommOptions, Op, OpOptions, Ptr};
use torchcomm::types::{DType, Device, ReduceOp};

const T: Duration = Duration::from_secs(60);
const LOOPS: usize = 30;
const CONCURRENT: usize = 4;

fn new_comm(name: &str) -> Arc<Comm> {
    // Rank, size and store all come from the environment.
    Comm::new(
        "gloo",
        Device::Cpu,
        CommOptions {
            name: Some(name.to_string()),
            timeout: Some(T),
            abort_on_error: Some(false),
            ..CommOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("creating comm {name}: {e:?}"))
}

/// An all_reduce whose result proves every rank took part.
fn check_sum(comm: &Comm, salt: usize) {
    let (me, n) = (comm.rank() as f32, comm.size() as f32);
    let mut buf = [me + salt as f32; 4];
    comm.submit(
        Op::all_reduce(Ptr(buf.as_mut_ptr().cast()), 4, DType::F32, ReduceOp::SUM),
        &OpOptions::default(),
    )
    .unwrap_or_else(|e| panic!("all_reduce on {}: {e:?}", comm.name()));
    let want = n * (n - 1.0) / 2.0 + n * salt as f32;
    assert_eq!(buf, [want; 4], "comm {}", comm.name());
}

fn rank_main() {
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    if role().as_deref() == Some("loop") {
        create_destroy_loop();
        println!("RESULT ok rank {rank}");
        return;
    }
    // Several comms alive at once, created concurrently from threads.
    let comms: Vec<Arc<Comm>> = (0..CONCURRENT)
        .map(|i| std::thread::spawn(move || new_comm(&format!("live{i}"))))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    for (i, c) in comms.iter().enumerate() {
        check_sum(c, i);
    }
    // A comm created while the others live, then destroyed first.
    let extra = new_comm("extra");
    check_sum(&extra, 9);
    extra.finalize().unwrap();
    drop(extra);
    // Destroyed in an order that differs between ranks.
    let mut order: Vec<usize> = (0..CONCURRENT).collect();
    order.rotate_left(rank % CONCURRENT);
    let mut comms: Vec<Option<Arc<Comm>>> = comms.into_iter().map(Some).collect();
    for i in order {
        let c = comms[i].take().unwrap();
        c.finalize().unwrap();
    }
    create_destroy_loop();
    println!("RESULT ok rank {rank}");
}

/// Sequential create/destroy, alternating one name and fresh names.
fn create_destroy_loop() {
    for i in 0..LOOPS {
        let name = if i % 2 == 0 {
            "loop".to_string()
        } else {
            format!("loop{i}")
        };
        let c = new_comm(&name);
        check_sum(&c, i);
        c.finalize().unwrap();
    }
}

fn launch(test: &str, role: &str, n: usize) {
    let port = free_port().to_string();
    let size = n.to_string();
    let procs: Vec<Proc> = (0..n)
        .map(|r| {
            let r = r.to_string();
            spawn(
                test,
                role,
                &[
                    ("RANK", &r),
                    ("WORLD_SIZE", &size),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", &port),
                ],
            )
        })
        .collect();
    let mut failures = Vec::new();
    for (r, p) in procs.into_iter().enumerate() {
        let (ok, out, err) = p.finish(Duration::from_secs(400));
        if !(ok && out.contains("RESULT ok")) {
            failures.push(format!("rank {r}:\n{out}\n{}", tail(&err)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n----\n"));
}

fn tail(s: &str) -> &str {
    &s[s.len().saturating_sub(3000)..]
}

#[test]
fn many_comms_from_master_addr_two_ranks() {
    if role().is_some() {
        return rank_main();
    }
    launch("many_comms_from_master_addr_two_ranks", "rank", 2);
}

#[test]
fn many_comms_from_master_addr_three_ranks() {
    if role().is_some() {
        return rank_main();
    }
    launch("many_comms_from_master_addr_three_ranks", "rank", 3);
}

#[test]
fn create_destroy_loop_from_master_addr_two_ranks() {
    if role().is_some() {
        return rank_main();
    }
    launch("create_destroy_loop_from_master_addr_two_ranks", "loop", 2);
}
