//! tc-perf: bandwidth and latency of every operation, in nccl-tests' columns.
//!
//! Run under any launcher (`tc-run -n 2 -- tc-perf -o all_reduce`); every rank
//! runs the same sweep and rank 0 prints the table.
//!
//! Every flag, the columns and how time is measured: `HELP` in options.rs,
//! printed by `tc-perf --help`. The modules: `options` (the command line),
//! `coll` (the operations), `case` (one case's buffers and operation),
//! `check` (data and result checks), `bench` and `gpu` (the timed loops on
//! the host and on a CUDA stream), `sweep` (sizes, dtypes and reduce ops),
//! `table` (the printed table and the CSV).

mod bench;
mod case;
mod check;
mod coll;
mod gpu;
mod options;
mod sweep;
mod table;

use bench::Bench;
use gpu::Gpu;
use options::{env_int, gpu_usable, Args};
use std::process::exit;
use torchcomm::Device;
use torchcomm::{Comm, CommOptions};

/// A failure that ends the benchmark: what failed and why on stderr, exit 1.
fn die(what: &str, e: torchcomm::Error) -> ! {
    eprintln!("tc-perf: {what}: {}", e.message);
    exit(1)
}

fn main() {
    let args = options::parse_args();
    let (device, gpu) = open_device(&args);
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
        args.csv.as_deref().map(table::open_csv)
    } else {
        None
    };
    if rank == 0 {
        table::print_header(&args, &label, n, device, gpu.is_some());
    }
    let mut bench = Bench {
        comm: comm.clone(),
        args,
        n,
        seed: 0,
        gpu,
    };
    let totals = sweep::run(&mut bench, rank, &label, csv.as_mut());
    if rank == 0 {
        table::print_summary(&totals);
    }
    drop(bench);
    comm.finalize().unwrap_or_else(|e| die("finalize", e));
    comm.release();
    if totals.wrong > 0 {
        exit(1);
    }
}

/// On nccl: this process's device (local rank modulo the visible devices,
/// as the backend picks it), its stream and events. On gloo: the CPU.
fn open_device(args: &Args) -> (Device, Option<Gpu>) {
    if args.backend != "nccl" {
        return (Device::Cpu, None);
    }
    let count = gpu_usable().unwrap_or_else(|e| {
        eprintln!(
            "tc-perf: -B nccl: TC_ERR_UNAVAILABLE ({}): {}",
            e.kind.describe().trim_end_matches('\0'),
            e.message
        );
        exit(1)
    });
    let local = env_int(&torchcomm::LOCAL_RANK_VARS)
        .or_else(|| env_int(&torchcomm::RANK_VARS))
        .unwrap_or(0)
        .max(0);
    let ordinal = local % count;
    let gpu =
        Gpu::new(ordinal).unwrap_or_else(|e| die(&format!("setting up CUDA device {ordinal}"), e));
    (Device::Cuda(Some(ordinal as u32)), Some(gpu))
}
