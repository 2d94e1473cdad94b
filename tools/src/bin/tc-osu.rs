//! tc-osu: OSU-style point-to-point latency and bandwidth between ranks 0
//! and 1, through our gloo backend's shared-memory point-to-point and,
//! side by side in the same run, the same calls with it off (hint
//! `gloo.shm_p2p=0`: Gloo over TCP loopback), interleaved round by round.
//!
//! `tc-run -n 2 -- tc-osu [-b MIN] [-e MAX] [-r ROUNDS] [--extra NAME=LAT,BW]...`
//! `tc-run -n 2 -- tc-osu --cost N`
//! `tc-run -n 2 -- tc-osu --cost-async N`
//! `tc-osu --host 1 [-b MIN] [-e MAX] [-r ROUNDS] [--extra ...]` (2 ranks
//! from any launcher, shared memory off: TORCHCOMM_GLOO_SHM=0)
//!
//! `--host 1` compares the transports between hosts instead: ours = UCX
//! (hint `gloo.host_transport=ucx`), ours-off = Gloo over TCP (hint
//! `gloo.host_transport=gloo`), both without shared-memory point-to-point
//! (scripts/bench-multihost.sh).
//!
//! Latency: ping-pong (rank 0 sends, rank 1 receives and sends back), half
//! the round trip, as osu_latency. Bandwidth: rank 0 starts a window of
//! non-blocking sends of one buffer, rank 1 the matching receives, then a
//! 4-byte reply ends the window, as osu_bw (MB/s = 10^6 bytes/s). Each cell
//! is the median of the rounds (their min and max for ours in brackets).
//! `--extra` adds columns read from files of `size value` lines (other
//! systems, e.g. torch.distributed, measured before this run). The first
//! exchange of every size and system is checked byte by byte.
//!
//! `--cost N` measures no time: rank 0 makes N blocking 4-byte sends
//! through shared memory ([`cost_sends`]), then both ranks meet at a
//! barrier, then rank 1 makes the N receives ([`cost_receives`]), so that
//! neither side ever waits for the other. Run under callgrind
//! (scripts/p2p-cost.sh), the inclusive instructions of those two
//! functions divided by N are the work of one send and one receive.
//! `--cost-async N` does the same with non-blocking sends and receives in
//! windows of [`WINDOW`] (started, then waited for), as the bandwidth test
//! makes them ([`cost_isends`], [`cost_ireceives`]); what the progress
//! thread does for them is counted on that thread (scripts/p2p-cost.sh).

use std::process::exit;
use std::sync::Arc;
use std::time::Instant;
use torchcomm::Work;
use torchcomm::{Comm, CommOptions, Op, OpOptions, Ptr};
use torchcomm::{DType, Device};

struct Args {
    min: usize,
    max: usize,
    rounds: usize,
    extra: Vec<(String, String, String)>,
    /// `--cost N`: the instruction-count mode.
    cost: Option<usize>,
    /// `--cost-async N`: the same with non-blocking calls.
    cost_async: Option<usize>,
    /// `--host 1`: UCX against Gloo between hosts.
    host: bool,
}

fn size_arg(s: &str) -> Option<usize> {
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

fn usage() -> ! {
    eprintln!("usage: tc-run -n 2 -- tc-osu [-b MIN] [-e MAX] [-r ROUNDS] [--extra NAME=LATFILE,BWFILE]...");
    eprintln!("       tc-run -n 2 -- tc-osu --cost N");
    eprintln!("       tc-run -n 2 -- tc-osu --cost-async N");
    eprintln!(
        "       tc-osu --host 1 [-b MIN] [-e MAX] [-r ROUNDS] [--extra NAME=LATFILE,BWFILE]..."
    );
    exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        min: 1,
        max: 16 << 20,
        rounds: 3,
        extra: Vec::new(),
        cost: None,
        cost_async: None,
        host: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "-b" => a.min = size_arg(&value).unwrap_or_else(|| usage()),
            "-e" => a.max = size_arg(&value).unwrap_or_else(|| usage()),
            "-r" => a.rounds = value.parse().unwrap_or_else(|_| usage()),
            "--cost" => a.cost = Some(value.parse().unwrap_or_else(|_| usage())),
            "--cost-async" => a.cost_async = Some(value.parse().unwrap_or_else(|_| usage())),
            "--host" => a.host = value == "1",
            "--extra" => {
                let (name, files) = value.split_once('=').unwrap_or_else(|| usage());
                let (lat, bw) = files.split_once(',').unwrap_or_else(|| usage());
                a.extra.push((name.into(), lat.into(), bw.into()));
            }
            _ => usage(),
        }
    }
    a
}

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("tc-osu: {what}: {e}");
    exit(1)
}

