//! tc-perf: bandwidth and latency of every operation, in nccl-tests' columns.
//!
//! Run under any launcher (`tc-run -n 2 -- tc-perf -o all_reduce`); every rank
//! runs the same sweep and rank 0 prints the table.
//!
//! Flags (nccl-tests' where they exist):
//!   -b SIZE  -e SIZE  -f FACTOR   sizes in bytes (K, M, G suffixes), from -b to -e, x FACTOR
//!   -n ITERS -w WARMUP            timed and warm-up iterations per size
//!   -c 0|1                        check every element of every result (default 1)
//!   -o OP      all_reduce all_gather reduce_scatter broadcast reduce all_to_all
//!              sendrecv gather scatter barrier
//!   -d DTYPE   float32 (float) float64 (double) float16 (half) bfloat16 int8 uint8
//!              int32 uint32 int64 uint64, or all
//!   -r REDOP   sum prod min max avg, or all
//!   -a 0|1     issue with async_op = 1 and wait for all works after the loop
//!              (nccl-tests' pipelined mode); default 0: each call blocks until done
//!   -z 0|1     with -a 1: wait for each work before issuing the next
//!   -C 0|1     report host time per call spent issuing (with -a 1: enqueue cost)
//!   -B NAME    backend (default gloo: the nccl backend is not implemented yet)
//!   --root R   root of broadcast, reduce, gather, scatter (default 0)
//!   --csv FILE append one line per measurement (header when the file is new)
//!   --label S  system name in the CSV (default torchcomm-BACKEND)
//!
//! Sizes are the bytes of one rank's buffer as nccl-tests counts them: for
//! all_gather, reduce_scatter, all_to_all, gather and scatter the whole
//! n-rank buffer (each rank contributes size / n). Time is the mean over
//! ranks of (elapsed / iterations); algbw = size / time; busbw = algbw x
//! nccl-tests' factor. all_reduce, broadcast and reduce exist only in place
//! in this API; sendrecv, gather and scatter only out of place: the other
//! column shows N/A.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::exit;
use std::sync::Arc;
use std::time::Instant;
use torchcomm::backends::gloo::reduce::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use torchcomm::comm::{Comm, CommOptions, Op, OpOptions, P2p, Ptr};
use torchcomm::types::{DType, Device, PremulFactor, RedKind, ReduceOp};
use torchcomm::work::Work;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
    Gather,
    Scatter,
    Barrier,
}

impl Coll {
    fn parse(s: &str) -> Option<Coll> {
        Some(match s {
            "all_reduce" | "allreduce" => Coll::AllReduce,
            "all_gather" | "allgather" => Coll::AllGather,
            "reduce_scatter" | "reducescatter" => Coll::ReduceScatter,
            "broadcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "all_to_all" | "alltoall" => Coll::AllToAll,
            "sendrecv" => Coll::SendRecv,
            "gather" => Coll::Gather,
            "scatter" => Coll::Scatter,
            "barrier" => Coll::Barrier,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "all_to_all",
            Coll::SendRecv => "sendrecv",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::Barrier => "barrier",
        }
    }
    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }
    fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter)
    }
    /// The size names the whole n-rank buffer (each rank holds size / n).
    fn size_is_total(self) -> bool {
        matches!(self, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter)
    }
    fn has_out_of_place(self) -> bool {
        matches!(
            self,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::SendRecv | Coll::Gather | Coll::Scatter
        )
    }
    fn has_in_place(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::AllGather | Coll::ReduceScatter | Coll::Broadcast | Coll::Reduce | Coll::AllToAll)
    }
    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv | Coll::Barrier => 1.0,
        }
    }
}

fn parse_dtype(s: &str) -> Option<DType> {
    Some(match s {
        "float32" | "float" | "f32" => DType::F32,
        "float64" | "double" | "f64" => DType::F64,
        "float16" | "half" | "f16" => DType::F16,
        "bfloat16" | "bf16" => DType::BF16,
        "int8" => DType::I8,
        "uint8" => DType::U8,
        "int32" | "int" => DType::I32,
        "uint32" => DType::U32,
        "int64" => DType::I64,
        "uint64" => DType::U64,
        _ => return None,
    })
}

