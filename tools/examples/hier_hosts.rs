//! One rank of the hierarchical-collectives test across hosts
//! (`scripts/test-hier-hosts.sh`, which makes the hosts out of network
//! namespaces and starts this program once per rank).
//!
//! Each rank makes two gloo comms over one TCP store (rank 0 hosts it at
//! `MASTER_ADDR:MASTER_PORT`): "hier", chosen automatically (hierarchical
//! when the ranks span hosts), and "flat" (hint `gloo.hier=0`: Gloo among
//! all ranks). Then:
//!
//! 1. every collective the hierarchy covers (all_reduce with SUM, MAX, PROD
//!    and AVG, reduce and broadcast from every root, all_gather single and
//!    list, reduce_scatter single and list, barrier), over several dtypes
//!    and sizes, on both comms: every element is checked against a host
//!    reference, and the two comms' results must be equal bit for bit;
//! 2. the bytes each host sends to the others (`tx_bytes` of the interface
//!    `TC_HIER_IFACE`, read by the first rank of each host around fenced
//!    rounds of each operation) on both comms; rank 0 prints the table and
//!    fails unless every data-moving operation's traffic drops by at least
//!    `TC_HIER_MIN_DROP` (a factor; default 1.4: the flat ring of 2 hosts x
//!    2 ranks numbered host by host already crosses between hosts only
//!    twice, so all_reduce and all_gather drop by 1.5 there, to the volume
//!    of one rank per host; see docs/performance.md).
//!
//! Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TC_HIER_HOST
//! (this rank's host number), TC_HIER_IFACE. Exit status 0 when all is right.

mod hosts;

use hosts::{env, submit, total_over_hosts, tx_bytes};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;
use torchcomm::store::{StoreRef, TcpStore, TcpStoreOptions, TcpStoreServer};
use torchcomm::{Comm, CommOptions, Op, OpOptions, Ptr};
use torchcomm::{DType, Device, PremulFactor, RedKind, ReduceOp};

/// 8-byte aligned bytes.
struct Buf(Vec<u64>, usize);

impl Buf {
    fn new(bytes: usize) -> Buf {
        Buf(vec![0; bytes.div_ceil(8)], bytes)
    }
    fn ptr(&mut self) -> Ptr {
        Ptr(self.0.as_mut_ptr() as *mut c_void)
    }
    fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.0.as_ptr() as *const u8, self.1) }
    }
    fn from(bytes: &[u8]) -> Buf {
        let mut b = Buf::new(bytes.len());
        unsafe { std::slice::from_raw_parts_mut(b.0.as_mut_ptr() as *mut u8, b.1) }
            .copy_from_slice(bytes);
        b
    }
}

/// `vals` as elements of `dtype` (integers wrap as the kernels do).
fn encode(dtype: DType, vals: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        match dtype {
            DType::I32 => out.extend((*v as i32).to_ne_bytes()),
            DType::I64 => out.extend(v.to_ne_bytes()),
            DType::U8 => out.push(*v as u8),
            DType::F32 => out.extend((*v as f32).to_ne_bytes()),
            DType::F64 => out.extend((*v as f64).to_ne_bytes()),
            _ => unreachable!("not a test dtype"),
        }
    }
    out
}

/// Rank `r`'s element `i`: small, so that float sums and products are exact.
fn value(r: usize, i: usize, kind: RedKind) -> i64 {
    match kind {
        RedKind::Product => ((r + i) % 3) as i64 + 1,
        _ => ((r * 7 + i * 3) % 11) as i64 + 1,
    }
}

fn red(kind: RedKind) -> ReduceOp {
    ReduceOp {
        kind,
        factor: PremulFactor::Host(1.0),
    }
}

/// The reduction of every rank's element `i`.
fn reduced(n: usize, i: usize, kind: RedKind) -> i64 {
    let vals = (0..n).map(|r| value(r, i, kind));
    match kind {
        RedKind::Sum => vals.sum(),
        RedKind::Max => vals.max().unwrap(),
        RedKind::Product => vals.product(),
        RedKind::Avg => vals.sum::<i64>() / n as i64,
        _ => unreachable!(),
    }
}

