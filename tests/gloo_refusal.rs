//! A collective that one rank refuses (a bad argument, an unknown dtype, a
//! NULL list, options of version 0) fails on every rank, with real
//! processes, on both paths of the gloo backend: the refusing rank takes
//! its place in the sequence and its peers fail well before their timeout
//! (20 s) with an error naming the refusing rank and the argument. Through
//! shared memory every rank stays in step (the next call gives the right
//! data); over Gloo (`TORCHCOMM_GLOO_SHM=0`) the comm fails cleanly after.
//! The families built on collectives are covered: coalesced broadcast,
//! reducer set-up, sparse all-reduce, persistent all-gather.
//!
//! And a rank that gives up waiting withdraws its part: a rank arriving
//! after its peers timed out fails at once, naming them, instead of
//! completing with what they left in shared memory.

mod capi_common;
mod gloo_common;

use capi_common::{last_error, reducer_new};
use gloo_common::*;
use std::ffi::c_void;
use std::time::{Duration, Instant};
use torchcomm::capi::*;
use torchcomm::{DType, ReduceOp};

/// The comm's timeout: the peers of a refusing rank must fail long before.
const TIMEOUT_MS: i64 = 20_000;
/// "Well before the timeout" on a loaded 2-core machine.
const WELL_BEFORE: Duration = Duration::from_secs(8);

fn shm_path() -> bool {
    std::env::var("TORCHCOMM_GLOO_SHM").as_deref() != Ok("0")
}

fn new_comm(name: &str) -> *mut tc_comm_t {
    capi_common::new_comm_with_timeout(name, TIMEOUT_MS)
}

fn f32s(v: &mut [f32]) -> *mut c_void {
    v.as_mut_ptr().cast()
}

fn broadcast(comm: *mut tc_comm_t, buf: &mut [f32]) -> i32 {
    tc_broadcast(
        comm,
        f32s(buf),
        buf.len(),
        TC_FLOAT32,
        0,
        std::ptr::null(),
        std::ptr::null_mut(),
    )
}

/// Each case's call: `refuse` on the refusing rank, a valid call elsewhere.
fn call(case: &str, comm: *mut tc_comm_t, refuse: bool) -> i32 {
    let me = rank() as usize;
    let n = size() as usize;
    let mut buf = vec![1.0f32; 8];
    let opts = tc_op_options_t::defaults();
    match case {
        "coalesced-dtype" => {
            let ptrs = [f32s(&mut buf)];
            let counts = [8usize];
            let dtypes = [if refuse { 99 } else { TC_FLOAT32 }];
            tc_broadcast_coalesced(
                comm,
                ptrs.as_ptr(),
                counts.as_ptr(),
                dtypes.as_ptr(),
                1,
                1 << 20,
                0,
                &opts,
                std::ptr::null_mut(),
            )
        }
        "all-gather-v-counts" => {
            let counts = vec![2usize; n];
            let mut out = vec![0f32; 2 * n];
            tc_all_gather_v(
                comm,
                f32s(&mut out),
                if refuse {
                    std::ptr::null()
                } else {
                    counts.as_ptr()
                },
                buf.as_ptr().cast(),
                TC_FLOAT32,
                &opts,
                std::ptr::null_mut(),
            )
        }
        "all-reduce-version" => {
            let mut opts = opts;
            if refuse {
                opts.version = 0;
            }
            tc_all_reduce(
                comm,
                f32s(&mut buf),
                8,
                TC_FLOAT32,
                tc_reduce_op_t {
                    kind: TC_SUM,
                    ..unsafe { std::mem::zeroed() }
                },
                &opts,
                std::ptr::null_mut(),
            )
        }
        "sparse-null" => {
            let shape = [4i64];
            let indices = [me as i64];
            let values = [1.0f32];
            let input = tc_sparse_coo_t {
                sparse_dim: 1,
                dense_dim: 0,
                shape: shape.as_ptr(),
                nnz: 1,
                indices: indices.as_ptr(),
                values: values.as_ptr().cast(),
                dtype: TC_FLOAT32,
            };
            let mut out: tc_sparse_coo_t = unsafe { std::mem::zeroed() };
            tc_sparse_all_reduce(
                comm,
                if refuse { std::ptr::null() } else { &input },
                tc_reduce_op_t {
                    kind: TC_SUM,
                    ..unsafe { std::mem::zeroed() }
                },
                &mut out,
                &opts,
                std::ptr::null_mut(),
            )
        }
        "reducer-new" => {
            let grads = [f32s(&mut buf)];
            let counts = [8usize];
            let dtypes = [TC_FLOAT32];
            let mut o = tc_reducer_options_t::defaults();
            if refuse {
                o.gradient_as_bucket_view = 2;
            }
            let (rc, r) = reducer_new(comm, Some(&grads), &counts, &dtypes, &o);
            if rc == TC_SUCCESS {
                tc_reducer_free(r);
            }
            rc
        }
        "persistent-exec" => {
            let mut out = vec![0f32; 8 * n];
            let mut p: *mut tc_all_gather_p_t = std::ptr::null_mut();
            let rc = tc_all_gather_p_init(
                comm,
                f32s(&mut out),
                8,
                TC_FLOAT32,
                std::ptr::null(),
                &mut p,
            );
            assert_eq!(rc, TC_SUCCESS, "{}", last_error());
            let input: *const c_void = if refuse {
                std::ptr::null()
            } else {
                buf.as_ptr().cast()
            };
            let rc = tc_all_gather_p_exec(p, input, std::ptr::null(), std::ptr::null_mut());
            tc_all_gather_p_free(p);
            rc
        }
        other => panic!("unknown case {other}"),
    }
}