fn comm(name: &str, shm_p2p: bool) -> Arc<Comm> {
    comm_with(name, &[("gloo.shm_p2p", if shm_p2p { "1" } else { "0" })])
}

fn comm_with(name: &str, hints: &[(&str, &str)]) -> Arc<Comm> {
    let opts = CommOptions {
        name: Some(name.into()),
        hints: hints
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    Comm::new("gloo", Device::Cpu, opts).unwrap_or_else(|e| die("creating the communicator", e))
}

fn op(is_send: bool, buf: &mut [u8], len: usize, peer: i32) -> Op {
    let buf = Ptr(buf.as_mut_ptr() as *mut std::ffi::c_void);
    match is_send {
        true => Op::send(buf, len, DType::U8, peer, 0),
        false => Op::recv(buf, len, DType::U8, peer, 0),
    }
}

fn run(c: &Comm, o: Op) {
    c.submit(o, &OpOptions::default())
        .unwrap_or_else(|e| die("a transfer", e));
}

fn start(c: &Comm, o: Op) -> Arc<dyn Work> {
    let opts = OpOptions {
        async_op: true,
        ..Default::default()
    };
    c.submit(o, &opts).unwrap_or_else(|e| die("a transfer", e))
}

/// Ping-pong iterations: fewer for large messages and for Gloo.
fn pingpongs(len: usize, shm: bool) -> usize {
    let n = ((32 << 20) / len.max(4096)).clamp(20, 2000);
    if shm {
        n
    } else {
        (n / 50).max(10)
    }
}

/// The first exchange of a size carries a pattern that rank 1 checks.
fn checked_exchange(c: &Comm, buf: &mut [u8], len: usize) {
    let pattern = |i: usize| (i * 7 + len) as u8;
    if c.rank() == 0 {
        buf[..len]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = pattern(i));
        run(c, op(true, buf, len, 1));
    } else {
        buf[..len].fill(0);
        run(c, op(false, buf, len, 0));
        if let Some(i) = (0..len).find(|i| buf[*i] != pattern(*i)) {
            die(
                "checking the data",
                format!("byte {i} of a {len}-byte message is wrong"),
            );
        }
    }
}

/// Half the round trip, microseconds (meaningful on rank 0).
fn latency(c: &Comm, buf: &mut [u8], len: usize, shm: bool) -> f64 {
    let n = pingpongs(len, shm);
    let warm = (n / 10).max(2);
    let mut t0 = Instant::now();
    for i in 0..warm + n {
        if i == warm {
            t0 = Instant::now();
        }
        if c.rank() == 0 {
            run(c, op(true, buf, len, 1));
            run(c, op(false, buf, len, 1));
        } else {
            run(c, op(false, buf, len, 0));
            run(c, op(true, buf, len, 0));
        }
    }
    t0.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64
}

/// MB/s over windows of non-blocking sends (meaningful on rank 0), after
/// a tenth as many unmeasured (at most 10), as osu_bw (100 windows of
/// small messages, after 10): fewer made one late wake-up of a rank a
/// visible share of a small size's time; two windows through Gloo
/// (milliseconds per small message).
fn bandwidth(c: &Comm, buf: &mut [u8], len: usize, shm: bool) -> f64 {
    let window = ((64 << 20) / len.max(1)).clamp(2, 64);
    let windows = match shm {
        true => ((256 << 20) / (window * len.max(1))).clamp(2, 100),
        false => 2,
    };
    let warm = (windows / 10).clamp(1, 10);
    let mut ack = [0u8; 4];
    let mut t0 = Instant::now();
    for w in 0..windows + warm {
        if w == warm {
            t0 = Instant::now();
        }
        let me = c.rank();
        let works: Vec<Arc<dyn Work>> = (0..window)
            .map(|_| start(c, op(me == 0, buf, len, 1 - me)))
            .collect();
        for work in works {
            work.wait_blocking()
                .unwrap_or_else(|e| die("a transfer", e));
        }
        run(c, op(me != 0, &mut ack, 4, 1 - me));
    }
    (window * windows * len) as f64 / t0.elapsed().as_secs_f64() / 1e6
}

/// `n` blocking 4-byte sends to rank 1 (the ring has room for them all).
#[inline(never)]
fn cost_sends(c: &Comm, buf: &mut [u8], n: usize) {
    for _ in 0..n {
        run(c, op(true, buf, 4, 1));
    }
}

/// `n` blocking 4-byte receives from rank 0, every message already there.
#[inline(never)]
fn cost_receives(c: &Comm, buf: &mut [u8], n: usize) {
    for _ in 0..n {
        run(c, op(false, buf, 4, 0));
    }
}

/// The window of non-blocking calls of `--cost-async`, as the bandwidth
/// test's for small messages.
const WINDOW: usize = 64;

