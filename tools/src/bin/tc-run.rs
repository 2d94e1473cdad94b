//! tc-run: starts N processes of a program on this machine, torchrun-style.
//!
//! `tc-run -n N [--master-port P] [--grace-period SECS] [--bind-to core|none] -- PROGRAM ARGS...`
//!
//! `--bind-to core` pins rank r to the r-th CPU tc-run may use (round
//! robin), as `mpirun` does by default; the default, `none`, leaves the
//! ranks to the scheduler (the library itself never sets affinity).
//!
//! Each process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//! MASTER_ADDR, MASTER_PORT and TORCHELASTIC_USE_AGENT_STORE=True; tc-run
//! hosts the store at MASTER_ADDR:MASTER_PORT itself. Output lines are
//! prefixed with `[rank] `. When a rank fails, the others get SIGTERM, then
//! SIGKILL after the grace period, and tc-run exits non-zero with a summary.
//! SIGINT and SIGTERM are forwarded to every rank (tc-run then exits
//! 128 + signal). Exit status 0 only when every rank exited 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};
use torchcomm::store::TcpStoreServer;
use torchcomm::store::{token_from_env, ServerOptions};

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

const USAGE: &str = "usage: tc-run -n N [--master-port PORT] [--grace-period SECONDS] \
                     [--bind-to core|none] -- PROGRAM [ARGS...]";

struct Args {
    n: usize,
    master_port: u16,
    grace: Duration,
    /// Pin each rank to one CPU (`--bind-to core`).
    bind: bool,
    program: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut n, mut master_port, mut grace) = (None, 0u16, Duration::from_secs(5));
    let mut bind = false;
    let mut program = Vec::new();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "-n" | "--nproc" | "--nproc-per-node" | "--nproc_per_node" => {
                let v = value(&a)?;
                n = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("-n {v}: not a positive count"))?,
                );
            }
            "--master-port" | "--master_port" => {
                let v = value(&a)?;
                master_port = v
                    .parse()
                    .map_err(|_| format!("--master-port {v}: not a port number"))?;
            }
            "--grace-period" => {
                let v = value(&a)?;
                let s: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s >= 0.0)
                    .ok_or_else(|| format!("--grace-period {v}: not a number of seconds"))?;
                grace = Duration::from_secs_f64(s);
            }
            "--bind-to" => {
                bind = match value(&a)?.as_str() {
                    "core" => true,
                    "none" => false,
                    v => return Err(format!("--bind-to {v}: takes core or none")),
                };
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--" => {
                program.extend(it.by_ref());
                break;
            }
            other if !other.starts_with('-') => {
                program.push(other.to_string());
                program.extend(it.by_ref());
                break;
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    let n = n.ok_or("missing -n N")?;
    if program.is_empty() {
        return Err("missing the program to run".into());
    }
    Ok(Args {
        n,
        master_port,
        grace,
        bind,
        program,
    })
}

/// The CPUs this process may run on, in order (empty if unknown).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set for the call to fill.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .collect()
    }
}

/// Copies `src` to our stdout or stderr line by line, prefixed `[rank] `.
fn pump(
    rank: usize,
    src: impl Read + Send + 'static,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let mut out = format!("[{rank}] ").into_bytes();
                    out.extend_from_slice(&line);
                    if !out.ends_with(b"\n") {
                        out.push(b'\n');
                    }
                    // One write per line so lines of different ranks never mix.
                    let _ = if to_stderr {
                        std::io::stderr().lock().write_all(&out)
                    } else {
                        std::io::stdout().lock().write_all(&out)
                    };
                }
            }
        }
    })
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s} ({})", signal_name(s)),
        _ => "unknown status".into(),
    }
}

fn status_code(st: &ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Signals rank `pid`'s whole process group (the rank is its leader).
fn signal_group(pid: u32, sig: i32) {
    unsafe { libc::kill(-(pid as libc::pid_t), sig) };
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tc-run: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    // Every rank runs on this host: the store listens on loopback only.
    let server = match TcpStoreServer::start_with(&ServerOptions {
        bind: Some("127.0.0.1".into()),
        port: args.master_port,
        token: token_from_env(),
        reply_timeout: None,
    }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tc-run: {e}");
            std::process::exit(1);
        }
    };
    let port = server.port();
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let (children, pumps) = spawn_ranks(&args, port);
    let mut job = Job::new(children, args.grace);
    job.supervise();
    for p in pumps {
        let _ = p.join();
    }
    drop(server);
    job.exit_with_summary()
}

