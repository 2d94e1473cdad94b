//! Sparse all-reduce with real processes at 2, 3 and 4 ranks: random and
//! adversarial inputs (same indices everywhere, disjoint, duplicates inside
//! a rank, unsorted, nnz 0 on some or all ranks, 1000x uneven nnz, 2-D dense
//! values, every dtype, AVG, async), every element compared bit for bit with
//! an independent reference that sums in the documented order; bad inputs
//! fail every rank alike and leave the comm usable; a killed peer gives
//! every survivor an error, never a hang.

mod gloo_common;

use gloo_common::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use torchcomm::capi::{TC_AVG, TC_MAX, TC_SUM};
use torchcomm::DType;
use torchcomm::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use torchcomm::{sparse_all_reduce, CBuf, CooInput, CooOutput};
use torchcomm::{Comm, OpOptions};
use torchcomm::{ErrorKind, Result};

/// A test input (owned arrays).
#[derive(Clone, Debug)]
struct Coo {
    sparse_dim: usize,
    shape: Vec<i64>,
    nnz: usize,
    indices: Vec<i64>,
    values: Vec<u8>,
    dtype: DType,
}

impl Coo {
    fn row(&self) -> usize {
        self.shape[self.sparse_dim..].iter().product::<i64>() as usize
    }
    fn input(&self) -> CooInput {
        CooInput {
            sparse_dim: self.sparse_dim,
            dense_dim: self.shape.len() - self.sparse_dim,
            shape: self.shape.as_ptr(),
            nnz: self.nnz,
            indices: self.indices.as_ptr(),
            values: self.values.as_ptr().cast(),
            dtype: self.dtype.to_c(),
        }
    }
}

/// A small deterministic generator (same stream on every rank for a seed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn enc(dt: DType, x: f64) -> Vec<u8> {
    match dt {
        DType::F32 => (x as f32).to_ne_bytes().to_vec(),
        DType::F64 => x.to_ne_bytes().to_vec(),
        DType::F16 => f32_to_f16(x as f32).to_ne_bytes().to_vec(),
        DType::BF16 => f32_to_bf16(x as f32).to_ne_bytes().to_vec(),
        DType::I8 => (x as i64 as i8).to_ne_bytes().to_vec(),
        DType::U8 => (x as i64 as u8).to_ne_bytes().to_vec(),
        DType::I32 => (x as i64 as i32).to_ne_bytes().to_vec(),
        DType::I64 => (x as i64).to_ne_bytes().to_vec(),
        DType::U32 => (x as i64 as u32).to_ne_bytes().to_vec(),
        DType::U64 => (x as i64 as u64).to_ne_bytes().to_vec(),
        _ => unreachable!(),
    }
}

/// Random values: floats with fractions and spread magnitudes (so the
/// summation order shows in the bits), integers over their whole range.
fn random_value(dt: DType, rng: &mut Rng) -> Vec<u8> {
    let frac = (rng.below(1 << 20) as f64) / (1 << 20) as f64;
    let mag = [1e-3, 1.0, 1e3, 1e7][rng.below(4) as usize];
    let sign = if rng.below(2) == 0 { -1.0 } else { 1.0 };
    match dt {
        DType::F32 | DType::F64 => enc(dt, sign * mag * (1.0 + frac)),
        DType::F16 | DType::BF16 => enc(
            dt,
            sign * (1.0 + frac) * [0.01, 1.0, 100.0][rng.below(3) as usize],
        ),
        DType::I64 | DType::U64 => rng.next().to_ne_bytes().to_vec(),
        _ => rng.next().to_ne_bytes()[..dt.size()].to_vec(),
    }
}