/// The argument the refusing rank's error names.
fn argument(case: &str) -> &'static str {
    match case {
        "coalesced-dtype" => "'dtypes[0]'",
        "all-gather-v-counts" => "'counts'",
        "all-reduce-version" => "'opts",
        "sparse-null" => "'input'",
        "reducer-new" => "'opts.gradient_as_bucket_view'",
        "persistent-exec" => "'input'",
        other => panic!("unknown case {other}"),
    }
}

/// Every rank refuses the same call: each gets its own error, and the comm
/// stays usable on both paths.
fn every_rank_refuses_child() {
    let comm = new_comm("refusal-every-rank");
    let me = rank();
    let start = Instant::now();
    let rc = call("coalesced-dtype", comm, true);
    let took = start.elapsed();
    let err = last_error();
    println!(
        "RESULT every rank refuses: rc={rc} ms={} {err}",
        took.as_millis()
    );
    assert_eq!(rc, TC_ERR_INVALID_ARGUMENT, "rank {me}: {err}");
    assert!(
        err.contains("'dtypes[0]'") && !err.contains("refused this call"),
        "{err}"
    );
    assert!(took < WELL_BEFORE, "rank {me}: took {took:?}");
    let mut x = vec![if me == 0 { 2.0f32 } else { 0.0 }; 8];
    assert_eq!(
        broadcast(comm, &mut x),
        TC_SUCCESS,
        "rank {me}: {}",
        last_error()
    );
    assert_eq!(x, vec![2.0f32; 8], "rank {me}: the ranks are out of step");
    println!("RESULT in step afterwards");
    finish(comm);
}

/// Finalizes before destroying: a comm destroyed unfinalized is aborted,
/// and its abort fails the peers' calls still in flight.
fn finish(comm: *mut tc_comm_t) {
    assert_eq!(tc_comm_finalize(comm), TC_SUCCESS, "{}", last_error());
    tc_comm_destroy(comm);
}

