//! tc-perf: bandwidth and latency of every operation, in nccl-tests' columns.
//!
//! Run under any launcher (`tc-run -n 2 -- tc-perf -o all_reduce`); every rank
//! runs the same sweep and rank 0 prints the table.
//!
//! Every flag, the columns and how time is measured: `HELP` below, printed
//! by `tc-perf --help`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::exit;
use std::sync::Arc;
use std::time::Instant;
use torchcomm::comm::{Comm, CommOptions, Op, OpOptions, P2p, Ptr};
use torchcomm::cuda;
use torchcomm::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
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
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }
    /// The size names the whole n-rank buffer (each rank holds size / n).
    fn size_is_total(self) -> bool {
        matches!(
            self,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll | Coll::Gather | Coll::Scatter
        )
    }
    fn has_out_of_place(self) -> bool {
        matches!(
            self,
            Coll::AllGather
                | Coll::ReduceScatter
                | Coll::AllToAll
                | Coll::SendRecv
                | Coll::Gather
                | Coll::Scatter
        )
    }
    fn has_in_place(self) -> bool {
        matches!(
            self,
            Coll::AllReduce
                | Coll::AllGather
                | Coll::ReduceScatter
                | Coll::Broadcast
                | Coll::Reduce
                | Coll::AllToAll
        )
    }
    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather
            | Coll::ReduceScatter
            | Coll::AllToAll
            | Coll::Gather
            | Coll::Scatter => (n - 1.0) / n,
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

const ALL_DTYPES: [DType; 10] = [
    DType::I8,
    DType::U8,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::BF16,
];

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

const ALL_REDOPS: [RedKind; 5] = [
    RedKind::Sum,
    RedKind::Product,
    RedKind::Max,
    RedKind::Min,
    RedKind::Avg,
];

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
    graphs: usize,
    backend: String,
    root: i32,
    csv: Option<String>,
    label: Option<String>,
}

/// `tc-perf --help` (stdout, exit 0). tests/perf_smoke.rs checks that every
/// flag parse_args accepts is named here.
const HELP: &str = "\
tc-perf: bandwidth and latency of every operation, in nccl-tests' columns.
Run under a launcher; every rank runs the same sweep and rank 0 prints the table:
  tc-run -n 2 -- tc-perf -b 8 -e 128M -f 2 -o all_reduce

