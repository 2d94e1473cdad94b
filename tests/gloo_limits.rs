//! Requests at the limits, with real processes (issue 25): allocations a
//! caller sizes fail with `TC_ERR_OUT_OF_MEMORY` under a memory limit
//! (`RLIMIT_AS`, so the outcome does not depend on the machine's memory or
//! overcommit) instead of aborting; counts no array can have are refused;
//! a failed reducer finalize writes nothing back; calls from inside hooks
//! that used to hang are refused at once; a slow post hook delays an
//! operation without failing it; PowerSGD's epsilon is checked as given; a
//! zero-byte window transfer does nothing whatever its offset.
//!
//! The hang cases run under a 30 s limit for the whole job: each refused call
//! returns at once, so a hang is a failure well before it.

mod capi_common;
#[macro_use]
mod gloo_common;

use capi_common::{finalize_and_destroy, last_error, new_comm, new_comm_with_timeout, reducer_new};
use gloo_common::*;
use std::ffi::c_void;
use std::time::{Duration, Instant};
use torchcomm::capi::*;

const SUM: tc_reduce_op_t = tc_reduce_op_t {
    kind: TC_SUM,
    premul_factor: 1.0,
    premul_factor_ptr: std::ptr::null(),
};

/// Caps this process's address space at `bytes`.
fn limit_memory(bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
}

fn async_opts() -> tc_op_options_t {
    let mut o = tc_op_options_t::defaults();
    o.async_op = 1;
    o
}

/// Blocking all-reduce (sum) of one float32 per rank, checked.
fn check_all_reduce(comm: *mut tc_comm_t) {
    let mut x = [rank() as f32 + 1.0];
    let rc = tc_all_reduce(
        comm,
        x.as_mut_ptr().cast(),
        1,
        TC_FLOAT32,
        SUM,
        std::ptr::null(),
        std::ptr::null_mut(),
    );
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    let n = size() as f32;
    assert_eq!(x[0], n * (n + 1.0) / 2.0);
}

fn reducer(
    comm: *mut tc_comm_t,
    grads: &mut [Vec<f32>],
    opts: &tc_reducer_options_t,
) -> *mut tc_reducer_t {
    let ptrs: Vec<*mut c_void> = grads.iter_mut().map(|g| g.as_mut_ptr().cast()).collect();
    let counts: Vec<usize> = grads.iter().map(|g| g.len()).collect();
    let dtypes = vec![TC_FLOAT32; grads.len()];
    let (rc, r) = reducer_new(comm, Some(&ptrs), &counts, &dtypes, opts);
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    r
}

// ---- item 3: a failed finalize writes nothing back ---------------------------

#[derive(Clone, Copy, PartialEq)]
enum Spoil {
    /// Bucket 1's buffer replaced by an int32 one.
    Int32Buffer,
    /// The last bucket's count made one smaller.
    ShrunkCount,
}

struct SpoilingHook {
    spoil: Spoil,
    ints: Vec<i32>,
}

unsafe extern "C" fn spoiling_hook(
    state: *mut c_void,
    comm: *mut tc_comm_t,
    bucket: *mut tc_grad_bucket_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    let (s, b) = (&mut *state.cast::<SpoilingHook>(), &mut *bucket);
    match s.spoil {
        Spoil::Int32Buffer if b.index == 1 => {
            s.ints = vec![1; b.count];
            b.buffer = s.ints.as_mut_ptr().cast();
            b.dtype = TC_INT32;
        }
        Spoil::ShrunkCount if b.is_last != 0 => b.count -= 1,
        _ => {}
    }
    tc_all_reduce(comm, b.buffer, b.count, b.dtype, SUM, &async_opts(), work)
}