/// `n` non-blocking 4-byte sends to rank 1 in windows of [`WINDOW`].
#[inline(never)]
fn cost_isends(c: &Comm, buf: &mut [u8], n: usize) {
    non_blocking_windows(c, buf, n, true);
}

/// `n` non-blocking 4-byte receives from rank 0 in windows of
/// [`WINDOW`], every message already there.
#[inline(never)]
fn cost_ireceives(c: &Comm, buf: &mut [u8], n: usize) {
    non_blocking_windows(c, buf, n, false);
}

fn non_blocking_windows(c: &Comm, buf: &mut [u8], n: usize, is_send: bool) {
    let peer = 1 - c.rank();
    let mut works: Vec<Arc<dyn Work>> = Vec::with_capacity(WINDOW);
    for i in 0..n {
        works.push(start(c, op(is_send, buf, 4, peer)));
        if works.len() == WINDOW || i + 1 == n {
            for w in works.drain(..) {
                w.wait_blocking().unwrap_or_else(|e| die("a transfer", e));
            }
        }
    }
}

/// The `--cost` and `--cost-async` modes (see the module's documentation).
fn cost(c: &Comm, n: usize, non_blocking: bool) {
    let mut buf = [0u8; 4];
    // One exchange first, so that no first-call work is counted.
    checked_exchange(c, &mut buf, 4);
    if c.rank() == 0 {
        match non_blocking {
            false => cost_sends(c, &mut buf, n),
            true => cost_isends(c, &mut buf, n),
        }
    }
    run(c, Op::Barrier);
    if c.rank() == 1 {
        match non_blocking {
            false => cost_receives(c, &mut buf, n),
            true => cost_ireceives(c, &mut buf, n),
        }
    }
    run(c, Op::Barrier);
}

/// Median and range of `v` (sorted in place).
fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `size value` lines of an extra column.
fn column(path: &str) -> Vec<(usize, f64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// The memcpy rate of this machine on one core, MB/s, for `len` bytes
/// (the median of `reps` copies).
fn memcpy_rate(len: usize, reps: usize) -> f64 {
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    let mut rates: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&mut dst);
            len as f64 / t0.elapsed().as_secs_f64() / 1e6
        })
        .collect();
    stats(&mut rates).0
}

/// `v` with 3 significant digits at least (Gloo's small-message rates are
/// far below 1 MB/s).
fn num(v: f64) -> String {
    match v.abs() {
        x if x >= 100.0 || x == 0.0 => format!("{v:.1}"),
        x if x >= 1.0 => format!("{v:.2}"),
        _ => format!("{v:.3e}"),
    }
}

struct Row {
    len: usize,
    ours: (f64, f64, f64),
    gloo: f64,
}

fn print_table(
    title: &str,
    unit: &str,
    rows: &[Row],
    extra: &[(String, Vec<(usize, f64)>)],
    lower_is_better: bool,
) {
    println!("# {title}");
    let mut head = format!(
        "# {:<10} {:>22} {:>14} {:>9}",
        "Size",
        format!("{unit} ours[min-max]"),
        "ours-off",
        "ratio"
    );
    for (name, _) in extra {
        head.push_str(&format!(" {name:>14} {:>9}", "ratio"));
    }
    println!("{head}");
    let ratio = |other: f64, ours: f64| {
        if lower_is_better {
            other / ours
        } else {
            ours / other
        }
    };
    for r in rows {
        let (m, lo, hi) = r.ours;
        let mut line = format!(
            "{:<12} {:>22} {:>14} {:>8.2}x",
            r.len,
            format!("{} [{}-{}]", num(m), num(lo), num(hi)),
            num(r.gloo),
            ratio(r.gloo, m)
        );
        for (_, col) in extra {
            match col.iter().find(|(s, _)| *s == r.len) {
                Some((_, v)) => line.push_str(&format!(" {:>14} {:>8.2}x", num(*v), ratio(*v, m))),
                None => line.push_str(&format!(" {:>14} {:>9}", "-", "-")),
            }
        }
        println!("{line}");
    }
    println!(
        "# ratio: how many times ours is faster than that column ({}).",
        if lower_is_better {
            "its latency / ours"
        } else {
            "ours / its bandwidth"
        }
    );
}

