//! The reducer's PowerSGD hook (`TC_HOOK_POWERSGD`) with real processes
//! (2, 3 and 4 ranks), through the C API, against a host reference of the
//! same algorithm written here: every rank's gradients are known to every
//! process, so the reference runs all ranks' error feedback and the shared
//! Q itself. Several iterations crossing `start_iter`, with and without
//! warm start and error feedback, a float16 gradient (plain all-reduce),
//! uncompressed vectors and small matrices, an empty gradient; a rank-1
//! gradient reproduced exactly up to rounding; and the argument checks.

mod capi_common;
#[macro_use]
mod gloo_common;

use capi_common::{finalize_and_destroy, last_error, new_comm, reducer_new};
use gloo_common::*;
use std::ffi::c_void;
use std::time::Duration;
use torchcomm::capi::*;
use torchcomm::{f16_to_f32, f32_to_f16};

/// (rows, cols, dtype) of the test's gradients: matrices worth compressing,
/// vectors, a 4x4 matrix below the compression rate, an empty gradient,
/// a float16 matrix.
const SHAPES: [(usize, usize, tc_dtype_t); 10] = [
    (32, 48, TC_FLOAT32),
    (48, 1, TC_FLOAT32),
    (0, 0, TC_FLOAT32),
    (16, 72, TC_FLOAT32),
    (4, 4, TC_FLOAT32),
    (10, 10, TC_FLOAT16),
    (64, 27, TC_FLOAT32),
    (27, 1, TC_FLOAT32),
    (24, 40, TC_FLOAT32),
    (40, 24, TC_FLOAT32),
];

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 33)).wrapping_mul(0xff51afd7ed558ccd);
    z = (z ^ (z >> 33)).wrapping_mul(0xc4ceb9fe1a85ec53);
    z ^ (z >> 33)
}

/// Rank `rank`'s gradient `grad`, element `e`, iteration `iter`, in [-1, 1).
fn value(rank: usize, grad: usize, e: usize, iter: usize) -> f32 {
    let h = mix(((rank * 131 + grad) * 1_000_003 + e) as u64 * 7919 + iter as u64);
    (h >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

// ---- the reference ------------------------------------------------------

/// The starting Q as `tc_reducer_set_powersgd` documents it: SplitMix64
/// seeded from (seed, gradient, iteration), each value the sum of 12
/// uniforms minus 6.
fn start_q(seed: u64, grad: usize, iter: u64, len: usize) -> Vec<f32> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    };
    let key = next() ^ (grad as u64).wrapping_mul(0xD1B54A32D192ED03);
    let mut state = key ^ iter.wrapping_mul(0x8CB92BA72F3D8DD7);
    let mut gen = move || {
        state = state.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    };
    (0..len)
        .map(|_| {
            let s: f64 = (0..12)
                .map(|_| (gen() >> 11) as f64 / (1u64 << 53) as f64)
                .sum();
            (s - 6.0) as f32
        })
        .collect()
}

/// Gram-Schmidt on the columns of an n x r row-major matrix.
fn gram_schmidt(a: &mut [f32], n: usize, r: usize) {
    for c in 0..r {
        let norm = (0..n)
            .map(|i| (a[i * r + c] as f64).powi(2))
            .sum::<f64>()
            .sqrt() as f32;
        (0..n).for_each(|i| {
            a[i * r + c] = if norm == 0.0 {
                0.0
            } else {
                a[i * r + c] / norm
            }
        });
        for d in c + 1..r {
            let dot = (0..n)
                .map(|i| a[i * r + c] as f64 * a[i * r + d] as f64)
                .sum::<f64>() as f32;
            (0..n).for_each(|i| a[i * r + d] -= dot * a[i * r + c]);
        }
    }
}

#[derive(Clone, Copy)]
struct Config {
    rank: usize,
    start: usize,
    error_feedback: bool,
    warm: bool,
    seed: u64,
}

/// All ranks' PowerSGD, for the reference.
struct Reference {
    cfg: Config,
    world: usize,
    /// Per rank, per gradient: the error of the last compressed iteration.
    errors: Vec<Vec<Vec<f32>>>,
    q: Vec<Option<Vec<f32>>>,
}

impl Reference {
    fn new(cfg: Config, world: usize) -> Reference {
        Reference {
            cfg,
            world,
            errors: vec![SHAPES.iter().map(|s| vec![0.0; s.0 * s.1]).collect(); world],
            q: vec![None; SHAPES.len()],
        }
    }