fn finalize_child() {
    let comm = new_comm("limits-finalize");
    let me = rank() as f32;
    let own = |g: usize| vec![me + 10.0 * g as f32; 64];
    // One 256-byte gradient per bucket: bucket 0 holds gradient 2.
    let mut grads: Vec<Vec<f32>> = (0..3).map(own).collect();
    let mut opts = tc_reducer_options_t::defaults();
    opts.first_bucket_bytes = 256;
    opts.bucket_cap_bytes = 256;
    let r = reducer(comm, &mut grads, &opts);
    let mut nb = 0;
    assert_eq!(tc_reducer_num_buckets(r, &mut nb), TC_SUCCESS);
    assert_eq!(nb, 3);
    for spoil in [Spoil::Int32Buffer, Spoil::ShrunkCount] {
        let mut hook = SpoilingHook {
            spoil,
            ints: Vec::new(),
        };
        let rc = tc_reducer_set_hook(
            r,
            Some(spoiling_hook),
            (&mut hook as *mut SpoilingHook).cast(),
        );
        assert_eq!(rc, TC_SUCCESS, "{}", last_error());
        for g in (0..3).rev() {
            assert_eq!(tc_reducer_mark_ready(r, g), TC_SUCCESS, "{}", last_error());
        }
        let rc = tc_reducer_finalize(r);
        let message = last_error();
        // Nothing written back: gradient 2 (bucket 0, exchanged fine) too.
        for (g, grad) in grads.iter().enumerate() {
            assert_eq!(
                grad,
                &own(g),
                "gradient {g} after a failed finalize ({message})"
            );
        }
        assert!(
            rc == TC_ERR_INVALID_USAGE || rc == TC_ERR_REMOTE,
            "{rc} {message}"
        );
        let want = match spoil {
            Spoil::Int32Buffer => "bucket 1",
            Spoil::ShrunkCount => "bucket 2",
        };
        assert!(rc == TC_ERR_REMOTE || message.contains(want), "{message}");
        // The reducer stays usable.
        assert_eq!(
            tc_reducer_set_builtin_hook(r, TC_HOOK_ALLREDUCE),
            TC_SUCCESS
        );
        for g in (0..3).rev() {
            assert_eq!(tc_reducer_mark_ready(r, g), TC_SUCCESS, "{}", last_error());
        }
        assert_eq!(tc_reducer_finalize(r), TC_SUCCESS, "{}", last_error());
        let n = size() as f32;
        for (g, grad) in grads.iter_mut().enumerate() {
            let mean = (n - 1.0) / 2.0 + 10.0 * g as f32;
            assert!(grad.iter().all(|&x| x == mean), "gradient {g}: {grad:?}");
            grad.copy_from_slice(&own(g));
        }
    }
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT finalize ok");
}

// ---- item 6: allocations a caller sizes, under RLIMIT_AS ----------------------

fn out_of_memory_reducer_child() {
    limit_memory(16 << 30);
    let comm = new_comm("limits-oom-reducer");
    // Bucket-view reducer with one float32 gradient of 2^34 elements (64 GiB).
    let mut opts = tc_reducer_options_t::defaults();
    opts.gradient_as_bucket_view = 1;
    let (counts, dtypes) = ([1usize << 34], [TC_FLOAT32]);
    let (rc, r) = reducer_new(comm, None, &counts, &dtypes, &opts);
    assert_eq!(rc, TC_ERR_OUT_OF_MEMORY, "{}", last_error());
    assert!(
        last_error().contains("'counts'") && last_error().contains("68719476736 bytes"),
        "{}",
        last_error()
    );
    assert!(r.is_null());
    // The comm is still usable.
    check_all_reduce(comm);
    finalize_and_destroy(comm);
    println!("RESULT out_of_memory_reducer ok");
}