/// `nnz` entries with indices drawn below `range` in each sparse dimension.
fn random_coo(
    seed: u64,
    dt: DType,
    shape: &[i64],
    sparse_dim: usize,
    nnz: usize,
    range: i64,
) -> Coo {
    let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15 + 1);
    let row = shape[sparse_dim..].iter().product::<i64>() as usize;
    let mut indices = vec![0i64; sparse_dim * nnz];
    for d in 0..sparse_dim {
        for j in 0..nnz {
            indices[d * nnz + j] = rng.below(range.min(shape[d]) as u64) as i64;
        }
    }
    let values = (0..nnz * row)
        .flat_map(|_| random_value(dt, &mut rng))
        .collect();
    Coo {
        sparse_dim,
        shape: shape.to_vec(),
        nnz,
        indices,
        values,
        dtype: dt,
    }
}

// ---- the reference: BTreeMap by index tuple, sums in the documented order

#[derive(Clone, Copy)]
enum Acc {
    F(f64),
    I(i128),
}

fn load(dt: DType, b: &[u8]) -> Acc {
    match dt {
        DType::F32 => Acc::F(f32::from_ne_bytes(b.try_into().unwrap()) as f64),
        DType::F64 => Acc::F(f64::from_ne_bytes(b.try_into().unwrap())),
        DType::F16 => Acc::F(f16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64),
        DType::BF16 => Acc::F(bf16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64),
        DType::I8 => Acc::I(i8::from_ne_bytes(b.try_into().unwrap()) as i128),
        DType::U8 => Acc::I(b[0] as i128),
        DType::I32 => Acc::I(i32::from_ne_bytes(b.try_into().unwrap()) as i128),
        DType::I64 => Acc::I(i64::from_ne_bytes(b.try_into().unwrap()) as i128),
        DType::U32 => Acc::I(u32::from_ne_bytes(b.try_into().unwrap()) as i128),
        DType::U64 => Acc::I(u64::from_ne_bytes(b.try_into().unwrap()) as i128),
        _ => unreachable!(),
    }
}

/// a + b in the accumulation type: f32 for float32/float16/bfloat16.
fn add(dt: DType, a: Acc, b: Acc) -> Acc {
    match (a, b) {
        (Acc::F(x), Acc::F(y)) if dt == DType::F64 => Acc::F(x + y),
        (Acc::F(x), Acc::F(y)) => Acc::F((x as f32 + y as f32) as f64),
        (Acc::I(x), Acc::I(y)) => Acc::I(x + y),
        _ => unreachable!(),
    }
}

fn store(dt: DType, a: Acc) -> Vec<u8> {
    match a {
        Acc::F(x) => enc(dt, x),
        Acc::I(x) => (x as u128 as u64).to_ne_bytes()[..dt.size()].to_vec(),
    }
}

type Map = BTreeMap<Vec<i64>, Vec<Acc>>;

/// Sums `coo`'s duplicates in input order and rounds once to the dtype.
fn local_sum(coo: &Coo) -> Map {
    let (row, s) = (coo.row(), coo.dtype.size());
    let mut m: Map = BTreeMap::new();
    for j in 0..coo.nnz {
        let key: Vec<i64> = (0..coo.sparse_dim)
            .map(|d| coo.indices[d * coo.nnz + j])
            .collect();
        let vals: Vec<Acc> = (0..row)
            .map(|k| {
                load(
                    coo.dtype,
                    &coo.values[(j * row + k) * s..(j * row + k + 1) * s],
                )
            })
            .collect();
        match m.get_mut(&key) {
            Some(acc) => acc
                .iter_mut()
                .zip(vals)
                .for_each(|(a, v)| *a = add(coo.dtype, *a, v)),
            None => {
                m.insert(key, vals);
            }
        }
    }
    round(coo.dtype, m)
}

fn round(dt: DType, m: Map) -> Map {
    m.into_iter()
        .map(|(k, v)| (k, v.into_iter().map(|a| load(dt, &store(dt, a))).collect()))
        .collect()
}

