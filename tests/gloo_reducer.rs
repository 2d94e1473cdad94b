//! The gradient reducer with real processes, through the C API: ResNet-50's
//! 161 parameter shapes (elements scaled down 16x to keep the suite quick;
//! mixed float32/float16/bfloat16, some empty), marked ready in reverse
//! order and shuffled, several iterations, every element checked against a
//! host reference, for every built-in hook and a compressing user hook;
//! buckets launched in order and before finalize; and the failures: double
//! and out-of-range marks, missing marks, a failing hook, layouts that
//! differ across ranks, a peer killed mid-iteration.

mod capi_common;
#[macro_use]
mod gloo_common;
mod reducer_values;

use capi_common::{finalize_and_destroy, last_error, new_comm, reducer_new};
use gloo_common::*;
use reducer_values::{reference, value};
use std::ffi::c_void;
use std::time::Duration;
use torchcomm::capi::*;
use torchcomm::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

const SCALE: usize = 16;

/// (count, dtype) of ResNet-50's parameters, scaled; every 17th is empty.
fn resnet_list() -> Vec<(usize, tc_dtype_t)> {
    let text = include_str!("data/resnet50_param_shapes.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            let shape = l.split('\t').nth(1).unwrap();
            let n: usize = shape
                .split(',')
                .map(|d| d.parse::<usize>().unwrap())
                .product();
            let dtype = match i % 5 {
                0 => TC_FLOAT16,
                1 => TC_BFLOAT16,
                _ => TC_FLOAT32,
            };
            let count = if i % 17 == 9 { 0 } else { n.div_ceil(SCALE) };
            (count, dtype)
        })
        .collect()
}

struct Grads {
    words: Vec<Vec<u64>>,
    list: Vec<(usize, tc_dtype_t)>,
}

fn es(dt: tc_dtype_t) -> usize {
    if dt == TC_FLOAT32 {
        4
    } else {
        2
    }
}

fn put(p: *mut u8, dt: tc_dtype_t, i: usize, x: f32) {
    unsafe {
        match dt {
            TC_FLOAT32 => p.cast::<f32>().add(i).write(x),
            TC_FLOAT16 => p.cast::<u16>().add(i).write(f32_to_f16(x)),
            _ => p.cast::<u16>().add(i).write(f32_to_bf16(x)),
        }
    }
}

fn get(p: *const u8, dt: tc_dtype_t, i: usize) -> f32 {
    unsafe {
        match dt {
            TC_FLOAT32 => p.cast::<f32>().add(i).read(),
            TC_FLOAT16 => f16_to_f32(p.cast::<u16>().add(i).read()),
            _ => bf16_to_f32(p.cast::<u16>().add(i).read()),
        }
    }
}

impl Grads {
    fn new(list: Vec<(usize, tc_dtype_t)>) -> Grads {
        let words = list
            .iter()
            .map(|&(c, dt)| vec![0u64; (c * es(dt)).div_ceil(8)])
            .collect();
        Grads { words, list }
    }
    fn ptrs(&mut self) -> Vec<*mut c_void> {
        self.words
            .iter_mut()
            .map(|w| w.as_mut_ptr().cast())
            .collect()
    }
    fn fill(&mut self, world: usize, rank: usize, iter: usize) {
        for g in 0..self.list.len() {
            let (c, dt) = self.list[g];
            let p = self.words[g].as_mut_ptr().cast::<u8>();
            (0..c).for_each(|e| put(p, dt, e, value(world, rank, g, e, iter)));
        }
    }
    /// Every gradient holds this rank's own iteration-`iter` values, as
    /// `fill` wrote them (rounded to its dtype): a failed iteration wrote
    /// nothing back.
    fn check_own(&self, world: usize, me: usize, iter: usize) {
        let own = |gi: usize, e: usize| {
            let mut w = [0u64];
            let dt = self.list[gi].1;
            put(w.as_mut_ptr().cast(), dt, 0, value(world, me, gi, e, iter));
            get(w.as_ptr().cast(), dt, 0)
        };
        self.check(world, iter, own);
    }

    fn check(&self, world: usize, iter: usize, expect: impl Fn(usize, usize) -> f32) {
        for g in 0..self.list.len() {
            let (c, dt) = self.list[g];
            let p = self.words[g].as_ptr().cast::<u8>();
            for e in 0..c {
                let (got, want) = (get(p, dt, e), expect(g, e));
                assert_eq!(
                    got, want,
                    "iteration {iter} grad {g} element {e} (world {world})"
                );
            }
        }
    }
}