fn main() {
    let args = parse_args();
    let shm = match args.host {
        true => comm_with(
            "tc-osu-ucx",
            &[("gloo.host_transport", "ucx"), ("gloo.shm_p2p", "0")],
        ),
        false => comm("tc-osu-shm", true),
    };
    if shm.size() != 2 {
        die(
            "world size",
            format!("{} ranks; run 2 (tc-run -n 2)", shm.size()),
        );
    }
    if let Some(n) = args.cost {
        cost(&shm, n, false);
        return;
    }
    if let Some(n) = args.cost_async {
        cost(&shm, n, true);
        return;
    }
    let gloo = match args.host {
        true => comm_with(
            "tc-osu-gloo",
            &[("gloo.host_transport", "gloo"), ("gloo.shm_p2p", "0")],
        ),
        false => comm("tc-osu-gloo", false),
    };
    let (lat_rows, bw_rows, memcpy) = measure(&args, &shm, &gloo);
    run(&shm, Op::Barrier);
    if shm.rank() != 0 {
        return;
    }
    report(&args, &lat_rows, &bw_rows, memcpy);
}

/// Latency and bandwidth rows for every size (powers of two from `min` to
/// `max`), both comms in interleaved rounds, and memcpy rates measured
/// between the rounds on rank 0.
fn measure(args: &Args, shm: &Comm, gloo: &Comm) -> (Vec<Row>, Vec<Row>, Vec<f64>) {
    let me = shm.rank();
    let mut sizes = Vec::new();
    let mut s = args.min.max(1);
    while s <= args.max {
        sizes.push(s);
        s *= 2;
    }
    let mut buf = vec![0u8; args.max.max(4)];
    let (mut lat_rows, mut bw_rows) = (Vec::new(), Vec::new());
    // memcpy measured between the rounds too: on a shared machine its rate
    // varies as much as the transfers'.
    let mut memcpy = Vec::new();
    for &len in &sizes {
        let (mut lat, mut lat_off, mut bw, mut bw_off) = (vec![], vec![], vec![], vec![]);
        checked_exchange(shm, &mut buf, len);
        checked_exchange(gloo, &mut buf, len);
        for _ in 0..args.rounds {
            lat.push(latency(shm, &mut buf, len, true));
            lat_off.push(latency(gloo, &mut buf, len, false));
            bw.push(bandwidth(shm, &mut buf, len, true));
            bw_off.push(bandwidth(gloo, &mut buf, len, false));
            if me == 0 {
                memcpy.push(memcpy_rate(16 << 20, 3));
            }
        }
        lat_rows.push(Row {
            len,
            ours: stats(&mut lat),
            gloo: stats(&mut lat_off).0,
        });
        bw_rows.push(Row {
            len,
            ours: stats(&mut bw),
            gloo: stats(&mut bw_off).0,
        });
    }
    (lat_rows, bw_rows, memcpy)
}

/// Prints both tables, the memcpy rate and the two targets (rank 0).
fn report(args: &Args, lat_rows: &[Row], bw_rows: &[Row], mut memcpy: Vec<f64>) {
    let lat_extra: Vec<_> = args
        .extra
        .iter()
        .map(|(n, l, _)| (n.clone(), column(l)))
        .collect();
    let bw_extra: Vec<_> = args
        .extra
        .iter()
        .map(|(n, _, b)| (n.clone(), column(b)))
        .collect();
    match args.host {
        true => println!("# tc-osu: 2 ranks, {} interleaved rounds; ours = UCX between hosts (hint gloo.host_transport=ucx), ours-off = Gloo over TCP (gloo.host_transport=gloo); no shared memory", args.rounds),
        false => println!("# tc-osu: 2 ranks, {} interleaved rounds; ours = shared-memory point-to-point, ours-off = hint gloo.shm_p2p=0 (Gloo over TCP loopback)", args.rounds),
    }
    print_table(
        "OSU-style latency (ping-pong, half round trip)",
        "Latency (us)",
        lat_rows,
        &lat_extra,
        true,
    );
    print_table(
        "OSU-style bandwidth (window of non-blocking sends)",
        "Bandwidth (MB/s)",
        bw_rows,
        &bw_extra,
        false,
    );
    let (memcpy, lo, hi) = stats(&mut memcpy);
    println!(
        "# memcpy 16 MiB on one core: {memcpy:.0} MB/s (median of the rounds' [{lo:.0}-{hi:.0}], measured between them)"
    );
    if args.host {
        return;
    }
    if let Some(r) = lat_rows.iter().find(|r| r.len == 4) {
        let met = if r.ours.0 <= 1.0 { "met" } else { "missed" };
        println!(
            "# target 4 B one-way latency <= 1 us: {:.2} us: {met}",
            r.ours.0
        );
    }
    if let Some(r) = bw_rows.iter().find(|r| r.len == 16 << 20) {
        let pct = r.ours.0 / memcpy * 100.0;
        let met = if pct >= 80.0 { "met" } else { "missed" };
        println!(
            "# target 16 MiB bandwidth >= 80% of memcpy: {:.0} MB/s = {pct:.0}%: {met}",
            r.ours.0
        );
    }
}