/// Every rank's local sums, summed in rank order; AVG divides in the dtype.
fn reference(inputs: &[Coo], avg: bool) -> CooOutput {
    let dt = inputs[0].dtype;
    let mut global: Map = BTreeMap::new();
    for coo in inputs {
        for (k, v) in local_sum(coo) {
            match global.get_mut(&k) {
                Some(acc) => acc.iter_mut().zip(v).for_each(|(a, x)| *a = add(dt, *a, x)),
                None => {
                    global.insert(k, v);
                }
            }
        }
    }
    let n = inputs.len();
    let global = round(dt, global);
    let first = &inputs[0];
    let mut indices = vec![0i64; first.sparse_dim * global.len()];
    let mut values = Vec::new();
    for (j, (k, v)) in global.iter().enumerate() {
        for d in 0..first.sparse_dim {
            indices[d * global.len() + j] = k[d];
        }
        for a in v {
            let a = match (*a, avg) {
                (Acc::F(x), true) if dt == DType::F64 => Acc::F(x / n as f64),
                (Acc::F(x), true) => Acc::F((x as f32 / n as f32) as f64),
                (Acc::I(x), true) => Acc::I(x / n as i128),
                (a, false) => a,
            };
            values.extend(store(dt, a));
        }
    }
    CooOutput {
        sparse_dim: first.sparse_dim,
        dense_dim: first.shape.len() - first.sparse_dim,
        shape: first.shape.clone(),
        nnz: global.len(),
        indices,
        values: CBuf::from_slice(&values).unwrap(),
        dtype: dt,
    }
}

// ---- running the operation

fn reduce(comm: &Arc<Comm>, coo: &Coo, kind: i32, async_op: bool) -> Result<CooOutput> {
    let slot = Arc::new(Mutex::new(None));
    let put = slot.clone();
    let opts = OpOptions {
        async_op,
        ..Default::default()
    };
    let deliver = Box::new(move |o: CooOutput| {
        *put.lock().unwrap() = Some(o);
        Ok(())
    });
    let work = unsafe { sparse_all_reduce(comm, &coo.input(), kind, &opts, deliver)? };
    work.wait_blocking()?;
    let out = slot.lock().unwrap().take();
    Ok(out.expect("delivered before completion"))
}

/// The cases: (name, dtype, shape, sparse_dim, nnz of rank r, index range).
fn cases(n: usize) -> Vec<(String, Vec<Coo>, i32)> {
    let mut v = Vec::new();
    let mut add_case =
        |name: &str, inputs: Vec<Coo>, kind: i32| v.push((name.to_string(), inputs, kind));
    let per_rank = |f: &dyn Fn(usize) -> Coo| (0..n).map(f).collect::<Vec<_>>();
    // All ranks the same indices (and duplicates: 40 draws below 10).
    let same = random_coo(7, DType::F32, &[10, 4], 1, 40, 10);
    add_case(
        "same indices",
        per_rank(&|r| Coo {
            values: random_coo(100 + r as u64, DType::F32, &[10, 4], 1, 40, 10).values,
            ..same.clone()
        }),
        TC_SUM,
    );
    // Disjoint: rank r's indices are r mod n in dimension 0.
    add_case(
        "disjoint",
        per_rank(&|r| {
            let mut c = random_coo(200 + r as u64, DType::F64, &[40, 6], 2, 30, 40);
            let stripes = 40 / n as i64;
            (0..c.nnz).for_each(|j| c.indices[j] = (c.indices[j] % stripes) * n as i64 + r as i64);
            c
        }),
        TC_SUM,
    );
    // Duplicates inside a rank, unsorted, 2-D dense values, int64.
    add_case(
        "duplicates unsorted 2-D dense int64",
        per_rank(&|r| random_coo(300 + r as u64, DType::I64, &[5, 7, 2, 3], 2, 50, 3)),
        TC_SUM,
    );
    // nnz 0 on rank 1 only, then on every rank.
    add_case(
        "nnz 0 on rank 1",
        per_rank(&|r| {
            random_coo(
                400 + r as u64,
                DType::F32,
                &[100, 3],
                1,
                if r == 1 { 0 } else { 20 },
                100,
            )
        }),
        TC_SUM,
    );
    add_case(
        "nnz 0 everywhere",
        per_rank(&|r| random_coo(500 + r as u64, DType::F32, &[100, 3], 1, 0, 100)),
        TC_SUM,
    );
    // 1000x uneven nnz.
    add_case(
        "uneven",
        per_rank(&|r| {
            random_coo(
                600 + r as u64,
                DType::F32,
                &[100_000, 8],
                1,
                if r == 0 { 5000 } else { 5 },
                100_000,
            )
        }),
        TC_SUM,
    );
    // Every dtype, duplicates and 3 sparse dims.
    for dt in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
    ] {
        add_case(
            &format!("dtype {}", dt.name()),
            per_rank(&|r| random_coo(700 + r as u64, dt, &[4, 5, 6, 3], 3, 60, 4)),
            TC_SUM,
        );
    }
    add_case(
        "avg float32",
        per_rank(&|r| random_coo(800 + r as u64, DType::F32, &[30, 2], 1, 25, 30)),
        TC_AVG,
    );
    add_case(
        "avg int32",
        per_rank(&|r| random_coo(900 + r as u64, DType::I32, &[30, 2], 1, 25, 30)),
        TC_AVG,
    );
    add_case(
        "sparse_dim only",
        per_rank(&|r| random_coo(1000 + r as u64, DType::F32, &[1000, 1000], 2, 64, 20)),
        TC_SUM,
    );
    v
}