fn refusal_child() {
    let case = std::env::var("TC_REFUSAL_CASE").unwrap();
    let comm = new_comm(&format!("refusal-{case}"));
    let (me, n) = (rank(), size());
    let refuser = n - 1;
    let arg = argument(&case);
    let start = Instant::now();
    let rc = call(&case, comm, me == refuser);
    let took = start.elapsed();
    let err = last_error();
    println!("RESULT {case} rc={rc} ms={} {err}", took.as_millis());
    assert_ne!(rc, TC_SUCCESS, "rank {me}: the call succeeded");
    assert!(err.contains(arg), "rank {me}: {err}");
    if me != refuser {
        assert!(
            err.contains(&format!("rank {refuser} refused this call")),
            "rank {me}: {err}"
        );
        assert!(!err.contains("does not match"), "rank {me}: {err}");
        assert!(
            took < WELL_BEFORE,
            "rank {me}: failed after {took:?}: {err}"
        );
    }
    // The next call pairs with the peers' next call: the root's new value
    // lands everywhere (shared memory); over Gloo the comm is closed.
    let mut x = vec![if me == 0 { 2.0f32 } else { 0.0 }; 8];
    let rc = broadcast(comm, &mut x);
    if shm_path() {
        assert_eq!(rc, TC_SUCCESS, "rank {me}: {}", last_error());
        assert_eq!(x, vec![2.0f32; 8], "rank {me}: the ranks are out of step");
        println!("RESULT in step afterwards");
        // Finalize reports the call that failed here (refused elsewhere).
        let rc = tc_comm_finalize(comm);
        let err = last_error();
        assert!(
            rc == TC_SUCCESS || err.contains("refused this call"),
            "rank {me}: {err}"
        );
        tc_comm_destroy(comm);
    } else {
        assert_ne!(rc, TC_SUCCESS, "rank {me}: the closed comm was used");
        println!("RESULT afterwards: {}", last_error());
        tc_comm_destroy(comm);
    }
}

/// Rank 0 arrives `LATE` after ranks 1 and 2, whose call gives up after
/// `SHORT` (2 s): rank 0's call (timeout 20 s) must fail at once, naming
/// who gave up, not complete with the contributions left behind.
fn late_child() {
    const SHORT: Duration = Duration::from_secs(2);
    const LATE: Duration = Duration::from_millis(2600);
    let comm = child_comm("late", Duration::from_millis(TIMEOUT_MS as u64));
    let me = comm.rank();
    run(&comm, torchcomm::Op::Barrier).unwrap();
    let mut x = vec![1.0f32 + me as f32; 8];
    let timeout = if me == 0 {
        std::thread::sleep(LATE);
        Duration::from_millis(TIMEOUT_MS as u64)
    } else {
        SHORT
    };
    let op = torchcomm::Op::all_reduce(
        torchcomm::Ptr(x.as_mut_ptr().cast()),
        8,
        DType::F32,
        ReduceOp::SUM,
    );
    let opts = torchcomm::OpOptions {
        timeout: Some(timeout),
        ..Default::default()
    };
    let start = Instant::now();
    let r = comm.submit(op, &opts).map(|_| ());
    let took = start.elapsed();
    let e = r.expect_err("the call must fail on every rank");
    println!("RESULT late rank {me}: ms={} {e}", took.as_millis());
    if me != 0 {
        // Alive, so that rank 0 learns from the comm, not from the exit.
        std::thread::sleep(LATE + Duration::from_secs(2));
        return;
    }
    if me == 0 {
        assert!(took < WELL_BEFORE, "failed after {took:?}: {e}");
        let msg = &e.message;
        assert!(msg.contains("gave up"), "{e}");
        if shm_path() {
            assert!(msg.contains("rank(s) 1, 2 gave up"), "{e}");
        } else {
            assert!(msg.contains("rank 1 (") && msg.contains("rank 2 ("), "{e}");
        }
    }
}

extern "C" fn sleep_past_the_timeout(
    _info: *const torchcomm::capi::tc_op_info_t,
    _user_data: *mut c_void,
) {
    std::thread::sleep(Duration::from_millis(2600));
}

/// As [`late_child`], rank 0 late through a pre hook that sleeps past its
/// peers' timeout (2 s): its call must still fail well before its own
/// timeout (20 s), naming who gave up.
fn late_hook_child() {
    let comm = new_comm("late-hook");
    let me = rank();
    let mut opts = tc_op_options_t::defaults();
    if me == 0 {
        let mut id = 0u64;
        let rc = torchcomm::capi::tc_comm_add_pre_hook(
            comm,
            Some(sleep_past_the_timeout),
            std::ptr::null_mut(),
            &mut id,
        );
        assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    } else {
        opts.timeout_ms = 2000;
    }
    let mut x = vec![1.0f32; 8];
    let start = Instant::now();
    let rc = tc_all_reduce(
        comm,
        f32s(&mut x),
        8,
        TC_FLOAT32,
        tc_reduce_op_t {
            kind: TC_SUM,
            premul_factor: 1.0,
            premul_factor_ptr: std::ptr::null(),
        },
        &opts,
        std::ptr::null_mut(),
    );
    let took = start.elapsed();
    let err = last_error();
    println!(
        "RESULT late-hook rank {me}: rc={rc} ms={} {err}",
        took.as_millis()
    );
    assert_ne!(rc, TC_SUCCESS, "rank {me}: the call succeeded");
    if me != 0 {
        std::thread::sleep(Duration::from_secs(5));
    } else {
        assert!(
            took < Duration::from_millis(2600) + WELL_BEFORE,
            "{took:?}: {err}"
        );
        assert!(err.contains("gave up"), "{err}");
    }
    tc_comm_destroy(comm);
}