fn out_of_memory_sparse_child() {
    limit_memory(16 << 30);
    let comm = new_comm("limits-oom-sparse");
    // Sparse all-reduce with nnz 2^36 and 2^40: refused before an index is
    // read (the arrays are far smaller than nnz says).
    let (shape, idx, vals) = ([i64::MAX], [0i64; 4], [0f32; 4]);
    for nnz in [1usize << 36, 1 << 40] {
        let input = tc_sparse_coo_t {
            sparse_dim: 1,
            dense_dim: 0,
            shape: shape.as_ptr(),
            nnz,
            indices: idx.as_ptr(),
            values: vals.as_ptr().cast(),
            dtype: TC_FLOAT32,
        };
        let mut out: tc_sparse_coo_t = unsafe { std::mem::zeroed() };
        let rc = tc_sparse_all_reduce(
            comm,
            &input,
            SUM,
            &mut out,
            std::ptr::null(),
            std::ptr::null_mut(),
        );
        assert_eq!(rc, TC_ERR_OUT_OF_MEMORY, "{}", last_error());
        let bytes = (nnz * 8).to_string();
        assert!(
            last_error().contains("'input.nnz'") && last_error().contains(&bytes),
            "{}",
            last_error()
        );
    }
    // The comm is still usable.
    check_all_reduce(comm);
    finalize_and_destroy(comm);
    println!("RESULT out_of_memory_sparse ok");
}

/// `bytes` of address space, never touched here (no memory is used until
/// written).
fn reserve(bytes: usize) -> *mut c_void {
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p
}

/// This process's address space now (VmSize), in bytes.
fn address_space() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// A list-form all-gather of 1 GiB per rank needs a 2 GiB scratch (the
/// ranks' blocks packed) on both paths. Rank 1, its address space capped
/// just above its buffers, fails with TC_ERR_OUT_OF_MEMORY naming the
/// bytes (it aborted); rank 0 fails at once naming rank 1, never pairing
/// the call with rank 1's next one. Through shared memory the comm stays
/// usable; over Gloo the partial refusal closes it on both ranks.
fn out_of_memory_scratch_child() {
    let shm = std::env::var("TORCHCOMM_GLOO_SHM").as_deref() != Ok("0");
    let comm = new_comm_with_timeout("limits-oom-scratch", 60_000);
    let count = 1usize << 28; // float32: 1 GiB
    let input = reserve(count * 4);
    let outputs = [reserve(count * 4), reserve(count * 4)];
    if rank() == 1 {
        limit_memory(address_space() + (512 << 20));
    }
    let t0 = Instant::now();
    let rc = tc_all_gather(
        comm,
        outputs.as_ptr(),
        input,
        count,
        TC_FLOAT32,
        std::ptr::null(),
        std::ptr::null_mut(),
    );
    let (took, err) = (t0.elapsed(), last_error());
    println!("rank {} took {took:?}: {err}", rank());
    if rank() == 1 {
        assert_eq!(rc, TC_ERR_OUT_OF_MEMORY, "{err}");
        assert!(
            err.contains("2147483648 bytes") && err.contains("scratch"),
            "{err}"
        );
    } else {
        assert_ne!(rc, TC_SUCCESS);
        assert!(took < Duration::from_secs(20), "{took:?}: {err}");
        assert!(err.contains("rank 1"), "{err}");
    }
    let mut x = [rank() as f32 + 1.0];
    let rc = tc_all_reduce(
        comm,
        x.as_mut_ptr().cast(),
        1,
        TC_FLOAT32,
        SUM,
        std::ptr::null(),
        std::ptr::null_mut(),
    );
    match shm {
        true => {
            assert_eq!(rc, TC_SUCCESS, "{}", last_error());
            assert_eq!(x[0], 3.0);
        }
        false => assert_ne!(rc, TC_SUCCESS, "the next call paired with a failed one"),
    }
    tc_comm_destroy(comm);
    println!("RESULT out_of_memory_scratch ok");
}

#[test]
fn limits_out_of_memory_scratch_world_2() {
    for shm in [true, false] {
        match role().as_deref() {
            Some("out_of_memory_scratch") => return out_of_memory_scratch_child(),
            Some(_) => return,
            None => {}
        }
        let env: &[(&str, &str)] = if shm {
            &[]
        } else {
            &[("TORCHCOMM_GLOO_SHM", "0")]
        };
        let out = launch(
            "limits_out_of_memory_scratch_world_2",
            "out_of_memory_scratch",
            2,
            env,
            Duration::from_secs(120),
        );
        // What each rank's call said, whichever rank fails the test.
        for line in out.iter().flat_map(|o| o.stdout.lines()) {
            if line.contains(" took ") {
                eprintln!("shm {shm}: {line}");
            }
        }
        for o in &out {
            assert!(o.ok(), "shm {shm}: {}", o.describe());
            assert_eq!(o.results().len(), 1, "shm {shm}: {}", o.describe());
        }
    }
}

