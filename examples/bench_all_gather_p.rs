//! Persistent all-gather (`tc_all_gather_p_exec`) against the plain
//! `tc_all_gather_single` on the gloo backend, through the C API, side by
//! side in one run: for each size, rounds alternate the two (which goes
//! first alternates too), each round times `ITERS` blocking calls, and the
//! table shows the median over rounds of the time per call and the ratio.
//! Run: `target/release/tc-run -n 2 -- target/release/examples/bench_all_gather_p`
//! (rank 0 prints; `TC_BENCH_ROUNDS`, `TC_BENCH_ITERS` and `TC_BENCH_BYTES`
//! (one size) override). `scripts/bench-all-gather-p.sh` also counts the
//! instructions per call with callgrind on one rank.

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::time::Instant;
use torchcomm::capi::tc_device_t;
use torchcomm::capi::{
    tc_all_gather_p_exec, tc_all_gather_p_free, tc_all_gather_p_init, tc_all_gather_p_t,
};
use torchcomm::capi::{tc_all_gather_single, tc_barrier};
use torchcomm::capi::{tc_comm_destroy, tc_comm_finalize, tc_comm_new, tc_comm_t};
use torchcomm::DType;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ok(rc: i32, what: &str) {
    if rc != 0 {
        let detail = unsafe { std::ffi::CStr::from_ptr(torchcomm::capi::tc_last_error()) };
        panic!("{what}: {rc}: {}", detail.to_string_lossy());
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rounds = env("TC_BENCH_ROUNDS", 15);
    let iters = env("TC_BENCH_ITERS", 300);
    let mut comm: *mut tc_comm_t = null_mut();
    let cpu = tc_device_t {
        r#type: 0,
        index: 0,
    };
    ok(
        tc_comm_new(c"gloo".as_ptr(), cpu, null(), &mut comm),
        "tc_comm_new",
    );
    let (mut rank, mut size) = (0, 0);
    torchcomm::capi::tc_comm_get_rank(comm, &mut rank);
    torchcomm::capi::tc_comm_get_size(comm, &mut size);
    let f32_code = DType::F32.to_c();
    if rank == 0 {
        println!(
            "persistent all-gather vs all_gather_single, gloo, {size} ranks, float32; \
             median of {rounds} rounds x {iters} calls, interleaved"
        );
        println!(
            "{:>10} {:>16} {:>16} {:>8}",
            "bytes/rank", "plain us/call", "persist us/call", "speedup"
        );
    }
    let sizes = match std::env::var("TC_BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(b) => vec![b],
        None => vec![4usize, 64, 512, 4096, 32768],
    };
    for bytes in sizes {
        let count = bytes / 4;
        let input = vec![rank as f32; count];
        let mut output = vec![0f32; count * size as usize];
        let out_ptr = output.as_mut_ptr() as *mut c_void;
        let mut handle: *mut tc_all_gather_p_t = null_mut();
        ok(
            tc_all_gather_p_init(comm, out_ptr, count, f32_code, null(), &mut handle),
            "tc_all_gather_p_init",
        );
        let in_ptr = input.as_ptr() as *const c_void;
        let plain = || {
            for _ in 0..iters {
                let rc = tc_all_gather_single(
                    comm,
                    out_ptr,
                    in_ptr,
                    count,
                    f32_code,
                    null(),
                    null_mut(),
                );
                ok(rc, "tc_all_gather_single");
            }
        };
        let persistent = || {
            for _ in 0..iters {
                ok(
                    tc_all_gather_p_exec(handle, in_ptr, null(), null_mut()),
                    "tc_all_gather_p_exec",
                );
            }
        };
        let time = |f: &dyn Fn()| {
            ok(tc_barrier(comm, null(), null_mut()), "tc_barrier");
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6 / iters as f64
        };
        plain();
        persistent();
        let (mut p, mut q) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            if round % 2 == 0 {
                p.push(time(&plain));
                q.push(time(&persistent));
            } else {
                q.push(time(&persistent));
                p.push(time(&plain));
            }
        }
        let r = (0..size as usize).all(|r| {
            output[r * count..(r + 1) * count]
                .iter()
                .all(|x| *x == r as f32)
        });
        assert!(r, "wrong all-gather result");
        tc_all_gather_p_free(handle);
        if rank == 0 {
            let (mp, mq) = (median(&mut p), median(&mut q));
            println!("{bytes:>10} {mp:>16.2} {mq:>16.2} {:>7.2}x", mp / mq);
        }
    }
    ok(tc_comm_finalize(comm), "tc_comm_finalize");
    tc_comm_destroy(comm);
}