/// Runs a case's operation on a comm and returns this rank's output.
type RunCase = dyn Fn(&Comm) -> Vec<u8>;

/// Makes one round's operation.
type MakeOp = dyn Fn() -> Op;

struct Case {
    name: String,
    /// What this rank's output must hold (None: undefined here).
    expect: Option<Vec<u8>>,
    /// Runs the operation on `comm` and returns this rank's output.
    run: Box<RunCase>,
}

fn own(me: usize, count: usize, dtype: DType, kind: RedKind) -> Buf {
    let v: Vec<i64> = (0..count).map(|i| value(me, i, kind)).collect();
    Buf::from(&encode(dtype, &v))
}

/// all_reduce with every test reduction, reduce to every root.
fn reduction_cases(me: usize, n: usize, dtype: DType, count: usize, cases: &mut Vec<Case>) {
    let kinds: &[RedKind] = match dtype {
        DType::F32 | DType::F64 => &[RedKind::Sum, RedKind::Max, RedKind::Product],
        _ => &[RedKind::Sum, RedKind::Max, RedKind::Product, RedKind::Avg],
    };
    for &kind in kinds {
        let want: Vec<i64> = (0..count).map(|i| reduced(n, i, kind)).collect();
        cases.push(Case {
            name: format!("all_reduce {kind:?} {dtype:?} x{count}"),
            expect: Some(encode(dtype, &want)),
            run: Box::new(move |c| {
                let mut b = own(me, count, dtype, kind);
                let (buf, op) = (b.ptr(), red(kind));
                submit(c, Op::all_reduce(buf, count, dtype, op));
                b.bytes().to_vec()
            }),
        });
    }
    for root in 0..n {
        let want: Vec<i64> = (0..count).map(|i| reduced(n, i, RedKind::Sum)).collect();
        cases.push(Case {
            name: format!("reduce Sum root {root} {dtype:?} x{count}"),
            // Non-roots' buffers stay as they were, as on the flat path.
            expect: Some(match me == root {
                true => encode(dtype, &want),
                false => own(me, count, dtype, RedKind::Sum).bytes().to_vec(),
            }),
            run: Box::new(move |c| {
                let mut b = own(me, count, dtype, RedKind::Sum);
                let (buf, op, root) = (b.ptr(), red(RedKind::Sum), root as i32);
                submit(c, Op::reduce(buf, count, dtype, root, op));
                b.bytes().to_vec()
            }),
        });
    }
}

/// reduce_scatter, single and list: rank r's input is its values over
/// `count * n` elements.
fn reduce_scatter_cases(me: usize, n: usize, dtype: DType, count: usize, cases: &mut Vec<Case>) {
    let es = dtype.size();
    let block = |i: usize| reduced(n, me * count + i, RedKind::Sum);
    let want = encode(dtype, &(0..count).map(block).collect::<Vec<_>>());
    for list in [false, true] {
        cases.push(Case {
            name: format!(
                "reduce_scatter{} Sum {dtype:?} x{count}",
                if list { " (list)" } else { "" }
            ),
            expect: Some(want.clone()),
            run: Box::new(move |c| {
                let mut input = own(me, count * n, dtype, RedKind::Sum);
                let mut out = Buf::new(count * es);
                let (output, op) = (out.ptr(), red(RedKind::Sum));
                let base = input.ptr().as_u8();
                let op = match list {
                    false => Op::reduce_scatter_single(output, input.ptr(), count, dtype, op),
                    true => {
                        let inputs = (0..n)
                            .map(|r| Ptr(unsafe { base.add(r * count * es) } as *mut c_void))
                            .collect();
                        Op::reduce_scatter(output, inputs, count, dtype, op)
                    }
                };
                submit(c, op);
                out.bytes().to_vec()
            }),
        });
    }
}