// ---- items 7 and 13: counts no array has; PowerSGD's epsilon ------------------

fn arguments_child() {
    let comm = new_comm("limits-arguments");
    let ranks = [1i32];
    let mut child = std::ptr::null_mut();
    let rc = tc_comm_shrink(
        comm,
        ranks.as_ptr(),
        usize::MAX,
        c"shrunk".as_ptr(),
        std::ptr::null(),
        &mut child,
    );
    assert_eq!(rc, TC_ERR_INVALID_ARGUMENT, "{}", last_error());
    assert!(last_error().contains("'exclude_ranks'"), "{}", last_error());
    let (counts, dtypes, grads) = ([4usize], [TC_FLOAT32], [std::ptr::null_mut::<c_void>()]);
    let mut r = std::ptr::null_mut();
    let rc = tc_reducer_new(
        comm,
        grads.as_ptr(),
        counts.as_ptr(),
        dtypes.as_ptr(),
        usize::MAX,
        std::ptr::null(),
        &mut r,
    );
    assert_eq!(rc, TC_ERR_INVALID_ARGUMENT, "{}", last_error());
    assert!(last_error().contains("'counts'"), "{}", last_error());
    finalize_and_destroy(comm);
    println!("RESULT arguments ok");
}

fn epsilon_child() {
    let comm = new_comm("limits-epsilon");
    let mut grads = vec![vec![1.0f32; 16]];
    let r = reducer(comm, &mut grads, &tc_reducer_options_t::defaults());
    let mut o = tc_powersgd_options_t::defaults();
    for (eps, shown) in [(1e300, "1e300"), (1e-50, "1e-50")] {
        o.orthogonalization_epsilon = eps;
        assert_eq!(
            tc_reducer_set_powersgd(r, &o),
            TC_ERR_INVALID_ARGUMENT,
            "epsilon {eps}"
        );
        assert!(
            last_error().contains(shown) && last_error().contains("float32"),
            "{}",
            last_error()
        );
    }
    for eps in [0.0, 1e-8, 1e30] {
        o.orthogonalization_epsilon = eps;
        assert_eq!(
            tc_reducer_set_powersgd(r, &o),
            TC_SUCCESS,
            "epsilon {eps}: {}",
            last_error()
        );
    }
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT epsilon ok");
}

// ---- item 9: a comm hook calling its own reducer -------------------------------

