//! One client's get latency while 0, 1,024 or 8,192 other connections sit
//! open and idle, against store servers each in its own process: this
//! build's, optionally another build's (`--base`), and torch's libuv
//! TCPStore server (`--torch`). The same client (ours) drives them all, in
//! interleaved rounds.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use torchcomm::store::Request;
use torchcomm::store::{Store, TcpStore, TcpStoreOptions};

const TIMEOUT: Duration = Duration::from_secs(300);
/// Gets timed per measurement, after [`WARMUP`] untimed ones.
const SAMPLES: usize = 2000;
const WARMUP: usize = 200;
/// The number torch's clients open with (tcpstore-protocol.md).
const TORCH_VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

const TORCH_SERVER: &str = "\
import resource, sys
import torch.distributed as dist
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
store = dist.TCPStore('127.0.0.1', 0, is_master=True, use_libuv=True, wait_for_workers=False)
print(store.port, flush=True)
sys.stdin.read()
";

pub struct Options {
    pub rounds: usize,
    pub idle: Vec<usize>,
    /// A tc-store-bench of another build, run with `--serve`.
    pub base: Option<String>,
    /// A python with torch.
    pub torch: Option<String>,
}

/// A server process; it exits when its stdin closes.
struct Server {
    name: String,
    child: Child,
    port: u16,
}

impl Server {
    fn spawn(name: &str, mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {name} server: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the {name} server printed {line:?}, not its port"));
        Server {
            name: name.into(),
            child,
            port,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// An idle client: connected and past the handshake (VALIDATE sent), then
/// silent. Raw, so opening thousands costs no round trip each.
fn idle_client(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting an idle client");
    s.write_all(&Request::Validate(TORCH_VALIDATION_MAGIC).to_bytes())
        .expect("sending VALIDATE");
    s
}

fn connect(port: u16) -> TcpStore {
    TcpStore::new(&TcpStoreOptions::client("127.0.0.1", port, TIMEOUT))
        .expect("connecting to the bench server")
}

/// (median, p99) of one get, in microseconds.
fn measure(c: &TcpStore) -> (f64, f64) {
    for _ in 0..WARMUP {
        c.get("bench/value").unwrap();
    }
    let mut us: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            let t = Instant::now();
            c.get("bench/value").unwrap();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(f64::total_cmp);
    (us[us.len() / 2], us[us.len() * 99 / 100])
}

/// One round on one server: each idle count in increasing order, the idle
/// connections opened on top of the previous ones.
fn round(server: &Server, idle_counts: &[usize]) -> Vec<(f64, f64)> {
    let c = connect(server.port);
    c.set("bench/value", &[7u8; 16]).unwrap();
    let mut idle: Vec<TcpStream> = Vec::new();
    let mut out = Vec::new();
    for &n in idle_counts {
        let opened = n.saturating_sub(idle.len()) as u64;
        while idle.len() < n {
            idle.push(idle_client(server.port));
        }
        idle.truncate(n);
        // Let the server accept and handshake them before timing.
        std::thread::sleep(Duration::from_millis(200 + opened / 10));
        out.push(measure(&c));
    }
    out
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn cell(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    format!("{:.1} [{lo:.1}-{hi:.1}]", median(v))
}

pub fn run(opts: &Options) {
    let me = std::env::current_exe().expect("the bench's own path");
    let mut ours = Command::new(me);
    ours.arg("--serve");
    let mut servers = vec![Server::spawn("ours", ours)];
    if let Some(base) = &opts.base {
        let mut cmd = Command::new(base);
        cmd.arg("--serve");
        servers.push(Server::spawn("ours, base build", cmd));
    }
    if let Some(py) = &opts.torch {
        let mut cmd = Command::new(py);
        cmd.args(["-c", TORCH_SERVER]);
        servers.push(Server::spawn("torch libuv", cmd));
    }
    // results[server][idle] = per-round (median, p99)
    let mut results = vec![vec![Vec::new(); opts.idle.len()]; servers.len()];
    for r in 0..opts.rounds {
        for k in 0..servers.len() {
            let s = (r + k) % servers.len();
            for (i, m) in round(&servers[s], &opts.idle).into_iter().enumerate() {
                results[s][i].push(m);
            }
        }
        eprintln!("latency: round {}/{} done", r + 1, opts.rounds);
    }
    print_table(opts, &servers, &results);
}

fn print_table(opts: &Options, servers: &[Server], results: &[Vec<Vec<(f64, f64)>>]) {
    println!(
        "get latency (us) of one client with idle connections open; each server in its own \
         process, our client for all; median of {} interleaved rounds [min-max] of the \
         per-round median and p99 of {SAMPLES} gets (get = WAIT + GET, two round trips)",
        opts.rounds
    );
    let torch = servers.iter().position(|s| s.name == "torch libuv");
    println!(
        "{:<18}{:>8}{:>26}{:>26}{:>11}{:>11}",
        "server", "idle", "median", "p99", "x 0 idle", "x torch"
    );
    for (s, server) in servers.iter().enumerate() {
        let base = median(&results[s][0].iter().map(|m| m.0).collect::<Vec<_>>());
        for (i, n) in opts.idle.iter().enumerate() {
            let med: Vec<f64> = results[s][i].iter().map(|m| m.0).collect();
            let p99: Vec<f64> = results[s][i].iter().map(|m| m.1).collect();
            let vs_torch = torch.map_or("-".to_string(), |t| {
                let tm = median(&results[t][i].iter().map(|m| m.0).collect::<Vec<_>>());
                format!("{:.2}", median(&med) / tm)
            });
            println!(
                "{:<18}{:>8}{:>26}{:>26}{:>11.2}{:>11}",
                server.name,
                n,
                cell(&med),
                cell(&p99),
                median(&med) / base,
                vs_torch
            );
        }
    }
}