const ALL_DTYPES: [DType; 10] =
    [DType::I8, DType::U8, DType::I32, DType::U32, DType::I64, DType::U64, DType::F16, DType::F32, DType::F64, DType::BF16];

fn parse_redop(s: &str) -> Option<RedKind> {
    Some(match s {
        "sum" => RedKind::Sum,
        "prod" => RedKind::Product,
        "min" => RedKind::Min,
        "max" => RedKind::Max,
        "avg" => RedKind::Avg,
        _ => return None,
    })
}

const ALL_REDOPS: [RedKind; 5] = [RedKind::Sum, RedKind::Product, RedKind::Max, RedKind::Min, RedKind::Avg];

fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1usize << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

struct Args {
    min_bytes: usize,
    max_bytes: usize,
    factor: usize,
    iters: usize,
    warmup: usize,
    check: bool,
    coll: Coll,
    dtypes: Vec<DType>,
    redops: Vec<RedKind>,
    async_op: bool,
    blocking: bool,
    cpu_time: bool,
    backend: String,
    root: i32,
    csv: Option<String>,
    label: Option<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: tc-perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n\
         \x20              [-o all_reduce|all_gather|reduce_scatter|broadcast|reduce|all_to_all|sendrecv|gather|scatter|barrier]\n\
         \x20              [-d DTYPE|all] [-r sum|prod|min|max|avg|all] [-a 0|1] [-z 0|1] [-C 0|1]\n\
         \x20              [-B BACKEND] [--root R] [--csv FILE] [--label NAME]\n\
         Run under a launcher, e.g. tc-run -n 2 -- tc-perf -b 8 -e 128M -f 2 -o all_reduce"
    );
    exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        min_bytes: 32 << 20,
        max_bytes: 32 << 20,
        factor: 2,
        iters: 20,
        warmup: 5,
        check: true,
        coll: Coll::AllReduce,
        dtypes: vec![DType::F32],
        redops: vec![RedKind::Sum],
        async_op: false,
        blocking: false,
        cpu_time: false,
        backend: "gloo".into(),
        root: 0,
        csv: None,
        label: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let flag_bool = |v: &str| match v {
        "0" => false,
        "1" => true,
        _ => usage(),
    };
    while i < argv.len() {
        let flag = argv[i].as_str();
        if flag == "-h" || flag == "--help" {
            usage();
        }
        let Some(v) = argv.get(i + 1).map(|s| s.as_str()) else {
            eprintln!("tc-perf: {flag} needs a value");
            usage()
        };
        let num = |v: &str| v.parse::<usize>().unwrap_or_else(|_| usage());
        match flag {
            "-b" | "--minbytes" => a.min_bytes = parse_size(v).unwrap_or_else(|| usage()),
            "-e" | "--maxbytes" => a.max_bytes = parse_size(v).unwrap_or_else(|| usage()),
            "-f" | "--stepfactor" => a.factor = num(v),
            "-n" | "--iters" => a.iters = num(v),
            "-w" | "--warmup_iters" => a.warmup = num(v),
            "-c" | "--check" => a.check = num(v) != 0,
            "-o" | "--op" => {
                a.coll = Coll::parse(v).unwrap_or_else(|| {
                    eprintln!("tc-perf: unknown operation {v:?}");
                    usage()
                })
            }
            "-d" | "--datatype" => {
                a.dtypes = if v == "all" {
                    ALL_DTYPES.to_vec()
                } else {
                    vec![parse_dtype(v).unwrap_or_else(|| {
                        eprintln!("tc-perf: unknown dtype {v:?}");
                        usage()
                    })]
                }
            }
            "-r" | "--redop" => {
                a.redops = if v == "all" {
                    ALL_REDOPS.to_vec()
                } else {
                    vec![parse_redop(v).unwrap_or_else(|| {
                        eprintln!("tc-perf: unknown reduce op {v:?}");
                        usage()
                    })]
                }
            }
            "-a" | "--async" => a.async_op = flag_bool(v),
            "-z" | "--blocking" => a.blocking = flag_bool(v),
            "-C" | "--report_cputime" => a.cpu_time = flag_bool(v),
            "-G" | "--cudagraph" => {
                if num(v) != 0 {
                    eprintln!("tc-perf: -G (CUDA graph replays) needs the nccl backend, which is not implemented yet");
                    exit(2);
                }
            }
            "-B" | "--backend" => a.backend = v.to_string(),
            "--root" => a.root = v.parse().unwrap_or_else(|_| usage()),
            "--csv" => a.csv = Some(v.to_string()),
            "--label" => a.label = Some(v.to_string()),
            _ => {
                eprintln!("tc-perf: unknown flag {flag}");
                usage()
            }
        }
        i += 2;
    }
    if a.factor < 2 || a.iters == 0 || a.min_bytes > a.max_bytes {
        eprintln!("tc-perf: need -f >= 2, -n >= 1 and -b <= -e");
        exit(2);
    }
    a
}