struct ReentrantHook {
    reducer: *mut tc_reducer_t,
    /// (call, result, message) of each call the hook made on its reducer.
    calls: Vec<(&'static str, tc_result_t, String)>,
}

unsafe extern "C" fn reentrant_hook(
    state: *mut c_void,
    comm: *mut tc_comm_t,
    bucket: *mut tc_grad_bucket_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    let (s, b) = (&mut *state.cast::<ReentrantHook>(), &mut *bucket);
    let rc = tc_reducer_mark_ready(s.reducer, 0);
    s.calls.push(("tc_reducer_mark_ready", rc, last_error()));
    torchcomm::capi::clear_last_error();
    tc_reducer_free(s.reducer);
    s.calls.push(("tc_reducer_free", TC_SUCCESS, last_error()));
    tc_all_reduce(comm, b.buffer, b.count, b.dtype, SUM, &async_opts(), work)
}

fn reducer_hook_child() {
    let comm = new_comm("limits-reducer-hook");
    let mut grads = vec![vec![1.0f32; 16]];
    let r = reducer(comm, &mut grads, &tc_reducer_options_t::defaults());
    let mut hook = ReentrantHook {
        reducer: r,
        calls: Vec::new(),
    };
    let rc = tc_reducer_set_hook(
        r,
        Some(reentrant_hook),
        (&mut hook as *mut ReentrantHook).cast(),
    );
    assert_eq!(rc, TC_SUCCESS);
    assert_eq!(tc_reducer_mark_ready(r, 0), TC_SUCCESS, "{}", last_error());
    assert_eq!(tc_reducer_finalize(r), TC_SUCCESS, "{}", last_error());
    assert_eq!(hook.calls.len(), 2);
    assert_eq!(hook.calls[0].1, TC_ERR_INVALID_USAGE, "{:?}", hook.calls);
    for (call, _, message) in &hook.calls {
        assert!(
            message.contains(call) && message.contains("own communication hook"),
            "{message}"
        );
    }
    // Neither call changed the reducer: the sum of ones landed, and it frees.
    assert_eq!(grads[0][0], size() as f32);
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT reducer_hook ok");
}

// ---- items 10 and 11: finalize and destroy from operation hooks ----------------

struct CallFromHook {
    comm: *mut tc_comm_t,
    done: bool,
    rc: tc_result_t,
    message: String,
}

extern "C" fn finalize_from_post_hook(_info: *const tc_op_info_t, user: *mut c_void) {
    let s = unsafe { &mut *user.cast::<CallFromHook>() };
    if !s.done {
        s.done = true;
        s.rc = tc_comm_finalize(s.comm);
        s.message = last_error();
    }
}

extern "C" fn destroy_from_pre_hook(_info: *const tc_op_info_t, user: *mut c_void) {
    let s = unsafe { &mut *user.cast::<CallFromHook>() };
    if !s.done {
        s.done = true;
        torchcomm::capi::clear_last_error();
        tc_comm_destroy(s.comm);
        s.message = last_error();
    }
}

fn comm_hooks_child() {
    let comm = new_comm("limits-comm-hooks");
    for post in [true, false] {
        let mut state = CallFromHook {
            comm,
            done: false,
            rc: TC_SUCCESS,
            message: String::new(),
        };
        let user = (&mut state as *mut CallFromHook).cast();
        let mut id = 0;
        let rc = match post {
            true => tc_comm_add_post_hook(comm, Some(finalize_from_post_hook), user, &mut id),
            false => tc_comm_add_pre_hook(comm, Some(destroy_from_pre_hook), user, &mut id),
        };
        assert_eq!(rc, TC_SUCCESS);
        let start = Instant::now();
        let mut x = [1.0f32];
        let mut w = std::ptr::null_mut();
        let rc = tc_all_reduce(
            comm,
            x.as_mut_ptr().cast(),
            1,
            TC_FLOAT32,
            SUM,
            &async_opts(),
            &mut w,
        );
        assert_eq!(rc, TC_SUCCESS, "{}", last_error());
        assert_eq!(
            tc_work_wait(w, std::ptr::null_mut()),
            TC_SUCCESS,
            "{}",
            last_error()
        );
        tc_work_free(w);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        assert!(state.done);
        let call = if post {
            "tc_comm_finalize"
        } else {
            "tc_comm_destroy"
        };
        if post {
            assert_eq!(state.rc, TC_ERR_INVALID_USAGE, "{}", state.message);
        }
        assert!(
            state.message.contains(call) && state.message.contains("inside an operation hook"),
            "{}",
            state.message
        );
        assert_eq!(x[0], size() as f32);
        assert_eq!(
            tc_comm_remove_hook(comm, id),
            TC_SUCCESS,
            "{}",
            last_error()
        );
        // The comm is as it was.
        check_all_reduce(comm);
    }
    finalize_and_destroy(comm);
    println!("RESULT comm_hooks ok");
}

// ---- item 15: a post hook slower than the timeout ------------------------------

extern "C" fn sleepy_post_hook(_info: *const tc_op_info_t, _user: *mut c_void) {
    std::thread::sleep(Duration::from_millis(4000));
}

fn slow_post_hook_child() {
    // A 2 s timeout (the watchdog adds under a second of grace); rank 0's
    // post hook takes 4 s.
    let comm = new_comm_with_timeout("limits-slow-post-hook", 2_000);
    let mut id = 0;
    if rank() == 0 {
        let rc = tc_comm_add_post_hook(comm, Some(sleepy_post_hook), std::ptr::null_mut(), &mut id);
        assert_eq!(rc, TC_SUCCESS);
    }
    let mut x = [rank() as f32 + 1.0];
    let mut w = std::ptr::null_mut();
    let rc = tc_all_reduce(
        comm,
        x.as_mut_ptr().cast(),
        1,
        TC_FLOAT32,
        SUM,
        &async_opts(),
        &mut w,
    );
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    assert_eq!(
        tc_work_wait(w, std::ptr::null_mut()),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    tc_work_free(w);
    let n = size() as f32;
    assert_eq!(x[0], n * (n + 1.0) / 2.0);
    if rank() == 0 {
        assert_eq!(tc_comm_remove_hook(comm, id), TC_SUCCESS);
    }
    finalize_and_destroy(comm);
    println!("RESULT slow_post_hook ok");
}

// ---- item 14: zero-byte window transfers ---------------------------------------

fn window_child() {
    let comm = new_comm("limits-window");
    let mut window = std::ptr::null_mut();
    assert_eq!(
        tc_window_new(comm, &mut window),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    let mut buf = [0u8; 64];
    assert_eq!(
        tc_window_register(window, buf.as_mut_ptr().cast(), 64),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    let peer = (rank() + 1) % size();
    let mut byte = [7u8];
    let null = std::ptr::null_mut();
    for offset in [64, 1000, usize::MAX] {
        let rc = tc_window_put(
            window,
            byte.as_ptr().cast(),
            0,
            peer,
            offset,
            std::ptr::null(),
            null,
        );
        assert_eq!(
            rc,
            TC_SUCCESS,
            "put of 0 bytes at {offset}: {}",
            last_error()
        );
        let rc = tc_window_get(
            window,
            byte.as_mut_ptr().cast(),
            0,
            peer,
            offset,
            std::ptr::null(),
            null,
        );
        assert_eq!(
            rc,
            TC_SUCCESS,
            "get of 0 bytes at {offset}: {}",
            last_error()
        );
    }
    // One byte past the end is still refused, and so is a bad rank.
    let rc = tc_window_put(
        window,
        byte.as_ptr().cast(),
        1,
        peer,
        64,
        std::ptr::null(),
        null,
    );
    assert_eq!(rc, TC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("'dst_offset'"), "{}", last_error());
    let rc = tc_window_put(
        window,
        byte.as_ptr().cast(),
        0,
        size(),
        0,
        std::ptr::null(),
        null,
    );
    assert_eq!(rc, TC_ERR_INVALID_ARGUMENT);
    assert_eq!(byte[0], 7);
    assert_eq!(tc_window_deregister(window), TC_SUCCESS, "{}", last_error());
    tc_window_free(window);
    finalize_and_destroy(comm);
    println!("RESULT window ok");
}

world_tests! {
    limits_failed_finalize_writes_nothing_world_2: "finalize", finalize_child, 2;
    limits_failed_finalize_writes_nothing_world_3: "finalize", finalize_child, 3;
    limits_out_of_memory_reducer_world_2: "out_of_memory_reducer", out_of_memory_reducer_child, 2;
    limits_out_of_memory_sparse_world_2: "out_of_memory_sparse", out_of_memory_sparse_child, 2;
    limits_impossible_counts_world_2: "arguments", arguments_child, 2;
    limits_powersgd_epsilon_as_given_world_2: "epsilon", epsilon_child, 2;
    limits_zero_byte_window_transfers_world_2: "window", window_child, 2;
    limits_slow_post_hook_world_2: "slow_post_hook", slow_post_hook_child, 2;
}

/// The whole job's limit where a call used to hang: each refused call
/// returns at once, so a hang fails the test well before the comm's 60 s
/// timeout.
const HANG_LIMIT: Duration = Duration::from_secs(30);

world_tests! {
    within HANG_LIMIT;
    limits_reducer_hook_calls_own_reducer_world_2: "reducer_hook", reducer_hook_child, 2;
    limits_finalize_and_destroy_from_op_hooks_world_2: "comm_hooks", comm_hooks_child, 2;
}
