//! The reducer launches a host bucket piece by piece with the built-in
//! all-reduce: a piece goes out as soon as the gradients under it are
//! marked, before the bucket is complete, in the order a whole bucket would
//! have issued them. Real processes (2, 3, 4 ranks); every element checked;
//! the operations a pre hook saw must cover each bucket element exactly once.

mod capi_common;
#[macro_use]
mod gloo_common;
mod reducer_values;

use capi_common::{finalize_and_destroy, last_error, new_comm, reducer_new};
use gloo_common::*;
use reducer_values::{reference, value};
use std::ffi::{c_void, CStr};
use std::sync::Mutex;
use torchcomm::capi::*;

/// Float32 elements of each gradient: 300,000 (about 1.1 MiB), so that a
/// 2 MiB piece spans two gradients and a gradient straddles pieces.
const GRAD: usize = 300_000;
const GRADS: usize = 24;
/// Float32 elements in a piece of the built-in hook (2 MiB).
const PIECE: usize = (2 << 20) / 4;

/// (first element address, count) of every all_reduce issued.
static ISSUED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

extern "C" fn record(info: *const tc_op_info_t, _: *mut c_void) {
    // SAFETY: the library passes a valid record for the call's duration.
    let info = unsafe { &*info };
    let name = unsafe { CStr::from_ptr(info.op_name) }.to_str().unwrap();
    if name == "all_reduce" && info.num_inputs == 1 {
        let buf = unsafe { &*info.inputs };
        ISSUED.lock().unwrap().push((buf.ptr as usize, buf.count));
    }
}

fn fill(grads: &mut [Vec<f32>], world: usize, me: usize, iter: usize) {
    for (g, v) in grads.iter_mut().enumerate() {
        v.iter_mut()
            .enumerate()
            .for_each(|(e, x)| *x = value(world, me, g, e, iter));
    }
}

fn check(grads: &[Vec<f32>], world: usize, iter: usize) {
    for (g, v) in grads.iter().enumerate() {
        for (e, &x) in v.iter().enumerate() {
            let want = reference(world, g, e, iter);
            assert_eq!(x, want, "iteration {iter} grad {g} element {e}");
        }
    }
}

/// Every issued all_reduce is at most a piece, and together they cover
/// every gradient element once.
fn check_issued(total: usize) {
    let mut issued = ISSUED.lock().unwrap();
    let counts: Vec<usize> = issued.iter().map(|&(_, c)| c).collect();
    assert!(counts.iter().all(|&c| c <= PIECE), "{counts:?}");
    issued.sort();
    for w in issued.windows(2) {
        assert!(w[0].0 + 4 * w[0].1 <= w[1].0, "overlapping pieces {w:?}");
    }
    assert_eq!(counts.iter().sum::<usize>(), total, "elements reduced");
    issued.clear();
}

fn parts_child() {
    let comm = new_comm("reducer-parts");
    let (me, world) = (rank() as usize, size() as usize);
    let mut id = 0;
    let rc = tc_comm_add_pre_hook(comm, Some(record), std::ptr::null_mut(), &mut id);
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    let mut grads: Vec<Vec<f32>> = (0..GRADS).map(|_| vec![0f32; GRAD]).collect();
    let ptrs: Vec<*mut c_void> = grads.iter_mut().map(|g| g.as_mut_ptr().cast()).collect();
    let counts = [GRAD; GRADS];
    let dtypes = [TC_FLOAT32; GRADS];
    // One 1 MiB first bucket (the last gradient), then one bucket of the rest.
    let mut opts = tc_reducer_options_t::defaults();
    opts.bucket_cap_bytes = 64 << 20;
    let (rc, r) = reducer_new(comm, Some(&ptrs), &counts, &dtypes, &opts);
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    let mut nb = 0;
    assert_eq!(tc_reducer_num_buckets(r, &mut nb), TC_SUCCESS);
    assert_eq!(nb, 2);
    ISSUED.lock().unwrap().clear();
    // In backward order: after the first bucket and four gradients of the
    // second (1.2 M elements), its first two pieces are out.
    fill(&mut grads, world, me, 0);
    for (k, i) in (0..GRADS).rev().enumerate() {
        assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
        if k == 4 {
            let n = ISSUED.lock().unwrap().len();
            assert_eq!(n, 1 + 2, "pieces issued after 5 of {GRADS} gradients");
        }
    }
    assert_eq!(tc_reducer_finalize(r), TC_SUCCESS, "{}", last_error());
    check(&grads, world, 0);
    check_issued(GRADS * GRAD);
    // Out of order: the pieces still go out front to back; same results.
    fill(&mut grads, world, me, 1);
    for i in [3, 0, 23, 1, 22, 2, 21].into_iter().chain((4..21).rev()) {
        assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
    }
    assert_eq!(tc_reducer_finalize(r), TC_SUCCESS, "{}", last_error());
    check(&grads, world, 1);
    check_issued(GRADS * GRAD);
    // A gradient never marked in the middle: every rank fails, nothing is
    // written back, and the next iteration is right.
    fill(&mut grads, world, me, 2);
    for i in (0..GRADS).rev().filter(|&i| i != 12) {
        assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
    }
    assert_eq!(tc_reducer_finalize(r), TC_ERR_INVALID_USAGE);
    assert!(
        last_error().contains("never marked ready (rank 0: 12"),
        "{}",
        last_error()
    );
    let untouched = (0..GRAD).all(|e| grads[5][e] == value(world, me, 5, e, 2));
    assert!(untouched, "a failed iteration wrote back");
    check_issued(GRADS * GRAD);
    fill(&mut grads, world, me, 3);
    for i in (0..GRADS).rev() {
        assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
    }
    assert_eq!(tc_reducer_finalize(r), TC_SUCCESS, "{}", last_error());
    check(&grads, world, 3);
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT parts ok");
}

world_tests! {
    reducer_parts_world_2: "parts", parts_child, 2;
    reducer_parts_world_3: "parts", parts_child, 3;
    reducer_parts_world_4: "parts", parts_child, 4;
}