Flags (nccl-tests' names where they exist; every flag takes a value):
  -b, --minbytes SIZE      smallest size in bytes, K/M/G suffixes allowed (default 32M)
  -e, --maxbytes SIZE      largest size in bytes (default 32M)
  -f, --stepfactor N       multiply the size by N from -b to -e (N >= 2, default 2)
  -n, --iters N            timed iterations per size (default 20)
  -w, --warmup_iters N     warm-up iterations per size, not timed (default 5)
  -c, --check 0|1          check every element of every result (default 1)
  -o, --op OP              all_reduce (default), all_gather, reduce_scatter, broadcast,
                           reduce, all_to_all, sendrecv, gather, scatter or barrier
  -d, --datatype DTYPE     float32 (float, default), float64 (double), float16 (half),
                           bfloat16, int8, uint8, int32, uint32, int64, uint64, or all
  -r, --redop OP           sum (default), prod, min, max, avg, or all
  -a, --async 0|1          1: issue with async_op = 1 and wait for all works after the
                           loop (nccl-tests' pipelined mode); 0 (default): each call
                           blocks until done (on nccl: until enqueued on the stream)
  -z, --blocking 0|1       with -a 1: wait for each work before issuing the next (on
                           nccl also with -a 0: synchronize the stream after each call)
  -C, --report_cputime 0|1 report host time per call spent issuing (with -a 1: the
                           enqueue cost) instead of the elapsed time
  -G, --cudagraph N        nccl only: capture the timed loop into a CUDA graph and
                           replay it N times (time per call = total / (iters x N))
  -B, --backend NAME       gloo or nccl (default nccl when a CUDA device, the driver
                           and NCCL are usable, else gloo)
  --root R                 root rank of broadcast, reduce, gather, scatter (default 0)
  --csv FILE               append one line per measurement (a header when the file is
                           new); it holds host_us and device_us whatever -C says
  --label NAME             system name in the CSV (default torchcomm-BACKEND)
  -h, --help               this text

Sizes are the bytes of one rank's buffer as nccl-tests counts them: for all_gather,
reduce_scatter, all_to_all, gather and scatter the whole n-rank buffer (each rank
contributes size / n). Time is the mean over ranks of (elapsed / iterations);
algbw = size / time; busbw = algbw x nccl-tests' factor. all_reduce, broadcast and
reduce exist only in place in this API; sendrecv, gather and scatter only out of
place: the other column shows N/A.

On nccl the buffers are CUDA device memory (filled and checked through host copies)
and every call goes to one non-blocking stream of the benchmark's own; time is device
time from CUDA events recorded on that stream around the timed loop (with -C: host
time issuing).
";

/// A bad command line: the synopsis on stderr, exit 2.
fn usage() -> ! {
    eprintln!(
        "usage: tc-perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n\
         \x20              [-o all_reduce|all_gather|reduce_scatter|broadcast|reduce|all_to_all|sendrecv|gather|scatter|barrier]\n\
         \x20              [-d DTYPE|all] [-r sum|prod|min|max|avg|all] [-a 0|1] [-z 0|1] [-C 0|1]\n\
         \x20              [-G REPLAYS] [-B gloo|nccl] [--root R] [--csv FILE] [--label NAME]\n\
         Run under a launcher, e.g. tc-run -n 2 -- tc-perf -b 8 -e 128M -f 2 -o all_reduce\n\
         tc-perf --help explains every flag."
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
        graphs: 0,
        backend: String::new(),
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
            print!("{HELP}");
            exit(0);
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
            "-G" | "--cudagraph" => a.graphs = num(v),
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
    if a.backend.is_empty() {
        a.backend = if gpu_usable().is_ok() {
            "nccl".into()
        } else {
            "gloo".into()
        };
    }
    if a.graphs > 0 && a.backend != "nccl" {
        eprintln!(
            "tc-perf: -G (CUDA graph replays) needs -B nccl (backend here: {})",
            a.backend
        );
        exit(2);
    }
    a
}

/// Ok when the nccl backend can run here: the CUDA driver, NCCL and at least
/// one device. Otherwise the `TC_ERR_UNAVAILABLE` error saying what is
/// missing.
fn gpu_usable() -> torchcomm::error::Result<i32> {
    // The driver first: without it NCCL is not even looked for.
    cuda::available().map_err(|e| e.context("the nccl backend is unavailable"))?;
    torchcomm::backends::nccl::load()?;
    let count = cuda::device_count()?;
    if count < 1 {
        return Err(torchcomm::error::Error::unavailable(
            "the nccl backend is unavailable: no CUDA device is visible",
        ));
    }
    Ok(count)
}

/// The first of `vars` that is set, as an integer.
fn env_int(vars: &[&str]) -> Option<i32> {
    vars.iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|s| s.trim().parse().ok())
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
    /// On a GPU backend: device copies of `input` and `output`, which the
    /// operations use; the host buffers only stage data and checks.
    dev: Option<(cuda::DeviceBuffer, cuda::DeviceBuffer)>,
}

fn bytes_of(b: &mut Buf) -> &mut [u8] {
    let len = b.0.len() * 8;
    // SAFETY: a Vec<u64> of `len / 8` elements is `len` initialized bytes.
    unsafe { std::slice::from_raw_parts_mut(b.ptr(), len) }
}

/// This rank, the world size and the root of a measured case.
struct Ranks {
    rank: usize,
    n: usize,
    root: usize,
}

impl Case {
    fn new(
        coll: Coll,
        dt: DType,
        red: RedKind,
        in_place: bool,
        ranks: Ranks,
        count: usize,
    ) -> Case {
        let Ranks { rank, n, root } = ranks;
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
        let output = if in_place {
            Buf::new(0)
        } else {
            Buf::new(out_elems * es)
        };
        let input = if in_place {
            Buf::new(in_elems.max(out_elems) * es)
        } else {
            input
        };
        Case {
            coll,
            dt,
            red,
            in_place,
            rank,
            n,
            root,
            count,
            input,
            output,
            dev: None,
        }
    }

    /// Allocates device copies of the buffers (same sizes) on `device`.
    fn on_device(mut self, device: &Arc<cuda::Device>) -> torchcomm::error::Result<Case> {
        let i = cuda::DeviceBuffer::zeroed(device, self.input.0.len() * 8)?;
        let o = cuda::DeviceBuffer::zeroed(device, self.output.0.len() * 8)?;
        self.dev = Some((i, o));
        Ok(self)
    }

    /// Host data to the device buffers (both: the output holds sentinels).
    fn upload(&mut self) -> torchcomm::error::Result<()> {
        if let Some((di, dout)) = &self.dev {
            cuda::copy_to_device(di.ptr(), bytes_of(&mut self.input))?;
            cuda::copy_to_device(dout.ptr(), bytes_of(&mut self.output))?;
        }
        Ok(())
    }

    /// The device's result back into the host buffer that holds the output.
    fn download(&mut self) -> torchcomm::error::Result<()> {
        if let Some((di, dout)) = &self.dev {
            if self.in_place {
                cuda::copy_to_host(bytes_of(&mut self.input), di.ptr())?;
            } else {
                cuda::copy_to_host(bytes_of(&mut self.output), dout.ptr())?;
            }
        }
        Ok(())
    }

    fn reduce_op(&self) -> ReduceOp {
        ReduceOp {
            kind: self.red,
            factor: PremulFactor::Host(1.0),
        }
    }

    /// (where this rank's input starts, where its output starts) in the
    /// host buffers.
    fn ptrs(&mut self) -> (*mut u8, *mut u8) {
        let (i, o) = (self.input.ptr(), self.output.ptr());
        self.ptrs_in(i, o)
    }

    /// The same in the buffers the operations use (device ones on a GPU).
    fn op_ptrs(&mut self) -> (*mut u8, *mut u8) {
        match &self.dev {
            Some((i, o)) => {
                let (i, o) = (i.ptr() as *mut u8, o.ptr() as *mut u8);
                self.ptrs_in(i, o)
            }
            None => self.ptrs(),
        }
    }

    fn ptrs_in(&self, input: *mut u8, output: *mut u8) -> (*mut u8, *mut u8) {
        let es = self.dt.size();
        if !self.in_place {
            return (input, output);
        }
        let base = input;
        match self.coll {
            // The rank's block of the gathered output is its input.
            Coll::AllGather => (unsafe { base.add(self.rank * self.count * es) }, base),
            // The output is the rank's block of the input.
            Coll::ReduceScatter => (base, unsafe { base.add(self.rank * self.count * es) }),
            _ => (base, base),
        }
    }

    fn op(&mut self) -> Op {
        let (inp, out) = self.op_ptrs();
        let (inp, out) = (Ptr(inp as *mut _), Ptr(out as *mut _));
        let (count, dtype, root) = (self.count, self.dt, self.root as i32);
        let es = dtype.size();
        let n = self.n;
        match self.coll {
            Coll::AllReduce => Op::AllReduce {
                buf: inp,
                count,
                dtype,
                op: self.reduce_op(),
            },
            Coll::Broadcast => Op::Broadcast {
                buf: inp,
                count,
                dtype,
                root,
            },
            Coll::Reduce => Op::Reduce {
                buf: inp,
                count,
                dtype,
                root,
                op: self.reduce_op(),
            },
            Coll::AllGather => Op::AllGatherSingle {
                output: out,
                input: inp,
                count,
                dtype,
            },
            Coll::ReduceScatter => Op::ReduceScatterSingle {
                output: out,
                input: inp,
                count,
                dtype,
                op: self.reduce_op(),
            },
            Coll::AllToAll => Op::AllToAllSingle {
                output: out,
                input: inp,
                count,
                dtype,
            },
            Coll::SendRecv => {
                let next = ((self.rank + 1) % n) as i32;
                let prev = ((self.rank + n - 1) % n) as i32;
                Op::Batch {
                    ops: vec![
                        P2p {
                            is_send: true,
                            buf: inp,
                            count,
                            dtype,
                            peer: next,
                            tag: 0,
                        },
                        P2p {
                            is_send: false,
                            buf: out,
                            count,
                            dtype,
                            peer: prev,
                            tag: 0,
                        },
                    ],
                }
            }
            Coll::Gather => {
                let outputs = if self.rank == self.root {
                    (0..n)
                        .map(|r| Ptr(unsafe { out.as_u8().add(r * count * es) } as *mut _))
                        .collect()
                } else {
                    Vec::new()
                };
                Op::Gather {
                    outputs,
                    input: inp,
                    count,
                    dtype,
                    root,
                }
            }
            Coll::Scatter => {
                let inputs = if self.rank == self.root {
                    (0..n)
                        .map(|r| Ptr(unsafe { inp.as_u8().add(r * count * es) } as *mut _))
                        .collect()
                } else {
                    Vec::new()
                };
                Op::Scatter {
                    output: out,
                    inputs,
                    count,
                    dtype,
                    root,
                }
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
        self.upload()
            .unwrap_or_else(|e| die("copying the input to the device", e));
    }

    /// Number of wrong elements of this rank's result.
    fn check(&mut self, seed: usize) -> u64 {
        self.download()
            .unwrap_or_else(|e| die("copying the result from the device", e));
        let (n, me, c, root, dt, red) =
            (self.n, self.rank, self.count, self.root, self.dt, self.red);
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
                    expect(
                        j,
                        reduce_values(red, (0..n).map(|r| self.v(r, me * c + j, seed)), n),
                    );
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

/// The benchmark's CUDA state on a GPU backend: its device, its stream and
/// the timing events around the timed loop.
struct Gpu {
    device: Arc<cuda::Device>,
    stream: cuda::Stream,
    start: cuda::TimingEvent,
    end: cuda::TimingEvent,
    /// One float64 for the reductions of the figures over ranks.
    scratch: cuda::DeviceBuffer,
}

impl Gpu {
    fn new(ordinal: i32) -> torchcomm::error::Result<Gpu> {
        let device = cuda::Device::open(ordinal)?;
        // Current on this thread for good: copies, events and graph calls
        // below run without a scope of their own.
        device.make_current()?;
        let stream = cuda::Stream::new(&device, 0)?;
        let start = cuda::TimingEvent::new(&device)?;
        let end = cuda::TimingEvent::new(&device)?;
        let scratch = cuda::DeviceBuffer::zeroed(&device, 8)?;
        Ok(Gpu {
            device,
            stream,
            start,
            end,
            scratch,
        })
    }
}

/// One measurement: per call, mean over ranks.
struct Figures {
    /// The reported time (us): device time on a GPU, elapsed on the host,
    /// host issuing time with -C.
    time: f64,
    /// Host time spent issuing (us per call).
    host: f64,
    /// Device time from CUDA events (us per call); GPU backends only.
    device: Option<f64>,
    wrong: Option<u64>,
}

struct Bench {
    comm: Arc<Comm>,
    args: Args,
    n: usize,
    seed: usize,
    gpu: Option<Gpu>,
}

impl Bench {
    fn stream(&self) -> *mut std::ffi::c_void {
        self.gpu
            .as_ref()
            .map_or(std::ptr::null_mut(), |g| g.stream.raw() as *mut _)
    }

    fn submit(&self, op: Op, async_op: bool) -> Arc<dyn Work> {
        let opts = OpOptions {
            async_op,
            stream: self.stream(),
            ..Default::default()
        };
        self.comm
            .submit(op, &opts)
            .unwrap_or_else(|e| die("operation failed", e))
    }

    /// Waits for everything on the benchmark's stream (GPU backends).
    fn sync(&self) {
        if let Some(g) = &self.gpu {
            cuda::stream_synchronize(g.stream.raw())
                .unwrap_or_else(|e| die("synchronizing the stream", e));
        }
    }

    fn barrier(&self) {
        self.submit(Op::Barrier, false);
        self.sync();
    }

    /// Sum over ranks of `v` (float64 all-reduce).
    fn sum_over_ranks(&self, v: f64) -> f64 {
        let mut x = [v];
        let buf = match &self.gpu {
            Some(g) => {
                cuda::copy_to_device(g.scratch.ptr(), &v.to_ne_bytes())
                    .unwrap_or_else(|e| die("copy to the device", e));
                g.scratch.ptr()
            }
            None => x.as_mut_ptr() as *mut _,
        };
        let op = Op::AllReduce {
            buf: Ptr(buf),
            count: 1,
            dtype: DType::F64,
            op: ReduceOp::SUM,
        };
        self.submit(op, false);
        if let Some(g) = &self.gpu {
            self.sync();
            let mut b = [0u8; 8];
            cuda::copy_to_host(&mut b, g.scratch.ptr())
                .unwrap_or_else(|e| die("copy from the device", e));
            x[0] = f64::from_ne_bytes(b);
        }
        x[0]
    }

    /// Runs warm-up and timed iterations, then a checked run.
    fn measure(&mut self, case: &mut Case) -> Figures {
        if self.gpu.is_some() {
            return self.measure_gpu(case);
        }
        let a = &self.args;
        let (iters, warmup, async_op, blocking, cpu_time) =
            (a.iters, a.warmup, a.async_op, a.blocking, a.cpu_time);
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
                    w.wait_blocking()
                        .unwrap_or_else(|e| die("operation failed", e));
                } else {
                    works.push(w);
                }
            }
        }
        let issued = start.elapsed();
        for w in works {
            w.wait_blocking()
                .unwrap_or_else(|e| die("operation failed", e));
        }
        let elapsed = if cpu_time { issued } else { start.elapsed() };
        let us = elapsed.as_secs_f64() * 1e6 / iters as f64;
        let time = self.sum_over_ranks(us) / self.n as f64;
        let host = self.sum_over_ranks(issued.as_secs_f64() * 1e6 / iters as f64) / self.n as f64;
        let wrong = self.checked_run(case);
        Figures {
            time,
            host,
            device: None,
            wrong,
        }
    }

    /// A run on fresh data, every element checked (unless -c 0): wrong
    /// elements over ranks.
    fn checked_run(&mut self, case: &mut Case) -> Option<u64> {
        if !self.args.check {
            return None;
        }
        self.seed += 1;
        case.fill(self.seed);
        self.submit(case.op(), false);
        self.sync();
        let w = case.check(self.seed);
        Some(self.sum_over_ranks(w as f64) as u64)
    }

    /// The GPU path: every call on the benchmark's stream, device time from
    /// events recorded there around the timed loop; host time of the loop
    /// alone. With -G the loop is captured once and the graph replayed.
    fn measure_gpu(&mut self, case: &mut Case) -> Figures {
        let a = &self.args;
        let (iters, warmup, async_op, blocking, cpu_time, graphs) = (
            a.iters, a.warmup, a.async_op, a.blocking, a.cpu_time, a.graphs,
        );
        let gpu = self.gpu.as_ref().expect("GPU state");
        let s = gpu.stream.raw();
        self.seed += 1;
        case.fill(self.seed);
        let mut works = Vec::with_capacity(iters.max(warmup));
        for _ in 0..warmup {
            works.push(self.submit(case.op(), async_op));
        }
        for w in works.drain(..) {
            w.wait(s as *mut _).unwrap_or_else(|e| die("warm-up", e));
        }
        self.sync();
        let ops: Vec<Op> = (0..iters).map(|_| case.op()).collect();
        let gpu = self.gpu.as_ref().expect("GPU state");
        let (issued, calls) = if graphs > 0 {
            cuda::begin_capture(s).unwrap_or_else(|e| die("starting the graph capture", e));
            for op in ops {
                // Captured work joins the capturing stream: nothing to wait for.
                self.submit(op, async_op);
            }
            let graph = cuda::GraphExec::end_capture(&gpu.device, s)
                .unwrap_or_else(|e| die("capturing the graph", e));
            // One untimed replay (uploads the graph).
            graph
                .launch(s)
                .unwrap_or_else(|e| die("replaying the graph", e));
            self.barrier();
            gpu.start
                .record(s)
                .unwrap_or_else(|e| die("recording an event", e));
            let t0 = Instant::now();
            for _ in 0..graphs {
                graph
                    .launch(s)
                    .unwrap_or_else(|e| die("replaying the graph", e));
            }
            let issued = t0.elapsed();
            gpu.end
                .record(s)
                .unwrap_or_else(|e| die("recording an event", e));
            gpu.end
                .synchronize()
                .unwrap_or_else(|e| die("waiting for the replays", e));
            (issued, iters * graphs)
        } else {
            self.barrier();
            gpu.start
                .record(s)
                .unwrap_or_else(|e| die("recording an event", e));
            let t0 = Instant::now();
            for op in ops {
                let w = self.submit(op, async_op);
                if blocking {
                    if async_op {
                        w.wait_blocking()
                            .unwrap_or_else(|e| die("operation failed", e));
                    } else {
                        cuda::stream_synchronize(s)
                            .unwrap_or_else(|e| die("synchronizing the stream", e));
                    }
                } else if async_op {
                    works.push(w);
                }
            }
            let issued = t0.elapsed();
            // async_op = 1 ran on the comm's stream: ours waits for it.
            for w in works.drain(..) {
                w.wait(s as *mut _)
                    .unwrap_or_else(|e| die("operation failed", e));
            }
            gpu.end
                .record(s)
                .unwrap_or_else(|e| die("recording an event", e));
            gpu.end
                .synchronize()
                .unwrap_or_else(|e| die("waiting for the stream", e));
            (issued, iters)
        };
        let ms = gpu
            .start
            .elapsed_ms(&gpu.end)
            .unwrap_or_else(|e| die("reading the events", e));
        let host = issued.as_secs_f64() * 1e6 / calls as f64;
        let device = ms as f64 * 1e3 / calls as f64;
        let n = self.n as f64;
        let host = self.sum_over_ranks(host) / n;
        let device = self.sum_over_ranks(device) / n;
        let wrong = self.checked_run(case);
        Figures {
            time: if cpu_time { host } else { device },
            host,
            device: Some(device),
            wrong,
        }
    }
}

fn main() {
    let args = parse_args();
    // On nccl: this process's device (local rank modulo the visible
    // devices, as the backend picks it), its stream and events.
    let (device, gpu) = if args.backend == "nccl" {
        let count = gpu_usable().unwrap_or_else(|e| {
            eprintln!(
                "tc-perf: -B nccl: TC_ERR_UNAVAILABLE ({}): {}",
                e.kind.describe().trim_end_matches('\0'),
                e.message
            );
            exit(1)
        });
        let local = env_int(&torchcomm::bootstrap::LOCAL_RANK_VARS)
            .or_else(|| env_int(&torchcomm::bootstrap::RANK_VARS))
            .unwrap_or(0)
            .max(0);
        let ordinal = local % count;
        let gpu = Gpu::new(ordinal)
            .unwrap_or_else(|e| die(&format!("setting up CUDA device {ordinal}"), e));
        (Device::Cuda(Some(ordinal as u32)), Some(gpu))
    } else {
        (Device::Cpu, None)
    };
    let opts = CommOptions {
        name: Some("tc-perf".into()),
        ..Default::default()
    };
    let comm = Comm::new(&args.backend, device, opts)
        .unwrap_or_else(|e| die("creating the communicator", e));
    let rank = comm.rank() as usize;
    let n = comm.size() as usize;
    if args.root < 0 || args.root as usize >= n {
        eprintln!("tc-perf: --root {} is outside [0, {n})", args.root);
        exit(2);
    }
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| format!("torchcomm-{}", args.backend));
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
                writeln!(f, "system,op,nranks,size,count,type,redop,root,placement,time_us,algbw_gbs,busbw_gbs,wrong,host_us,device_us")
                    .unwrap();
            }
            f
        })
    } else {
        None
    };
    let coll = args.coll;
    let mode = match (gpu.is_some(), args.async_op, args.blocking) {
        (false, false, _) => "blocking calls (async_op=0)".to_string(),
        (false, true, false) => "async_op=1, one wait after the loop".to_string(),
        (false, true, true) => "async_op=1, wait after each".to_string(),
        (true, a, z) => format!(
            "CUDA device {}, async_op={}{}{}, time = {}",
            match device {
                Device::Cuda(Some(i)) => i as i64,
                _ => -1,
            },
            a as u8,
            if z {
                ", stream synchronized after each call"
            } else {
                ""
            },
            if args.graphs > 0 {
                format!(", CUDA graph of the loop replayed {} times", args.graphs)
            } else {
                String::new()
            },
            if args.cpu_time {
                "host time issuing per call (-C)"
            } else {
                "device time per call (CUDA events)"
            }
        ),
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
            if args.cpu_time && device == Device::Cpu {
                ", time = host time issuing (-C)"
            } else {
                ""
            }
        );
        println!("#");
        println!(
            "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "", "", "", "", "", "out-of-place", "", "", "", "in-place", "", "", ""
        );
        println!(
            "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        println!(
            "# {:>10} {:>12} {:>9} {:>6} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        );
    }
    let mut bench = Bench {
        comm: comm.clone(),
        args,
        n,
        seed: 0,
        gpu,
    };
    let mut busbw_sum = 0.0;
    let mut busbw_count = 0usize;
    let mut wrong_total = 0u64;
    let redops: Vec<RedKind> = if coll.reduces() {
        bench.args.redops.clone()
    } else {
        vec![RedKind::Sum]
    };
    let dtypes: Vec<DType> = if coll == Coll::Barrier {
        vec![DType::U8]
    } else {
        bench.args.dtypes.clone()
    };
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
            s = s
                .saturating_mul(bench.args.factor)
                .min(bench.args.max_bytes);
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
                let total_count = if coll.size_is_total() {
                    count * n
                } else {
                    count
                };
                let redname = if coll.reduces() { red.name() } else { "none" };
                let root = if coll.rooted() {
                    bench.args.root.to_string()
                } else {
                    "-1".into()
                };
                let type_name = if coll == Coll::Barrier {
                    "none"
                } else {
                    dt.name()
                };
                let _ = write!(
                    line,
                    "  {:>10} {:>12} {:>9} {:>6} {:>5}",
                    bytes, total_count, type_name, redname, root
                );
                for in_place in [false, true] {
                    let supported = if coll == Coll::Barrier {
                        !in_place
                    } else if in_place {
                        coll.has_in_place()
                    } else {
                        coll.has_out_of_place()
                    };
                    if !supported {
                        let _ = write!(
                            line,
                            "   {:>9} {:>7} {:>7} {:>6}",
                            "N/A", "N/A", "N/A", "N/A"
                        );
                        continue;
                    }
                    let mut case = Case::new(
                        coll,
                        dt,
                        red,
                        in_place,
                        Ranks {
                            rank,
                            n,
                            root: bench.args.root as usize,
                        },
                        count,
                    );
                    if let Some(g) = &bench.gpu {
                        case = case
                            .on_device(&g.device)
                            .unwrap_or_else(|e| die("allocating device buffers", e));
                    }
                    let fig = bench.measure(&mut case);
                    let (us, wrong) = (fig.time, fig.wrong);
                    let algbw = bytes as f64 / (us * 1e-6) / 1e9;
                    let busbw = algbw * coll.bus_factor(n);
                    if coll != Coll::Barrier {
                        busbw_sum += busbw;
                        busbw_count += 1;
                    }
                    wrong_total += wrong.unwrap_or(0);
                    let wrong_s = wrong.map_or("N/A".to_string(), |w| w.to_string());
                    let _ = write!(
                        line,
                        "   {:>9.2} {:>7.3} {:>7.3} {:>6}",
                        us, algbw, busbw, wrong_s
                    );
                    if let Some(f) = csv.as_mut() {
                        writeln!(
                            f,
                            "{label},{},{n},{bytes},{total_count},{type_name},{redname},{root},{},{us:.3},{algbw:.6},{busbw:.6},{},{:.3},{}",
                            coll.name(),
                            if in_place { "in-place" } else { "out-of-place" },
                            wrong.map_or(-1i64, |w| w as i64),
                            fig.host,
                            fig.device.map_or(String::new(), |d| format!("{d:.3}"))
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
        println!(
            "# Out of bounds values : {wrong_total} {}",
            if wrong_total == 0 { "OK" } else { "FAILED" }
        );
        if busbw_count > 0 {
            println!(
                "# Avg bus bandwidth    : {:.6} ",
                busbw_sum / busbw_count as f64
            );
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