    /// The result of iteration `iter` for every gradient, given every
    /// rank's inputs `x[rank][grad]`.
    fn step(&mut self, x: &[Vec<Vec<f32>>], iter: usize) -> Vec<Vec<f32>> {
        let w = self.world as f32;
        let mut out = Vec::new();
        for (g, &(n, m, dt)) in SHAPES.iter().enumerate() {
            let len = n * m;
            let plain = dt != TC_FLOAT32 || iter < self.cfg.start;
            if plain {
                out.push(
                    (0..len)
                        .map(|e| (0..self.world).map(|r| x[r][g][e] / w).sum())
                        .collect(),
                );
                continue;
            }
            let inputs: Vec<Vec<f32>> = (0..self.world)
                .map(|r| {
                    let mut v = x[r][g].clone();
                    if self.cfg.error_feedback {
                        v.iter_mut()
                            .zip(&self.errors[r][g])
                            .for_each(|(a, b)| *a += b);
                    }
                    v
                })
                .collect();
            let r = n.min(m).min(self.cfg.rank);
            let result: Vec<f32> = if ((n + m) * r) as f64 * 2.0 < (n * m) as f64 {
                self.low_rank(&inputs, g, (n, m, r), iter as u64)
            } else {
                let sum = |e: usize| (0..self.world).map(|k| inputs[k][e]).sum::<f32>();
                (0..len).map(|e| sum(e) / w).collect()
            };
            if self.cfg.error_feedback {
                for (errors, input) in self.errors.iter_mut().zip(&inputs) {
                    errors[g] = input.iter().zip(&result).map(|(a, b)| a - b).collect();
                }
            }
            out.push(result);
        }
        out
    }