fn movement_cases(me: usize, n: usize, dtype: DType, count: usize, cases: &mut Vec<Case>) {
    let es = dtype.size();
    for root in 0..n {
        let want: Vec<i64> = (0..count).map(|i| value(root, i, RedKind::Sum)).collect();
        cases.push(Case {
            name: format!("broadcast root {root} {dtype:?} x{count}"),
            expect: Some(encode(dtype, &want)),
            run: Box::new(move |c| {
                let mut b = match me == root {
                    true => own(me, count, dtype, RedKind::Sum),
                    false => Buf::new(count * es),
                };
                let (buf, root) = (b.ptr(), root as i32);
                submit(c, Op::broadcast(buf, count, dtype, root));
                b.bytes().to_vec()
            }),
        });
    }
    let all: Vec<i64> = (0..n)
        .flat_map(|r| (0..count).map(move |i| value(r, i, RedKind::Sum)))
        .collect();
    for list in [false, true] {
        cases.push(Case {
            name: format!(
                "all_gather{} {dtype:?} x{count}",
                if list { " (list)" } else { "" }
            ),
            expect: Some(encode(dtype, &all)),
            run: Box::new(move |c| {
                let mut input = own(me, count, dtype, RedKind::Sum);
                let mut out = Buf::new(count * n * es);
                let base = out.ptr().as_u8();
                let op = match list {
                    false => Op::all_gather_single(out.ptr(), input.ptr(), count, dtype),
                    true => {
                        let outputs = (0..n)
                            .map(|r| Ptr(unsafe { base.add(r * count * es) } as *mut c_void))
                            .collect();
                        Op::all_gather(outputs, input.ptr(), count, dtype)
                    }
                };
                submit(c, op);
                out.bytes().to_vec()
            }),
        });
    }
}

/// Every case on both comms; the number of failures.
fn check_all(me: usize, n: usize, hier: &Comm, flat: &Comm) -> usize {
    let mut cases = Vec::new();
    for dtype in [DType::I32, DType::I64, DType::U8, DType::F32, DType::F64] {
        for count in [1, 7, 1000] {
            reduction_cases(me, n, dtype, count, &mut cases);
            reduce_scatter_cases(me, n, dtype, count, &mut cases);
            movement_cases(me, n, dtype, count, &mut cases);
        }
    }
    // Several 512 KiB shared-memory chunks, uneven.
    reduction_cases(me, n, DType::I32, 300_001, &mut cases);
    reduce_scatter_cases(me, n, DType::I32, 300_001, &mut cases);
    movement_cases(me, n, DType::I64, 100_003, &mut cases);
    let mut failures = 0;
    for case in &cases {
        let got_hier = (case.run)(hier);
        let got_flat = (case.run)(flat);
        if let Some(want) = &case.expect {
            for (path, got) in [("hier", &got_hier), ("flat", &got_flat)] {
                if let Some(at) = (0..want.len()).find(|k| got[*k] != want[*k]) {
                    eprintln!(
                        "rank {me}: CHECK FAIL {} on the {path} comm: byte {at} is {} not {}",
                        case.name, got[at], want[at]
                    );
                    failures += 1;
                }
            }
            if got_hier != got_flat {
                eprintln!(
                    "rank {me}: CHECK FAIL {}: the hier and flat results differ",
                    case.name
                );
                failures += 1;
            }
        }
    }
    submit(hier, Op::Barrier);
    submit(flat, Op::Barrier);
    println!(
        "rank {me}: {} cases checked on both comms, {failures} failure(s)",
        cases.len()
    );
    failures
}

/// Bytes this rank's host sent while `rounds` of `op` ran on `comm`
/// (fenced by barriers; the barriers' own few packets included).
fn host_tx(comm: &Comm, op: &dyn Fn() -> Op, rounds: usize) -> u64 {
    submit(comm, Op::Barrier);
    let before = tx_bytes("TC_HIER_IFACE");
    submit(comm, Op::Barrier);
    for _ in 0..rounds {
        submit(comm, op());
    }
    submit(comm, Op::Barrier);
    tx_bytes("TC_HIER_IFACE") - before
}