fn check(name: &str, got: &CooOutput, want: &CooOutput) {
    assert_eq!(got.shape, want.shape, "{name}: shape");
    assert_eq!(
        (got.sparse_dim, got.dense_dim),
        (want.sparse_dim, want.dense_dim),
        "{name}: dims"
    );
    assert_eq!(got.nnz, want.nnz, "{name}: nnz");
    assert_eq!(got.indices, want.indices, "{name}: indices");
    if let Some(i) = (0..got.values.len()).find(|i| got.values[*i] != want.values[*i]) {
        panic!(
            "{name}: values differ from byte {i} on ({} bytes)",
            got.values.len()
        );
    }
    assert_eq!(got.values.len(), want.values.len(), "{name}: values length");
}

fn correctness_child() {
    let comm = child_comm("sparse", Duration::from_secs(60));
    let (n, me) = (comm.size() as usize, comm.rank() as usize);
    let mut checked = 0;
    for (round, (name, inputs, kind)) in cases(n).into_iter().enumerate() {
        let want = reference(&inputs, kind == TC_AVG);
        let got = reduce(&comm, &inputs[me], kind, round % 2 == 1)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        check(&name, &got, &want);
        checked += got.values.len();
    }
    comm.finalize().unwrap();
    println!("RESULT checked_bytes={checked}");
}