    fn low_rank(
        &mut self,
        inputs: &[Vec<f32>],
        g: usize,
        (n, m, r): (usize, usize, usize),
        iter: u64,
    ) -> Vec<f32> {
        let mut q = match (&self.q[g], self.cfg.warm) {
            (Some(q), true) => q.clone(),
            _ => start_q(self.cfg.seed, g, iter, m * r),
        };
        gram_schmidt(&mut q, m, r);
        let mut p = vec![0f32; n * r];
        for x in inputs {
            for i in 0..n {
                for k in 0..r {
                    p[i * r + k] += (0..m)
                        .map(|j| x[i * m + j] as f64 * q[j * r + k] as f64)
                        .sum::<f64>() as f32;
                }
            }
        }
        gram_schmidt(&mut p, n, r);
        let mut q = vec![0f32; m * r];
        for x in inputs {
            for j in 0..m {
                for k in 0..r {
                    q[j * r + k] += (0..n)
                        .map(|i| x[i * m + j] as f64 * p[i * r + k] as f64)
                        .sum::<f64>() as f32;
                }
            }
        }
        q.iter_mut().for_each(|v| *v /= self.world as f32);
        self.q[g] = Some(q.clone());
        let mut out = vec![0f32; n * m];
        for i in 0..n {
            for j in 0..m {
                out[i * m + j] = (0..r)
                    .map(|k| p[i * r + k] as f64 * q[j * r + k] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }
}

// ---- the processes -------------------------------------------------------

/// The gradients as the reducer sees them (float32 or float16 storage).
struct Grads {
    words: Vec<Vec<u64>>,
}

impl Grads {
    fn new() -> Grads {
        let words = SHAPES
            .iter()
            .map(|&(n, m, _)| vec![0u64; (n * m * 4).div_ceil(8)])
            .collect();
        Grads { words }
    }
    fn set(&mut self, values: &[Vec<f32>]) {
        for (g, v) in values.iter().enumerate() {
            let p = self.words[g].as_mut_ptr();
            for (e, &x) in v.iter().enumerate() {
                unsafe {
                    match SHAPES[g].2 {
                        TC_FLOAT32 => p.cast::<f32>().add(e).write(x),
                        _ => p.cast::<u16>().add(e).write(f32_to_f16(x)),
                    }
                }
            }
        }
    }
    fn get(&self, g: usize, e: usize) -> f32 {
        let p = self.words[g].as_ptr();
        unsafe {
            match SHAPES[g].2 {
                TC_FLOAT32 => p.cast::<f32>().add(e).read(),
                _ => f16_to_f32(p.cast::<u16>().add(e).read()),
            }
        }
    }
}

fn new_reducer(comm: *mut tc_comm_t, g: &mut Grads) -> *mut tc_reducer_t {
    let ptrs: Vec<*mut c_void> = g.words.iter_mut().map(|w| w.as_mut_ptr().cast()).collect();
    let counts: Vec<usize> = SHAPES.iter().map(|s| s.0 * s.1).collect();
    let dtypes: Vec<tc_dtype_t> = SHAPES.iter().map(|s| s.2).collect();
    let mut opts = tc_reducer_options_t::defaults();
    opts.first_bucket_bytes = 4 << 10;
    opts.bucket_cap_bytes = 8 << 10;
    let (rc, r) = reducer_new(comm, Some(&ptrs), &counts, &dtypes, &opts);
    assert_eq!(rc, TC_SUCCESS, "{}", last_error());
    r
}

fn set_powersgd(r: *mut tc_reducer_t, cfg: Config) -> i32 {
    let rows: Vec<usize> = SHAPES.iter().map(|s| s.0).collect();
    let mut o = tc_powersgd_options_t::defaults();
    o.matrix_approximation_rank = cfg.rank;
    o.start_iter = cfg.start as u64;
    o.use_error_feedback = cfg.error_feedback as i32;
    o.warm_start = cfg.warm as i32;
    o.seed = cfg.seed;
    o.rows = rows.as_ptr();
    o.num_rows = rows.len();
    tc_reducer_set_powersgd(r, &o)
}

/// Marks every gradient in reverse order and finalizes (asynchronously
/// when `async_finalize`).
fn exchange(r: *mut tc_reducer_t, async_finalize: bool) {
    for i in (0..SHAPES.len()).rev() {
        assert_eq!(tc_reducer_mark_ready(r, i), TC_SUCCESS, "{}", last_error());
    }
    if async_finalize {
        let mut work = std::ptr::null_mut();
        assert_eq!(
            tc_reducer_finalize_async(r, &mut work),
            TC_SUCCESS,
            "{}",
            last_error()
        );
        assert_eq!(
            tc_work_wait(work, std::ptr::null_mut()),
            TC_SUCCESS,
            "{}",
            last_error()
        );
        tc_work_free(work);
    } else {
        assert_eq!(tc_reducer_finalize(r), TC_SUCCESS, "{}", last_error());
    }
}

/// Every rank's inputs as the reducer sees them (float16 rounded).
fn inputs(world: usize, iter: usize) -> Vec<Vec<Vec<f32>>> {
    (0..world)
        .map(|r| {
            SHAPES
                .iter()
                .enumerate()
                .map(|(g, &(n, m, dt))| {
                    (0..n * m)
                        .map(|e| {
                            let x = value(r, g, e, iter);
                            if dt == TC_FLOAT32 {
                                x
                            } else {
                                f16_to_f32(f32_to_f16(x))
                            }
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn check(g: &Grads, want: &[Vec<f32>], what: &str) {
    for (gi, w) in want.iter().enumerate() {
        let scale = w.iter().fold(1f32, |a, b| a.max(b.abs()));
        let tol = if SHAPES[gi].2 == TC_FLOAT32 {
            2e-5
        } else {
            2e-3
        } * scale;
        for (e, &want) in w.iter().enumerate() {
            let got = g.get(gi, e);
            assert!(
                (got - want).abs() <= tol,
                "{what}: gradient {gi} element {e}: {got} vs reference {want}"
            );
        }
    }
}

fn reference_child() {
    let comm = new_comm("powersgd-reference");
    let (me, world) = (rank() as usize, size() as usize);
    let mut g = Grads::new();
    let r = new_reducer(comm, &mut g);
    let configs = [
        Config {
            rank: 2,
            start: 2,
            error_feedback: true,
            warm: true,
            seed: 7,
        },
        Config {
            rank: 1,
            start: 1,
            error_feedback: true,
            warm: false,
            seed: 3,
        },
        Config {
            rank: 3,
            start: 0,
            error_feedback: false,
            warm: true,
            seed: 11,
        },
    ];
    for (c, cfg) in configs.into_iter().enumerate() {
        // A new hook starts from iteration 0 with no memory.
        assert_eq!(set_powersgd(r, cfg), TC_SUCCESS, "{}", last_error());
        let mut reference = Reference::new(cfg, world);
        for iter in 0..5 {
            let x = inputs(world, iter + 10 * c);
            g.set(&x[me]);
            exchange(r, iter == 4);
            let want = reference.step(&x, iter);
            check(&g, &want, &format!("config {c} iteration {iter}"));
        }
    }
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT reference ok");
}

/// Rank k's gradient (k + 1) u v^T: the sum has rank 1, so rank-1 PowerSGD
/// gives the exact average (up to rounding), iteration after iteration.
fn rank_one_child() {
    let comm = new_comm("powersgd-rank-one");
    let (me, world) = (rank() as usize, size() as usize);
    let mut g = Grads::new();
    let r = new_reducer(comm, &mut g);
    let cfg = Config {
        rank: 1,
        start: 0,
        error_feedback: true,
        warm: true,
        seed: 1,
    };
    assert_eq!(set_powersgd(r, cfg), TC_SUCCESS, "{}", last_error());
    let mean_factor = (1..=world).sum::<usize>() as f32 / world as f32;
    for iter in 0..3 {
        let outer = |rank: usize| -> Vec<Vec<f32>> {
            SHAPES
                .iter()
                .enumerate()
                .map(|(gi, &(n, m, _))| {
                    let u = |i: usize| value(0, gi, i, iter) + 1.5;
                    // v stays: the warm Q (v's direction) is well conditioned.
                    let v = |j: usize| value(1, gi, j, 0);
                    (0..n * m)
                        .map(|e| (rank + 1) as f32 * u(e / m) * v(e % m))
                        .collect()
                })
                .collect()
        };
        g.set(&outer(me));
        exchange(r, false);
        let mut want = outer(0);
        want.iter_mut().flatten().for_each(|x| *x *= mean_factor);
        for (gi, w) in want.iter().enumerate() {
            let scale = w.iter().fold(1f32, |a, b| a.max(b.abs()));
            let tol = if SHAPES[gi].2 == TC_FLOAT32 {
                1e-5
            } else {
                4e-3
            } * scale;
            for (e, &want) in w.iter().enumerate() {
                let got = g.get(gi, e);
                assert!(
                    (got - want).abs() <= tol,
                    "iteration {iter} gradient {gi} element {e}: {got} vs {want}"
                );
            }
        }
    }
    tc_reducer_free(r);
    finalize_and_destroy(comm);
    println!("RESULT rank_one ok");
}

world_tests! {
    powersgd_reference_world_2: "reference", reference_child, 2;
    powersgd_reference_world_3: "reference", reference_child, 3;
    powersgd_reference_world_4: "reference", reference_child, 4;
    powersgd_rank_one_world_2: "rank_one", rank_one_child, 2;
    powersgd_rank_one_world_3: "rank_one", rank_one_child, 3;
}

/// Bad options are refused with the argument named, and the reducer keeps
/// its hook (one rank: nothing is exchanged).
#[test]
fn powersgd_bad_options() {
    match role().as_deref() {
        Some("options") => {}
        Some(_) => return,
        None => {
            let out = launch(
                "powersgd_bad_options",
                "options",
                1,
                &[],
                Duration::from_secs(300),
            );
            assert_all_ok(&out);
            return;
        }
    }
    let comm = new_comm("powersgd-options");
    let mut g = Grads::new();
    let r = new_reducer(comm, &mut g);
    let good = Config {
        rank: 1,
        start: 0,
        error_feedback: true,
        warm: true,
        seed: 0,
    };
    assert_eq!(
        set_powersgd(r, Config { rank: 0, ..good }),
        TC_ERR_INVALID_ARGUMENT
    );
    assert!(
        last_error().contains("'opts.matrix_approximation_rank'"),
        "{}",
        last_error()
    );
    let mut o = tc_powersgd_options_t::defaults();
    let mut rows: Vec<usize> = SHAPES.iter().map(|s| s.0).collect();
    rows[3] = 5;
    o.rows = rows.as_ptr();
    o.num_rows = rows.len();
    assert_eq!(tc_reducer_set_powersgd(r, &o), TC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("'opts.rows[3]': 5 does not divide"),
        "{}",
        last_error()
    );
    o.num_rows = 3;
    assert_eq!(tc_reducer_set_powersgd(r, &o), TC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("'opts.num_rows'"), "{}", last_error());
    o = tc_powersgd_options_t::defaults();
    o.min_compression_rate = f64::NAN;
    assert_eq!(tc_reducer_set_powersgd(r, &o), TC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("'opts.min_compression_rate'"),
        "{}",
        last_error()
    );
    o = tc_powersgd_options_t::defaults();
    o.warm_start = 2;
    assert_eq!(tc_reducer_set_powersgd(r, &o), TC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("'opts.warm_start'"),
        "{}",
        last_error()
    );
    // Defaults (and the built-in kind): nothing compressed without rows, so
    // one rank's gradients come back as they are.
    assert_eq!(
        tc_reducer_set_builtin_hook(r, TC_HOOK_POWERSGD),
        TC_SUCCESS,
        "{}",
        last_error()
    );
    let x = inputs(1, 0);
    g.set(&x[0]);
    exchange(r, false);
    check(&g, &x[0], "defaults, one rank");
    tc_reducer_free(r);
    finalize_and_destroy(comm);
}