/// Starts every rank with the launcher's environment, its output pumped
/// through `[rank] ` prefixes; when one cannot start, kills those started and
/// exits 1.
fn spawn_ranks(args: &Args, port: u16) -> (Vec<Child>, Vec<std::thread::JoinHandle<()>>) {
    let mut children: Vec<Child> = Vec::with_capacity(args.n);
    let mut pumps = Vec::new();
    let cpus = if args.bind {
        allowed_cpus()
    } else {
        Vec::new()
    };
    for rank in 0..args.n {
        let mut cmd = Command::new(&args.program[0]);
        cmd.args(&args.program[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", args.n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", args.n.to_string())
            .env("GROUP_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group: signals reach the rank's own children too,
            // and a terminal's Ctrl-C reaches ranks only through us.
            .process_group(0);
        if let Some(&cpu) = cpus.get(rank % cpus.len().max(1)) {
            // SAFETY: between fork and exec only a system call runs, on
            // a set built before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    match libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    }
                });
            }
        }
        match cmd.spawn() {
            Ok(mut c) => {
                pumps.push(pump(rank, c.stdout.take().unwrap(), false));
                pumps.push(pump(rank, c.stderr.take().unwrap(), true));
                children.push(c);
            }
            Err(e) => {
                eprintln!(
                    "tc-run: cannot start rank {rank} ({}): {e}",
                    args.program[0]
                );
                for c in &children {
                    signal_group(c.id(), libc::SIGKILL);
                }
                for c in &mut children {
                    let _ = c.wait();
                }
                std::process::exit(1);
            }
        }
    }
    (children, pumps)
}

/// The running ranks and what happened to them.
struct Job {
    children: Vec<Child>,
    status: Vec<Option<ExitStatus>>,
    /// Ranks tc-run sent a signal to (their death by it is not a failure).
    signalled: Vec<bool>,
    first_failure: Option<usize>,
    /// The signal tc-run got and forwarded.
    interrupted: Option<i32>,
    /// When ranks still running get SIGKILL.
    kill_at: Option<Instant>,
    killed: bool,
    grace: Duration,
}

impl Job {
    fn new(children: Vec<Child>, grace: Duration) -> Job {
        let n = children.len();
        Job {
            children,
            status: vec![None; n],
            signalled: vec![false; n],
            first_failure: None,
            interrupted: None,
            kill_at: None,
            killed: false,
            grace,
        }
    }

    /// Polls until every rank has exited: forwards signals, stops the others
    /// after a first failure, kills what outlives the grace period.
    fn supervise(&mut self) {
        loop {
            let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
            if sig != 0 {
                self.forward(sig);
            }
            self.reap();
            if self.status.iter().all(|s| s.is_some()) {
                break;
            }
            self.kill_after_grace();
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `sig` to every rank still running.
    fn signal_running(&mut self, sig: i32) {
        for (r, c) in self.children.iter().enumerate() {
            if self.status[r].is_none() {
                signal_group(c.id(), sig);
                self.signalled[r] = true;
            }
        }
    }

    fn forward(&mut self, sig: i32) {
        eprintln!(
            "tc-run: got {}, forwarding it to every rank",
            signal_name(sig)
        );
        self.interrupted = Some(sig);
        self.signal_running(sig);
        self.kill_at.get_or_insert(Instant::now() + self.grace);
    }

    /// Records the ranks that exited; the first failure (unless
    /// interrupted) sends SIGTERM to the others.
    fn reap(&mut self) {
        for r in 0..self.children.len() {
            if self.status[r].is_some() {
                continue;
            }
            if let Ok(Some(st)) = self.children[r].try_wait() {
                self.status[r] = Some(st);
                if !st.success() && self.first_failure.is_none() && self.interrupted.is_none() {
                    self.first_failure = Some(r);
                    eprintln!(
                        "tc-run: rank {r} failed ({}); stopping the other ranks",
                        describe(&st)
                    );
                    self.signal_running(libc::SIGTERM);
                    self.kill_at = Some(Instant::now() + self.grace);
                }
            }
        }
    }

    fn kill_after_grace(&mut self) {
        let Some(t) = self.kill_at else { return };
        if self.killed || Instant::now() < t {
            return;
        }
        self.killed = true;
        for (r, c) in self.children.iter().enumerate() {
            if self.status[r].is_none() {
                eprintln!("tc-run: rank {r} still running after the grace period; killing it");
                signal_group(c.id(), libc::SIGKILL);
            }
        }
    }

    /// Exits 0 when every rank did (128 + signal when interrupted);
    /// otherwise prints what each failed rank did and exits with the first
    /// failure's status.
    fn exit_with_summary(self) -> ! {
        let interrupted = self.interrupted;
        let status: Vec<ExitStatus> = self.status.into_iter().map(|s| s.unwrap()).collect();
        if status.iter().all(|s| s.success()) {
            if let Some(sig) = interrupted {
                // Every rank shut down cleanly, but the job was interrupted.
                eprintln!("tc-run: interrupted by {}", signal_name(sig));
                std::process::exit(128 + sig);
            }
            std::process::exit(0);
        }
        eprintln!("tc-run: job failed:");
        for (r, st) in status.iter().enumerate() {
            if st.success() {
                continue;
            }
            let stopped = self.signalled[r]
                && matches!(st.signal(), Some(s) if s == libc::SIGTERM || s == libc::SIGKILL || Some(s) == interrupted);
            if stopped {
                eprintln!("tc-run:   rank {r}: stopped by tc-run ({})", describe(st));
            } else {
                eprintln!("tc-run:   rank {r}: failed with {}", describe(st));
            }
        }
        let code = match (interrupted, self.first_failure) {
            (Some(sig), _) => 128 + sig,
            (None, Some(r)) => status_code(&status[r]),
            (None, None) => 1,
        };
        std::process::exit(if code == 0 { 1 } else { code.min(255) });
    }
}
