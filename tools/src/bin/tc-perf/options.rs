//! The command line: flags, `--help`, and which backend runs by default.

use crate::coll::Coll;
use std::process::exit;
use torchcomm::cuda;
use torchcomm::{DType, RedKind};

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

/// The parsed command line.
pub(crate) struct Args {
    pub(crate) min_bytes: usize,
    pub(crate) max_bytes: usize,
    pub(crate) factor: usize,
    pub(crate) iters: usize,
    pub(crate) warmup: usize,
    pub(crate) check: bool,
    pub(crate) coll: Coll,
    pub(crate) dtypes: Vec<DType>,
    pub(crate) redops: Vec<RedKind>,
    pub(crate) async_op: bool,
    pub(crate) blocking: bool,
    pub(crate) cpu_time: bool,
    pub(crate) graphs: usize,
    pub(crate) backend: String,
    pub(crate) root: i32,
    pub(crate) csv: Option<String>,
    pub(crate) label: Option<String>,
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

/// The command line, or exit: 0 after `--help`, 2 after a bad flag.
pub(crate) fn parse_args() -> Args {
    let mut a = Args::defaults();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
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
        a.set(flag, v);
        i += 2;
    }
    a.finish();
    a
}

/// A 0|1 flag value.
fn flag_bool(v: &str) -> bool {
    match v {
        "0" => false,
        "1" => true,
        _ => usage(),
    }
}

fn num(v: &str) -> usize {
    v.parse::<usize>().unwrap_or_else(|_| usage())
}

impl Args {
    fn defaults() -> Args {
        Args {
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
        }
    }

    /// One flag and its value.
    fn set(&mut self, flag: &str, v: &str) {
        let a = self;
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
    }

    /// Checks that need every flag, and the default backend.
    fn finish(&mut self) {
        let a = self;
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
    }
}

/// Ok when the nccl backend can run here: the CUDA driver, NCCL and at least
/// one device. Otherwise the `TC_ERR_UNAVAILABLE` error saying what is
/// missing.
pub(crate) fn gpu_usable() -> torchcomm::Result<i32> {
    // The driver first: without it NCCL is not even looked for.
    cuda::available().map_err(|e| e.context("the nccl backend is unavailable"))?;
    torchcomm::backend_available("nccl")?;
    let count = cuda::device_count()?;
    if count < 1 {
        return Err(torchcomm::Error::unavailable(
            "the nccl backend is unavailable: no CUDA device is visible",
        ));
    }
    Ok(count)
}

/// The first of `vars` that is set, as an integer.
pub(crate) fn env_int(vars: &[&str]) -> Option<i32> {
    vars.iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|s| s.trim().parse().ok())
}

// ---- data -------------------------------------------------------------------