fn new_reducer(comm: *mut tc_comm_t, g: &mut Grads) -> std::result::Result<*mut tc_reducer_t, i32> {
    let ptrs = g.ptrs();
    let counts: Vec<usize> = g.list.iter().map(|l| l.0).collect();
    let dtypes: Vec<tc_dtype_t> = g.list.iter().map(|l| l.1).collect();
    let mut opts = tc_reducer_options_t::defaults();
    opts.first_bucket_bytes = 32 << 10;
    opts.bucket_cap_bytes = 512 << 10;
    let (rc, r) = reducer_new(comm, Some(&ptrs), &counts, &dtypes, &opts);
    if rc == TC_SUCCESS {
        Ok(r)
    } else {
        Err(rc)
    }
}

/// State of the test's user hook: compresses to float16 itself, records
/// the order buckets arrive in.
struct UserHook {
    order: Vec<usize>,
    copies: Vec<Vec<u16>>,
    fail_bucket: Option<usize>,
}

unsafe extern "C" fn user_hook(
    state: *mut c_void,
    comm: *mut tc_comm_t,
    bucket: *mut tc_grad_bucket_t,
    work: *mut *mut tc_work_t,
) -> tc_result_t {
    let (s, b) = (&mut *state.cast::<UserHook>(), &mut *bucket);
    s.order.push(b.index);
    if s.fail_bucket == Some(b.index) {
        return TC_ERR_INVALID_ARGUMENT;
    }
    let world = size() as f32;
    let copy = &mut s.copies[b.index];
    copy.resize(b.count, 0);
    for (i, c) in copy.iter_mut().enumerate() {
        *c = f32_to_f16(get(b.buffer.cast(), b.dtype, i) / world);
    }
    b.buffer = copy.as_mut_ptr().cast();
    b.dtype = TC_FLOAT16;
    let mut opts = tc_op_options_t::defaults();
    opts.async_op = 1;
    let sum = tc_reduce_op_t {
        kind: TC_SUM,
        premul_factor: 1.0,
        premul_factor_ptr: std::ptr::null(),
    };
    tc_all_reduce(comm, b.buffer, b.count, TC_FLOAT16, sum, &opts, work)
}