fn launch_case(test: &str, case: &str, n: usize, role: &str) {
    let mut env = vec![("TC_REFUSAL_CASE", case)];
    if role != "shm" {
        env.push(("TORCHCOMM_GLOO_SHM", "0"));
    }
    if role == "ucx" {
        env.extend([("TORCHCOMM_HOST_TRANSPORT", "ucx"), ("UCX_TLS", "tcp,self")]);
    }
    let out = launch(test, role, n, &env, Duration::from_secs(120));
    for o in &out {
        for r in o.results() {
            eprintln!("{case} {role} rank {}: {r}", o.rank);
        }
    }
    for o in &out {
        assert!(o.ok(), "{case} on the {role} path: {}", o.describe());
        assert!(!o.results().is_empty(), "{}", o.describe());
    }
}

/// The child's job, when this process is one.
fn child() -> bool {
    if role().is_none() {
        return false;
    }
    match std::env::var("TC_REFUSAL_CASE").unwrap().as_str() {
        "late" => late_child(),
        "late-hook" => late_hook_child(),
        "every-rank" => every_rank_refuses_child(),
        _ => refusal_child(),
    }
    true
}

fn both_paths(test: &str, case: &str, n: usize) {
    if child() {
        return;
    }
    launch_case(test, case, n, "shm");
    launch_case(test, case, n, "gloo");
    // The UCX host transport (where libucp.so.0 is installed): the peers
    // wait in UCX, which the refusing rank's failure notice ends.
    if ucx_installed() {
        launch_case(test, case, n, "ucx");
    }
}

fn ucx_installed() -> bool {
    let name = std::ffi::CString::new("libucp.so.0").unwrap();
    // SAFETY: a valid C string; the handle is kept.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        println!("SKIPPED the UCX host transport: libucp.so.0 is not installed");
    }
    !h.is_null()
}

#[test]
fn refused_coalesced_dtype_2_ranks() {
    both_paths("refused_coalesced_dtype_2_ranks", "coalesced-dtype", 2);
}

#[test]
fn refused_all_gather_v_counts_3_ranks() {
    both_paths(
        "refused_all_gather_v_counts_3_ranks",
        "all-gather-v-counts",
        3,
    );
}

#[test]
fn refused_all_reduce_options_version_2_ranks() {
    both_paths(
        "refused_all_reduce_options_version_2_ranks",
        "all-reduce-version",
        2,
    );
}

#[test]
fn refused_sparse_null_input_2_ranks() {
    both_paths("refused_sparse_null_input_2_ranks", "sparse-null", 2);
}

#[test]
fn refused_reducer_new_3_ranks() {
    both_paths("refused_reducer_new_3_ranks", "reducer-new", 3);
}

#[test]
fn refused_persistent_all_gather_exec_2_ranks() {
    both_paths(
        "refused_persistent_all_gather_exec_2_ranks",
        "persistent-exec",
        2,
    );
}

#[test]
fn late_rank_fails_when_peers_gave_up_3_ranks() {
    both_paths("late_rank_fails_when_peers_gave_up_3_ranks", "late", 3);
}

#[test]
fn late_rank_through_a_sleeping_pre_hook_3_ranks() {
    both_paths(
        "late_rank_through_a_sleeping_pre_hook_3_ranks",
        "late-hook",
        3,
    );
}

#[test]
fn refused_on_every_rank_keeps_the_comm_3_ranks() {
    both_paths(
        "refused_on_every_rank_keeps_the_comm_3_ranks",
        "every-rank",
        3,
    );
}
