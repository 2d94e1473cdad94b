//! tc-store-bench: throughput of the TCP store (set/get/add operations per
//! second with 1, 16 and 256 concurrent clients, each on its own connection)
//! and the time for 64, 256 and 1024 processes-worth of connections to
//! rendezvous (connect, ADD a counter, wait for the last arrival).
//!
//! `tc-store-bench [--duration SECONDS]` (default 1 s per measurement).
//! Throughput counts requests the server has processed: the clock stops
//! after every client's final round trip.
//!
//! `tc-store-bench --latency [--rounds N] [--idle 0,1024,8192] [--base BIN]
//! [--torch PYTHON]`: one client's get latency with idle connections open,
//! servers in their own processes (see latency.rs). `--serve`: only run a
//! server, print its port, stop at the end of stdin (what `--latency` and
//! `--base` start).

mod latency;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use torchcomm::store::{Store, TcpStore, TcpStoreOptions, TcpStoreServer};

const TIMEOUT: Duration = Duration::from_secs(120);

fn client(port: u16) -> TcpStore {
    TcpStore::new(&TcpStoreOptions::client("127.0.0.1", port, TIMEOUT))
        .expect("connecting to the bench server")
}

#[derive(Clone, Copy)]
enum Op {
    Set,
    Get,
    Add,
}

fn throughput(op: Op, clients: usize, duration: Duration) -> f64 {
    let server = TcpStoreServer::start(0).expect("starting the store server");
    let port = server.port();
    client(port).set("bench/value", &[7u8; 64]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (stop, total, ready) = (stop.clone(), total.clone(), ready.clone());
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let c = client(port);
                    let key = format!("bench/k{i}");
                    let value = [1u8; 64];
                    ready.wait();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        match op {
                            Op::Set => c.set(&key, &value).unwrap(),
                            Op::Get => drop(c.get("bench/value").unwrap()),
                            Op::Add => drop(c.add("bench/counter", 1).unwrap()),
                        }
                        n += 1;
                    }
                    // SET has no reply: a round trip makes sure the server
                    // has processed every request counted.
                    c.num_keys().unwrap();
                    total.fetch_add(n, Ordering::Relaxed);
                })
                .unwrap()
        })
        .collect();
    ready.wait();
    let start = Instant::now();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Time for `n` clients to connect, ADD the counter and be released by the
/// last arrival.
fn rendezvous(n: usize) -> Duration {
    let server = TcpStoreServer::start(0).expect("starting the store server");
    let port = server.port();
    let start = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|_| {
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    let c = client(port);
                    if c.add("rdv/arrived", 1).unwrap() == n as i64 {
                        c.set("rdv/go", b"1").unwrap();
                    }
                    c.wait(&["rdv/go"], None).unwrap();
                })
                .expect("spawning a client thread")
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed()
}

const USAGE: &str = "usage: tc-store-bench [--duration SECONDS] | --latency [--rounds N] \
                     [--idle N,N,...] [--base BIN] [--torch PYTHON] | --serve";

fn usage_error(msg: &str) -> ! {
    eprintln!("{msg}; {USAGE}");
    std::process::exit(2)
}

fn value<T: std::str::FromStr>(args: &mut impl Iterator<Item = String>, flag: &str) -> T {
    args.next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| usage_error(&format!("{flag} needs a value")))
}

/// Runs a server until stdin ends; its port is the first line on stdout.
fn serve() {
    use std::io::Read;
    let server = TcpStoreServer::start(0).expect("starting the store server");
    println!("{}", server.port());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

fn main() {
    let mut duration = Duration::from_secs(1);
    let mut latency = None;
    let mut opts = latency::Options {
        rounds: 5,
        idle: vec![0, 1024, 8192],
        base: None,
        torch: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--duration" => {
                let v: f64 = value(&mut args, "--duration");
                if v.is_nan() || v <= 0.0 {
                    usage_error("--duration needs a positive number of seconds");
                }
                duration = Duration::from_secs_f64(v);
            }
            "--serve" => return serve(),
            "--latency" => latency = Some(()),
            "--rounds" => opts.rounds = value::<usize>(&mut args, "--rounds").max(1),
            "--idle" => {
                let list: String = value(&mut args, "--idle");
                opts.idle = list
                    .split(',')
                    .map(|n| {
                        n.trim()
                            .parse()
                            .unwrap_or_else(|_| usage_error("bad --idle"))
                    })
                    .collect();
                opts.idle.sort_unstable();
            }
            "--base" => opts.base = Some(value(&mut args, "--base")),
            "--torch" => opts.torch = Some(value(&mut args, "--torch")),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => usage_error(&format!("unknown argument {other}")),
        }
    }
    torchcomm::store::raise_nofile_limit();
    if latency.is_some() {
        return latency::run(&opts);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("TCP store benchmark ({cpus} CPUs, {:.1} s per measurement; set = SET + a PING confirming it was stored; get = WAIT + GET as torch sends it)", duration.as_secs_f64());
    println!();
    println!(
        "{:<10}{:>14}{:>14}{:>14}",
        "op/s", "1 client", "16 clients", "256 clients"
    );
    for (name, op) in [("set", Op::Set), ("get", Op::Get), ("add", Op::Add)] {
        let mut row = format!("{name:<10}");
        for clients in [1, 16, 256] {
            row += &format!("{:>14.0}", throughput(op, clients, duration));
        }
        println!("{row}");
    }
    println!();
    println!("{:<26}{:>14}", "rendezvous", "time (ms)");
    for n in [64, 256, 1024] {
        let t = rendezvous(n);
        println!(
            "{:<26}{:>14.1}",
            format!("{n} connections"),
            t.as_secs_f64() * 1e3
        );
    }
}