/// A permutation of 0..n, different per iteration, the same on every rank.
fn shuffled(n: usize, seed: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed as u64 * 2654435761 + 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn hooks_child() {
    let comm = new_comm("reducer-hooks");
    let (me, world) = (rank() as usize, size() as usize);
    let mut g = Grads::new(resnet_list());
    let n = g.list.len();
    let r = new_reducer(comm, &mut g).unwrap();
    let mut nb = 0;
    assert_eq!(tc_reducer_num_buckets(r, &mut nb), TC_SUCCESS);
    assert!(nb > 8, "{nb} buckets");
    let mut user = UserHook {
        order: Vec::new(),
        copies: vec![Vec::new(); nb],
        fail_bucket: None,
    };
    let kinds = [
        TC_HOOK_ALLREDUCE,
        TC_HOOK_FP16_COMPRESS,
        TC_HOOK_BF16_COMPRESS,
        TC_HOOK_NOOP,
        -1,
    ];
    let mut iter = 0;
    for kind in kinds {
        let rc = if kind < 0 {
            tc_reducer_set_hook(r, Some(user_hook), (&mut user as *mut UserHook).cast())
        } else {
            tc_reducer_set_builtin_hook(r, kind)
        };
        assert_eq!(rc, TC_SUCCESS, "{}", last_error());
        for round in 0..3 {
            g.fill(world, me, iter);
            let order: Vec<usize> = if round == 2 {
                shuffled(n, iter)
            } else {
                (0..n).rev().collect()
            };
            for (k, &i) in order.iter().enumerate() {
                assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
                if kind < 0 && round == 0 && k == n / 2 {
                    // Half the backward pass done: the first buckets are out.
                    assert!(!user.order.is_empty(), "no bucket launched before finalize");
                }
            }
            assert_eq!(tc_reducer_finalize(r), TC_SUCCESS, "{}", last_error());
            if kind == TC_HOOK_NOOP {
                g.check(world, iter, |gi, e| {
                    let x = value(world, me, gi, e, iter);
                    let dt = g.list[gi].1;
                    let mut w = [0u64];
                    put(w.as_mut_ptr().cast(), dt, 0, x);
                    get(w.as_ptr().cast(), dt, 0)
                });
            } else {
                g.check(world, iter, |gi, e| reference(world, gi, e, iter));
            }
            if kind < 0 {
                assert_eq!(user.order, (0..nb).collect::<Vec<_>>(), "launch order");
                user.order.clear();
            }
            iter += 1;
        }
    }
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT hooks ok");
}

fn run_iteration(r: *mut tc_reducer_t, g: &mut Grads, skip: &[usize], iter: usize) -> i32 {
    g.fill(size() as usize, rank() as usize, iter);
    for i in (0..g.list.len()).rev() {
        if !skip.contains(&i) {
            assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
        }
    }
    tc_reducer_finalize(r)
}

fn errors_child() {
    let comm = new_comm("reducer-errors");
    let (me, world) = (rank() as usize, size() as usize);
    // A layout that differs on the last rank fails everyone.
    let mut list = resnet_list();
    if me == world - 1 {
        list[5].0 += 1;
    }
    let mut bad = Grads::new(list);
    assert_eq!(
        new_reducer(comm, &mut bad).unwrap_err(),
        TC_ERR_INVALID_USAGE
    );
    let want = format!("entry 5: rank 0 has {} elements", resnet_list()[5].0);
    assert!(last_error().contains(&want), "{}", last_error());

    let mut g = Grads::new(resnet_list());
    let n = g.list.len();
    let r = new_reducer(comm, &mut g).unwrap();
    assert_eq!(tc_reducer_mark_ready(r, n), TC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("'grad_index': 161 is out of range"),
        "{}",
        last_error()
    );
    assert_eq!(tc_reducer_mark_ready(r, 3), TC_SUCCESS);
    assert_eq!(tc_reducer_mark_ready(r, 3), TC_ERR_INVALID_USAGE);
    assert!(
        last_error().contains("gradient 3 was already marked"),
        "{}",
        last_error()
    );
    assert_eq!(tc_reducer_finalize(r), TC_ERR_INVALID_USAGE);
    // Rank 1 never marks gradients 7 and 100: every rank is told so.
    let skip: &[usize] = if me == 1 { &[7, 100] } else { &[] };
    let before = g.words.clone();
    assert_eq!(run_iteration(r, &mut g, skip, 1), TC_ERR_INVALID_USAGE);
    assert!(last_error().contains("rank 1: 7, 100"), "{}", last_error());
    if me != 1 {
        assert!(g.words != before, "the fill changed nothing");
    }
    // Nothing was written back: the gradients hold this rank's own values.
    g.check_own(world, me, 1);
    // The reducer stays usable.
    assert_eq!(
        run_iteration(r, &mut g, &[], 2),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    g.check(world, 2, |gi, e| reference(world, gi, e, 2));
    // A hook failing on every rank fails the iteration with its error.
    let mut nb = 0;
    tc_reducer_num_buckets(r, &mut nb);
    let mut user = UserHook {
        order: Vec::new(),
        copies: vec![Vec::new(); nb],
        fail_bucket: Some(2),
    };
    let state = (&mut user as *mut UserHook).cast();
    assert_eq!(tc_reducer_set_hook(r, Some(user_hook), state), TC_SUCCESS);
    g.fill(world, me, 3);
    let mut failed = 0;
    for i in (0..n).rev() {
        match tc_reducer_mark_ready(r, i) {
            TC_SUCCESS => {}
            rc => {
                assert_eq!(rc, TC_ERR_INVALID_ARGUMENT);
                failed += 1;
            }
        }
    }
    assert_eq!(failed, 1, "one mark launched the failing bucket");
    assert_eq!(tc_reducer_finalize(r), TC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("hook on bucket 2"),
        "{}",
        last_error()
    );
    user.fail_bucket = None;
    assert_eq!(
        run_iteration(r, &mut g, &[], 4),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    g.check(world, 4, |gi, e| reference(world, gi, e, 4));
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT errors ok");
}

/// The last rank dies halfway through the second iteration's backward pass;
/// every survivor's finalize fails instead of hanging.
fn killed_child() {
    let comm = new_comm("reducer-killed");
    let (me, world) = (rank() as usize, size() as usize);
    let mut g = Grads::new(resnet_list());
    let n = g.list.len();
    let r = new_reducer(comm, &mut g).unwrap();
    assert_eq!(
        run_iteration(r, &mut g, &[], 0),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    g.check(world, 0, |gi, e| reference(world, gi, e, 0));
    g.fill(world, me, 1);
    for i in (0..n).rev() {
        if me == world - 1 && i == n / 2 {
            std::process::abort();
        }
        let _ = tc_reducer_mark_ready(r, i);
    }
    let rc = tc_reducer_finalize(r);
    assert_ne!(rc, TC_SUCCESS);
    let message = last_error();
    // The survivors' gradients are as their backward left them.
    g.check_own(world, me, 1);
    println!("RESULT killed ok rc={rc} {message}");
}

/// Gradients living in the buckets (`gradient_as_bucket_view`), finalized
/// asynchronously: every element through the pointers the reducer gives.
fn view_child() {
    let comm = new_comm("reducer-view");
    let (me, world) = (rank() as usize, size() as usize);
    let list = resnet_list();
    let counts: Vec<usize> = list.iter().map(|l| l.0).collect();
    let dtypes: Vec<tc_dtype_t> = list.iter().map(|l| l.1).collect();
    let mut opts = tc_reducer_options_t::defaults();
    opts.gradient_as_bucket_view = 1;
    opts.first_bucket_bytes = 32 << 10;
    opts.bucket_cap_bytes = 512 << 10;
    let (rc, r) = reducer_new(comm, None, &counts, &dtypes, &opts);
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    let ptrs: Vec<*mut u8> = (0..list.len())
        .map(|i| {
            let mut p = std::ptr::null_mut();
            assert_eq!(tc_reducer_get_grad(r, i, &mut p), TC_SUCCESS);
            assert_eq!(p.is_null(), list[i].0 == 0, "gradient {i}");
            p.cast()
        })
        .collect();
    for (iter, hook) in [
        TC_HOOK_ALLREDUCE,
        TC_HOOK_BF16_COMPRESS,
        TC_HOOK_FP16_COMPRESS,
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(tc_reducer_set_builtin_hook(r, hook), TC_SUCCESS);
        for (g, &(c, dt)) in list.iter().enumerate() {
            (0..c).for_each(|e| put(ptrs[g], dt, e, value(world, me, g, e, iter)));
        }
        for i in (0..list.len()).rev() {
            assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
        }
        let mut work = std::ptr::null_mut();
        assert_eq!(tc_reducer_finalize_async(r, &mut work), TC_SUCCESS);
        assert_eq!(
            tc_work_wait(work, std::ptr::null_mut()),
            TC_SUCCESS,
            "{}",
            last_error()
        );
        tc_work_free(work);
        for (g, &(c, dt)) in list.iter().enumerate() {
            for e in 0..c {
                let want = reference(world, g, e, iter);
                assert_eq!(
                    get(ptrs[g], dt, e),
                    want,
                    "iteration {iter} grad {g} element {e}"
                );
            }
        }
    }
    // A failed asynchronous finalize reports through its work, and the
    // reducer goes on.
    let mut work = std::ptr::null_mut();
    assert_eq!(tc_reducer_finalize_async(r, &mut work), TC_SUCCESS);
    assert_eq!(
        tc_work_wait(work, std::ptr::null_mut()),
        TC_ERR_INVALID_USAGE
    );
    assert!(last_error().contains("never marked"), "{}", last_error());
    tc_work_free(work);
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT view ok");
}

world_tests! {
    reducer_hooks_world_1: "hooks", hooks_child, 1;
    reducer_hooks_world_2: "hooks", hooks_child, 2;
    reducer_hooks_world_3: "hooks", hooks_child, 3;
    reducer_hooks_world_4: "hooks", hooks_child, 4;
    reducer_errors_world_2: "errors", errors_child, 2;
    reducer_errors_world_3: "errors", errors_child, 3;
    reducer_errors_world_4: "errors", errors_child, 4;
    reducer_bucket_view_async_world_2: "view", view_child, 2;
    reducer_bucket_view_async_world_3: "view", view_child, 3;
}

#[test]
fn reducer_peer_killed_world_3() {
    if let Some(role) = role() {
        if role == "killed" {
            killed_child();
        }
        return;
    }
    let out = launch(
        "reducer_peer_killed_world_3",
        "killed",
        3,
        &[],
        Duration::from_secs(300),
    );
    assert_eq!(
        out[2].signal(),
        Some(libc::SIGABRT),
        "{}",
        out[2].describe()
    );
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}