fn run_correctness(size: usize, test: &str) {
    if role().is_some() {
        return correctness_child();
    }
    let out = launch(test, "correct", size, &[], Duration::from_secs(240));
    assert_all_ok(&out);
    for o in &out {
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}

#[test]
fn sparse_matches_reference_2_ranks() {
    run_correctness(2, "sparse_matches_reference_2_ranks");
}

#[test]
fn sparse_matches_reference_3_ranks() {
    run_correctness(3, "sparse_matches_reference_3_ranks");
}

#[test]
fn sparse_matches_reference_4_ranks() {
    run_correctness(4, "sparse_matches_reference_4_ranks");
}

// ---- bad inputs: every rank fails alike, the comm stays usable

fn expect_err(comm: &Arc<Comm>, coo: &Coo, kind: i32, code: ErrorKind, parts: &[&str]) {
    let e = reduce(comm, coo, kind, false).expect_err("must fail");
    assert_eq!(e.kind, code, "{}", e.message);
    for p in parts {
        assert!(e.message.contains(p), "'{}' lacks '{p}'", e.message);
    }
}

fn bad_inputs_child() {
    let comm = child_comm("sparse-bad", Duration::from_secs(60));
    let (n, me) = (comm.size() as usize, comm.rank() as i64);
    let last = n - 1;
    let good = random_coo(1 + me as u64, DType::F32, &[10, 3], 1, 8, 10);
    let mut c = good.clone();
    if me as usize == last {
        c.indices[5] = 10;
    }
    let rank_last = format!("rank {last}");
    expect_err(
        &comm,
        &c,
        TC_SUM,
        ErrorKind::InvalidArgument,
        &[&rank_last, "dimension 0", "entry 5", "outside [0, 10)"],
    );
    let mut c = good.clone();
    if me == 1 {
        c.shape[1] = 4;
        c.values.extend(vec![0u8; 8 * 4]);
    }
    expect_err(
        &comm,
        &c,
        TC_SUM,
        ErrorKind::InvalidArgument,
        &["rank 1", "dimension 1", "4 on rank 1", "3 on rank 0"],
    );
    let mut c = good.clone();
    if me == 1 {
        c.dtype = DType::I32;
    }
    expect_err(
        &comm,
        &c,
        TC_SUM,
        ErrorKind::InvalidArgument,
        &["rank 1", "dtype", "int32"],
    );
    expect_err(
        &comm,
        &good,
        TC_MAX,
        ErrorKind::Unsupported,
        &["rank 0", "max"],
    );
    let mut c = good.clone();
    c.dtype = DType::Bool;
    expect_err(
        &comm,
        &c,
        TC_SUM,
        ErrorKind::Unsupported,
        &["rank 0", "bool"],
    );
    // NULL indices with entries, on rank 0 only.
    let mut input = good.input();
    if me == 0 {
        input.indices = std::ptr::null();
    }
    let e = unsafe {
        sparse_all_reduce(
            &comm,
            &input,
            TC_SUM,
            &OpOptions::default(),
            Box::new(|_| Ok(())),
        )
    }
    .err()
    .expect("NULL refused");
    assert_eq!(e.kind, ErrorKind::NullArgument, "{}", e.message);
    assert!(
        e.message.contains("rank 0") && e.message.contains("input.indices"),
        "{}",
        e.message
    );
    // nnz x row overflowing on the last rank (nothing is read: refused first).
    let mut input = good.input();
    if me as usize == last {
        input.nnz = usize::MAX / 2;
    }
    let e = unsafe {
        sparse_all_reduce(
            &comm,
            &input,
            TC_SUM,
            &OpOptions::default(),
            Box::new(|_| Ok(())),
        )
    }
    .err()
    .expect("overflow refused");
    assert!(
        e.message.contains(&rank_last) && e.message.contains("overflows"),
        "{}",
        e.message
    );
    // The comm still works.
    let inputs: Vec<Coo> = (0..n)
        .map(|r| random_coo(1 + r as u64, DType::F32, &[10, 3], 1, 8, 10))
        .collect();
    check(
        "after errors",
        &reduce(&comm, &good, TC_SUM, false).unwrap(),
        &reference(&inputs, false),
    );
    comm.finalize().unwrap();
    println!("RESULT ok");
}

#[test]
fn sparse_bad_inputs_fail_every_rank() {
    if role().is_some() {
        return bad_inputs_child();
    }
    for size in [2, 3] {
        let out = launch(
            "sparse_bad_inputs_fail_every_rank",
            "bad",
            size,
            &[],
            Duration::from_secs(180),
        );
        assert_all_ok(&out);
    }
}

// ---- a killed peer: errors on the survivors, never a hang

#[test]
fn sparse_killed_peer_gives_errors() {
    if role().is_some() {
        let comm = child_comm("sparse-kill", Duration::from_secs(8));
        let (n, me) = (comm.size() as usize, comm.rank() as usize);
        let coo = random_coo(3 + me as u64, DType::F32, &[1000, 16], 1, 200, 1000);
        reduce(&comm, &coo, TC_SUM, false).unwrap();
        if me == n - 1 {
            std::process::exit(3);
        }
        let e = reduce(&comm, &coo, TC_SUM, me % 2 == 0).expect_err("peer is gone");
        println!("RESULT error={:?}", e.kind);
        return;
    }
    let out = launch(
        "sparse_killed_peer_gives_errors",
        "kill",
        3,
        &[],
        Duration::from_secs(120),
    );
    for o in &out[..2] {
        assert!(o.ok(), "{}", o.describe());
        assert_eq!(o.results().len(), 1, "{}", o.describe());
    }
}