// ---- data -------------------------------------------------------------------

/// 8-byte aligned host buffer.
struct Buf(Vec<u64>);

impl Buf {
    fn new(bytes: usize) -> Buf {
        Buf(vec![0u64; bytes.div_ceil(8).max(1)])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

unsafe fn put(dt: DType, p: *mut u8, i: usize, v: f64) {
    match dt {
        DType::F32 => *(p as *mut f32).add(i) = v as f32,
        DType::F64 => *(p as *mut f64).add(i) = v,
        DType::F16 => *(p as *mut u16).add(i) = f32_to_f16(v as f32),
        DType::BF16 => *(p as *mut u16).add(i) = f32_to_bf16(v as f32),
        DType::I8 => *(p as *mut i8).add(i) = v as i8,
        DType::U8 => *p.add(i) = v as u8,
        DType::I32 => *(p as *mut i32).add(i) = v as i32,
        DType::U32 => *(p as *mut u32).add(i) = v as u32,
        DType::I64 => *(p as *mut i64).add(i) = v as i64,
        DType::U64 => *(p as *mut u64).add(i) = v as u64,
        _ => unreachable!("dtype not benchmarked"),
    }
}

unsafe fn get(dt: DType, p: *const u8, i: usize) -> f64 {
    match dt {
        DType::F32 => *(p as *const f32).add(i) as f64,
        DType::F64 => *(p as *const f64).add(i),
        DType::F16 => f16_to_f32(*(p as *const u16).add(i)) as f64,
        DType::BF16 => bf16_to_f32(*(p as *const u16).add(i)) as f64,
        DType::I8 => *(p as *const i8).add(i) as f64,
        DType::U8 => *p.add(i) as f64,
        DType::I32 => *(p as *const i32).add(i) as f64,
        DType::U32 => *(p as *const u32).add(i) as f64,
        DType::I64 => *(p as *const i64).add(i) as f64,
        DType::U64 => *(p as *const u64).add(i) as f64,
        _ => unreachable!("dtype not benchmarked"),
    }
}

/// Element `i` of rank `r`'s input for a check run with `seed`: small
/// non-zero integers, exact in every dtype and after reduction over the
/// ranks (1..=2 for products so that they stay small).
fn value(r: usize, i: usize, seed: usize, red: RedKind) -> f64 {
    // A mixing hash, so that no pattern of ranks, offsets and blocks lines
    // up with another rank's data.
    let mut x = (r as u64) << 48 ^ (seed as u64) << 32 ^ i as u64;
    x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    let h = x as usize;
    if red == RedKind::Product {
        (1 + h % 2) as f64
    } else {
        (1 + h % 5) as f64
    }
}

fn reduce_values(red: RedKind, vals: impl Iterator<Item = f64>, n: usize) -> f64 {
    let mut it = vals;
    let first = it.next().unwrap();
    let acc = it.fold(first, |a, b| match red {
        RedKind::Sum | RedKind::Avg => a + b,
        RedKind::Product => a * b,
        RedKind::Min => a.min(b),
        RedKind::Max => a.max(b),
        _ => unreachable!(),
    });
    if red == RedKind::Avg {
        acc / n as f64
    } else {
        acc
    }
}

fn matches(dt: DType, red: RedKind, got: f64, want: f64) -> bool {
    let want = match dt {
        // Round the expectation into the dtype first.
        DType::F16 => f16_to_f32(f32_to_f16(want as f32)) as f64,
        DType::BF16 => bf16_to_f32(f32_to_bf16(want as f32)) as f64,
        DType::F32 => want as f32 as f64,
        _ => want,
    };
    if dt.is_floating() {
        let tol = match dt {
            DType::F16 | DType::BF16 => 1e-2,
            DType::F32 => 1e-6,
            _ => 1e-12,
        };
        (got - want).abs() <= tol * want.abs().max(1.0)
    } else if red == RedKind::Avg {
        // Integer averages may truncate or round.
        (got - want).abs() < 1.0
    } else {
        got == want
    }
}

// ---- one measurement ----------------------------------------------------------

/// Buffers and the operation for one (size, placement).
struct Case {
    coll: Coll,
    dt: DType,
    red: RedKind,
    in_place: bool,
    rank: usize,
    n: usize,
    root: usize,
    /// Elements each rank contributes (per block for the total-size ops).
    count: usize,
    input: Buf,
    output: Buf,
}

impl Case {
    fn new(coll: Coll, dt: DType, red: RedKind, in_place: bool, rank: usize, n: usize, root: usize, count: usize) -> Case {
        let es = dt.size();
        let (in_elems, out_elems) = match coll {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => (count, count),
            Coll::AllGather | Coll::Gather => (count, count * n),
            Coll::ReduceScatter | Coll::Scatter => (count * n, count),
            Coll::AllToAll => (count * n, count * n),
            Coll::Barrier => (0, 0),
        };
        let input = Buf::new(in_elems * es);
        // In place: one allocation holds both (the larger one).
        let output = if in_place { Buf::new(0) } else { Buf::new(out_elems * es) };
        let input = if in_place { Buf::new(in_elems.max(out_elems) * es) } else { input };
        Case { coll, dt, red, in_place, rank, n, root, count, input, output }
    }

    fn reduce_op(&self) -> ReduceOp {
        ReduceOp { kind: self.red, factor: PremulFactor::Host(1.0) }
    }

    /// (where this rank's input starts, where its output starts)
    fn ptrs(&mut self) -> (*mut u8, *mut u8) {
        let es = self.dt.size();
        if !self.in_place {
            return (self.input.ptr(), self.output.ptr());
        }
        let base = self.input.ptr();
        match self.coll {
            // The rank's block of the gathered output is its input.
            Coll::AllGather => (unsafe { base.add(self.rank * self.count * es) }, base),
            // The output is the rank's block of the input.
            Coll::ReduceScatter => (base, unsafe { base.add(self.rank * self.count * es) }),
            _ => (base, base),
        }
    }

    fn op(&mut self) -> Op {
        let (inp, out) = self.ptrs();
        let (inp, out) = (Ptr(inp as *mut _), Ptr(out as *mut _));
        let (count, dtype, root) = (self.count, self.dt, self.root as i32);
        let es = dtype.size();
        let n = self.n;
        match self.coll {
            Coll::AllReduce => Op::AllReduce { buf: inp, count, dtype, op: self.reduce_op() },
            Coll::Broadcast => Op::Broadcast { buf: inp, count, dtype, root },
            Coll::Reduce => Op::Reduce { buf: inp, count, dtype, root, op: self.reduce_op() },
            Coll::AllGather => Op::AllGatherSingle { output: out, input: inp, count, dtype },
            Coll::ReduceScatter => Op::ReduceScatterSingle { output: out, input: inp, count, dtype, op: self.reduce_op() },
            Coll::AllToAll => Op::AllToAllSingle { output: out, input: inp, count, dtype },
            Coll::SendRecv => {
                let next = ((self.rank + 1) % n) as i32;
                let prev = ((self.rank + n - 1) % n) as i32;
                Op::Batch {
                    ops: vec![
                        P2p { is_send: true, buf: inp, count, dtype, peer: next },
                        P2p { is_send: false, buf: out, count, dtype, peer: prev },
                    ],
                }
            }
            Coll::Gather => {
                let outputs = if self.rank == self.root {
                    (0..n).map(|r| Ptr(unsafe { out.as_u8().add(r * count * es) } as *mut _)).collect()
                } else {
                    Vec::new()
                };
                Op::Gather { outputs, input: inp, count, dtype, root }
            }
            Coll::Scatter => {
                let inputs = if self.rank == self.root {
                    (0..n).map(|r| Ptr(unsafe { inp.as_u8().add(r * count * es) } as *mut _)).collect()
                } else {
                    Vec::new()
                };
                Op::Scatter { output: out, inputs, count, dtype, root }
            }
            Coll::Barrier => Op::Barrier,
        }
    }

    /// Elements of the input and output of this rank (in place: of the
    /// shared buffer).
    fn in_elems(&self) -> usize {
        match self.coll {
            Coll::ReduceScatter | Coll::AllToAll => self.count * self.n,
            Coll::Scatter if self.rank == self.root => self.count * self.n,
            Coll::Scatter => 0,
            Coll::Barrier => 0,
            _ => self.count,
        }
    }

    /// Input element `i` of rank `r` for `seed`.
    fn v(&self, r: usize, i: usize, seed: usize) -> f64 {
        value(r, i, seed, self.red)
    }

    /// Fills this rank's input with fresh data and the rest of the output
    /// with a non-zero sentinel.
    fn fill(&mut self, seed: usize) {
        let dt = self.dt;
        let es = dt.size();
        let sentinel = 9.0;
        if !self.in_place {
            let out_elems = self.output.0.len() * 8 / es;
            let o = self.output.ptr();
            for i in 0..out_elems {
                unsafe { put(dt, o, i, sentinel) };
            }
        } else {
            let all = self.input.0.len() * 8 / es;
            let b = self.input.ptr();
            for i in 0..all {
                unsafe { put(dt, b, i, sentinel) };
            }
        }
        let (inp, _) = self.ptrs();
        for i in 0..self.in_elems() {
            let v = self.v(self.rank, i, seed);
            unsafe { put(dt, inp, i, v) };
        }
    }

    /// Number of wrong elements of this rank's result.
    fn check(&mut self, seed: usize) -> u64 {
        let (n, me, c, root, dt, red) = (self.n, self.rank, self.count, self.root, self.dt, self.red);
        let (_, out) = self.ptrs();
        let out = out as *const u8;
        let mut wrong = 0u64;
        let mut expect = |i: usize, want: f64| {
            let got = unsafe { get(dt, out, i) };
            if !matches(dt, red, got, want) {
                wrong += 1;
            }
        };
        match self.coll {
            Coll::AllReduce => {
                for i in 0..c {
                    expect(i, reduce_values(red, (0..n).map(|r| self.v(r, i, seed)), n));
                }
            }
            Coll::Reduce => {
                if me == root {
                    for i in 0..c {
                        expect(i, reduce_values(red, (0..n).map(|r| self.v(r, i, seed)), n));
                    }
                }
            }
            Coll::Broadcast => {
                for i in 0..c {
                    expect(i, self.v(root, i, seed));
                }
            }
            Coll::AllGather => {
                for r in 0..n {
                    for j in 0..c {
                        expect(r * c + j, self.v(r, j, seed));
                    }
                }
            }
            Coll::Gather => {
                if me == root {
                    for r in 0..n {
                        for j in 0..c {
                            expect(r * c + j, self.v(r, j, seed));
                        }
                    }
                }
            }
            Coll::ReduceScatter => {
                for j in 0..c {
                    expect(j, reduce_values(red, (0..n).map(|r| self.v(r, me * c + j, seed)), n));
                }
            }
            Coll::Scatter => {
                for j in 0..c {
                    expect(j, self.v(root, me * c + j, seed));
                }
            }
            Coll::AllToAll => {
                for s in 0..n {
                    for j in 0..c {
                        expect(s * c + j, self.v(s, me * c + j, seed));
                    }
                }
            }
            Coll::SendRecv => {
                let prev = (me + n - 1) % n;
                for j in 0..c {
                    expect(j, self.v(prev, j, seed));
                }
            }
            Coll::Barrier => {}
        }
        wrong
    }
}

fn die(what: &str, e: torchcomm::error::Error) -> ! {
    eprintln!("tc-perf: {what}: {}", e.message);
    exit(1)
}

struct Bench {
    comm: Arc<Comm>,
    args: Args,
    n: usize,
    seed: usize,
}

impl Bench {
    fn submit(&self, op: Op, async_op: bool) -> Arc<dyn Work> {
        let opts = OpOptions { async_op, ..Default::default() };
        self.comm.submit(op, &opts).unwrap_or_else(|e| die("operation failed", e))
    }

    fn barrier(&self) {
        self.submit(Op::Barrier, false);
    }

    /// Sum over ranks of `v` (float64 all-reduce).
    fn sum_over_ranks(&self, v: f64) -> f64 {
        let mut x = [v];
        let op = Op::AllReduce { buf: Ptr(x.as_mut_ptr() as *mut _), count: 1, dtype: DType::F64, op: ReduceOp::SUM };
        self.submit(op, false);
        x[0]
    }

    /// Runs warm-up and timed iterations, then a checked run; returns (mean
    /// time in us over ranks, wrong elements over ranks).
    fn measure(&mut self, case: &mut Case) -> (f64, Option<u64>) {
        let a = &self.args;
        let (iters, warmup, async_op, blocking, cpu_time, check) = (a.iters, a.warmup, a.async_op, a.blocking, a.cpu_time, a.check);
        self.seed += 1;
        case.fill(self.seed);
        for _ in 0..warmup {
            let w = self.submit(case.op(), async_op);
            w.wait_blocking().unwrap_or_else(|e| die("warm-up", e));
        }
        let ops: Vec<Op> = (0..iters).map(|_| case.op()).collect();
        self.barrier();
        let start = Instant::now();
        let mut works = Vec::with_capacity(if async_op { iters } else { 0 });
        for op in ops {
            let w = self.submit(op, async_op);
            if async_op {
                if blocking {
                    w.wait_blocking().unwrap_or_else(|e| die("operation failed", e));
                } else {
                    works.push(w);
                }
            }
        }
        let issued = start.elapsed();
        for w in works {
            w.wait_blocking().unwrap_or_else(|e| die("operation failed", e));
        }
        let elapsed = if cpu_time { issued } else { start.elapsed() };
        let us = elapsed.as_secs_f64() * 1e6 / iters as f64;
        let mean = self.sum_over_ranks(us) / self.n as f64;
        let wrong = if check {
            self.seed += 1;
            case.fill(self.seed);
            self.submit(case.op(), false);
            let w = case.check(self.seed);
            Some(self.sum_over_ranks(w as f64) as u64)
        } else {
            None
        };
        (mean, wrong)
    }
}

fn main() {
    let args = parse_args();
    let device = if args.backend == "gloo" { Device::Cpu } else { Device::Cuda(None) };
    if device != Device::Cpu {
        eprintln!("tc-perf: backend {:?}: only host-memory backends (gloo) are benchmarked so far", args.backend);
        exit(2);
    }
    let opts = CommOptions { name: Some("tc-perf".into()), ..Default::default() };
    let comm = Comm::new(&args.backend, device, opts).unwrap_or_else(|e| die("creating the communicator", e));
    let rank = comm.rank() as usize;
    let n = comm.size() as usize;
    if args.root < 0 || args.root as usize >= n {
        eprintln!("tc-perf: --root {} is outside [0, {n})", args.root);
        exit(2);
    }
    let label = args.label.clone().unwrap_or_else(|| format!("torchcomm-{}", args.backend));
    let mut csv = if rank == 0 {
        args.csv.as_ref().map(|path| {
            let new = std::fs::metadata(path).map(|m| m.len() == 0).unwrap_or(true);
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| {
                    eprintln!("tc-perf: opening {path}: {e}");
                    exit(2)
                });
            if new {
                writeln!(f, "system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong").unwrap();
            }
            f
        })
    } else {
        None
    };
    let coll = args.coll;
    let mode = match (args.async_op, args.blocking) {
        (false, _) => "blocking calls (async_op=0)",
        (true, false) => "async_op=1, one wait after the loop",
        (true, true) => "async_op=1, wait after each",
    };
    if rank == 0 {
        println!(
            "# tc-perf: {} on backend {} ({}), {} ranks, iters {}, warm-up {}, check {}, {}{}",
            coll.name(),
            args.backend,
            label,
            n,
            args.iters,
            args.warmup,
            args.check as u8,
            mode,
            if args.cpu_time { ", time = host time issuing (-C)" } else { "" }
        );
        println!("#");
        println!(
            "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "", "", "", "", "", "out-of-place", "", "", "", "in-place", "", "", ""
        );
        println!(
            "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
        );
        println!(
            "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
    }
    let mut bench = Bench { comm: comm.clone(), args, n, seed: 0 };
    let mut busbw_sum = 0.0;
    let mut busbw_count = 0usize;
    let mut wrong_total = 0u64;
    let redops: Vec<RedKind> = if coll.reduces() { bench.args.redops.clone() } else { vec![RedKind::Sum] };
    let dtypes: Vec<DType> = if coll == Coll::Barrier { vec![DType::U8] } else { bench.args.dtypes.clone() };
    // Sizes in the sweep.
    let mut sizes = Vec::new();
    if coll == Coll::Barrier {
        sizes.push(0);
    } else {
        let mut s = bench.args.min_bytes;
        loop {
            sizes.push(s);
            if s >= bench.args.max_bytes {
                break;
            }
            s = s.saturating_mul(bench.args.factor).min(bench.args.max_bytes);
        }
    }
    for &dt in &dtypes {
        for &red in &redops {
            let mut last_bytes = usize::MAX;
            for &size in &sizes {
                let es = dt.size();
                let per = if coll.size_is_total() { es * n } else { es };
                let count = size / per;
                if coll != Coll::Barrier && count == 0 {
                    continue;
                }
                let bytes = count * per;
                if bytes == last_bytes {
                    continue;
                }
                last_bytes = bytes;
                let mut line = String::new();
                let total_count = if coll.size_is_total() { count * n } else { count };
                let redname = if coll.reduces() { red.name() } else { "none" };
                let root = if coll.rooted() { bench.args.root.to_string() } else { "-1".into() };
                let type_name = if coll == Coll::Barrier { "none" } else { dt.name() };
                let _ = write!(line, "  {:>10} {:>12} {:>9} {:>6} {:>5}", bytes, total_count, type_name, redname, root);
                for in_place in [false, true] {
                    let supported = if coll == Coll::Barrier { !in_place } else if in_place { coll.has_in_place() } else { coll.has_out_of_place() };
                    if !supported {
                        let _ = write!(line, "   {:>9} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A");
                        continue;
                    }
                    let mut case = Case::new(coll, dt, red, in_place, rank, n, bench.args.root as usize, count);
                    let (us, wrong) = bench.measure(&mut case);
                    let algbw = bytes as f64 / (us * 1e-6) / 1e9;
                    let busbw = algbw * coll.bus_factor(n);
                    if coll != Coll::Barrier {
                        busbw_sum += busbw;
                        busbw_count += 1;
                    }
                    wrong_total += wrong.unwrap_or(0);
                    let wrong_s = wrong.map_or("N/A".to_string(), |w| w.to_string());
                    let _ = write!(line, "   {:>9.2} {:>7.3} {:>7.3} {:>6}", us, algbw, busbw, wrong_s);
                    if let Some(f) = csv.as_mut() {
                        writeln!(
                            f,
                            "{label},{},{n},{bytes},{total_count},{type_name},{redname},{root},{},{us:.3},{algbw:.6},{busbw:.6},{}",
                            coll.name(),
                            if in_place { "in-place" } else { "out-of-place" },
                            wrong.map_or(-1i64, |w| w as i64)
                        )
                        .unwrap_or_else(|e| {
                            eprintln!("tc-perf: writing the CSV: {e}");
                            exit(1)
                        });
                    }
                }
                if rank == 0 {
                    println!("{line}");
                }
            }
        }
    }
    if rank == 0 {
        println!("# Out of bounds values : {wrong_total} {}", if wrong_total == 0 { "OK" } else { "FAILED" });
        if busbw_count > 0 {
            println!("# Avg bus bandwidth    : {:.6} ", busbw_sum / busbw_count as f64);
        }
        println!("#");
        let _ = std::io::stdout().flush();
    }
    drop(bench);
    comm.finalize().unwrap_or_else(|e| die("finalize", e));
    comm.release();
    if wrong_total > 0 {
        exit(1);
    }
}