/// The measured operations: (name, bytes per rank, the operation) over
/// `count` int32 elements at `b` (and `o` for the outputs).
fn traffic_ops(n: usize, count: usize, b: Ptr, o: Ptr) -> Vec<(&'static str, usize, Box<MakeOp>)> {
    let block = count / n; // per-rank block of the gathers and scatters
    let sum = red(RedKind::Sum);
    let dt = DType::I32;
    vec![
        (
            "all_reduce",
            count * 4,
            Box::new(move || Op::all_reduce(b, count, dt, sum)),
        ),
        (
            "reduce",
            count * 4,
            Box::new(move || Op::reduce(b, count, dt, 0, sum)),
        ),
        (
            "broadcast",
            count * 4,
            Box::new(move || Op::broadcast(b, count, dt, 0)),
        ),
        (
            "all_gather_single",
            block * 4 * n,
            Box::new(move || Op::all_gather_single(o, b, block, dt)),
        ),
        (
            "reduce_scatter_single",
            block * 4 * n,
            Box::new(move || Op::reduce_scatter_single(o, b, block, dt, sum)),
        ),
        ("barrier (x50)", 0, Box::new(|| Op::Barrier)),
    ]
}

/// Inter-host traffic of each operation on both comms; false when a
/// reduction's traffic did not drop enough.
fn traffic(me: usize, n: usize, host: usize, hier: &Comm, flat: &Comm) -> bool {
    let min_drop: f64 = std::env::var("TC_HIER_MIN_DROP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.4);
    let count = 1 << 20; // 4 MiB of int32 per buffer
    let mut buf = Buf::new(count * 4 * n);
    let mut out = Buf::new(count * 4 * n);
    let ops = traffic_ops(n, count, buf.ptr(), out.ptr());
    let mut ok = true;
    if me == 0 {
        println!("| operation (int32) | bytes per rank | flat: inter-host bytes | hierarchical | flat / hierarchical |");
        println!("|---|---|---|---|---|");
    }
    for (name, bytes, op) in &ops {
        let rounds = if bytes == &0 { 50 } else { 2 };
        // Interleaved: flat, hier, flat, hier; the smaller of each pair.
        let mut f = u64::MAX;
        let mut h = u64::MAX;
        for _ in 0..2 {
            f = f.min(
                total_over_hosts(flat, host, host_tx(flat, op.as_ref(), rounds)) / rounds as u64,
            );
            h = h.min(
                total_over_hosts(flat, host, host_tx(hier, op.as_ref(), rounds)) / rounds as u64,
            );
        }
        let drop = f as f64 / h.max(1) as f64;
        if me == 0 {
            println!("| {name} | {bytes} | {f} | {h} | {drop:.2} |");
        }
        if *bytes > 0 && f < *bytes as u64 / 2 {
            if me == 0 {
                eprintln!("CHECK FAIL {name}: the flat path sent {f} bytes between hosts: the hosts were not told apart (shared memory across them?)");
            }
            ok = false;
        }
        if *bytes > 0 && drop < min_drop {
            if me == 0 {
                eprintln!("CHECK FAIL {name}: inter-host bytes dropped {drop:.2}x, expected >= {min_drop}x");
            }
            ok = false;
        }
    }
    ok
}

/// The fault case (`TC_HIER_FAULT=1`): the last rank (a member, not a
/// leader, in the script's layout) exits without a word; every other rank's
/// all_reduce on the hierarchical comm must fail, not hang: its own host's
/// ranks see the process exit at once, the other hosts' leaders the closed
/// Gloo connections, their members at the latest at the timeout.
fn lose_a_member(me: usize, n: usize, hier: &Comm, store: &StoreRef, timeout: Duration) -> ! {
    submit(hier, Op::Barrier);
    if me == n - 1 {
        println!("rank {me}: FAULT leaving without a word");
        std::process::exit(0);
    }
    let mut v = vec![1i32; 1 << 16];
    let t = std::time::Instant::now();
    let op = Op::all_reduce(
        Ptr(v.as_mut_ptr() as *mut c_void),
        v.len(),
        DType::I32,
        red(RedKind::Sum),
    );
    let outcome = hier.submit(op, &OpOptions::default());
    let took = t.elapsed();
    let ok = match &outcome {
        Ok(_) => {
            eprintln!(
                "rank {me}: CHECK FAIL all_reduce succeeded without rank {}",
                n - 1
            );
            false
        }
        Err(e) if took > timeout + Duration::from_secs(10) => {
            eprintln!(
                "rank {me}: CHECK FAIL the error came after {took:?}: {}",
                e.message
            );
            false
        }
        Err(e) => {
            println!(
                "rank {me}: FAULT seen after {:.1} s: {:?}: {}",
                took.as_secs_f64(),
                e.kind,
                e.message
            );
            true
        }
    };
    // Rank 0 hosts the store: it leaves last.
    // The verdict is in: a reply lost to rank 0's exit does not matter.
    let _ = store.set(&format!("fault-done/{me}"), b"1");
    if me == 0 {
        let keys: Vec<String> = (0..n - 1).map(|r| format!("fault-done/{r}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        // Members of other hosts fail at their timeout (20 s), the store
        // client's too: wait in rounds.
        let done = (0..3).any(|_| store.wait(&keys, Some(timeout)).is_ok());
        assert!(done, "every survivor done");
        // Lets the server answer the last SETs before it goes.
        std::thread::sleep(Duration::from_secs(1));
    }
    std::process::exit(if ok { 0 } else { 1 });
}

fn main() {
    let me: usize = env("RANK").parse().unwrap();
    let n: usize = env("WORLD_SIZE").parse().unwrap();
    let host: usize = env("TC_HIER_HOST").parse().unwrap();
    let port: u16 = env("MASTER_PORT").parse().unwrap();
    let timeout = Duration::from_secs(match std::env::var("TC_HIER_FAULT").as_deref() {
        Ok("1") => 20,
        _ => 120,
    });
    let _server = (me == 0).then(|| TcpStoreServer::start(port).expect("the store server"));
    let mut opts = TcpStoreOptions::client(&env("MASTER_ADDR"), port, timeout);
    opts.wait_for_workers = false;
    let store: StoreRef = Arc::new(TcpStore::new(&opts).expect("the store"));
    let comm = |name: &str, hints: Vec<(String, String)>| {
        Comm::new(
            "gloo",
            Device::Cpu,
            CommOptions {
                name: Some(name.into()),
                timeout: Some(timeout),
                abort_on_error: Some(false),
                rank: Some(me as i32),
                world_size: Some(n as i32),
                store: Some(store.clone()),
                hints,
            },
        )
        .unwrap_or_else(|e| panic!("rank {me}: comm {name}: {}", e.message))
    };
    let hier = comm("hier", Vec::new());
    if std::env::var("TC_HIER_FAULT").is_ok_and(|v| v == "1") {
        lose_a_member(me, n, &hier, &store, timeout);
    }
    let flat = comm("flat", vec![("gloo.hier".into(), "0".into())]);
    let failures = check_all(me, n, &hier, &flat);
    let traffic_ok = traffic(me, n, host, &hier, &flat);
    submit(&flat, Op::Barrier);
    drop(hier);
    drop(flat);
    // Rank 0 hosts the store: it leaves last.
    let _ = store.set(&format!("done/{me}"), b"1"); // as in lose_a_member
    if me == 0 {
        let keys: Vec<String> = (0..n).map(|r| format!("done/{r}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait(&keys, Some(timeout)).expect("every rank done");
        std::thread::sleep(Duration::from_secs(1));
    }
    if failures > 0 || !traffic_ok {
        std::process::exit(1);
    }
    println!("rank {me}: all right");
}
