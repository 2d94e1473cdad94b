//! tc-run: starts N processes of a program on this machine, torchrun-style.
//!
//! `tc-run -n N [--master-port P] [--grace-period SECS] -- PROGRAM ARGS...`
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
use torchcomm::store::server::{token_from_env, ServerOptions};
use torchcomm::store::TcpStoreServer;

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

const USAGE: &str =
    "usage: tc-run -n N [--master-port PORT] [--grace-period SECONDS] -- PROGRAM [ARGS...]";

struct Args {
    n: usize,
    master_port: u16,
    grace: Duration,
    program: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut n, mut master_port, mut grace) = (None, 0u16, Duration::from_secs(5));
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
        program,
    })
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

    let mut children: Vec<Child> = Vec::with_capacity(args.n);
    let mut pumps = Vec::new();
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

    let n = args.n;
    let mut status: Vec<Option<ExitStatus>> = vec![None; n];
    let mut signalled = vec![false; n];
    let mut first_failure: Option<usize> = None;
    let mut interrupted: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            eprintln!(
                "tc-run: got {}, forwarding it to every rank",
                signal_name(sig)
            );
            interrupted = Some(sig);
            for (r, c) in children.iter().enumerate() {
                if status[r].is_none() {
                    signal_group(c.id(), sig);
                    signalled[r] = true;
                }
            }
            kill_at.get_or_insert(Instant::now() + args.grace);
        }
        for r in 0..n {
            if status[r].is_some() {
                continue;
            }
            if let Ok(Some(st)) = children[r].try_wait() {
                status[r] = Some(st);
                if !st.success() && first_failure.is_none() && interrupted.is_none() {
                    first_failure = Some(r);
                    eprintln!(
                        "tc-run: rank {r} failed ({}); stopping the other ranks",
                        describe(&st)
                    );
                    for (o, c) in children.iter().enumerate() {
                        if status[o].is_none() {
                            signal_group(c.id(), libc::SIGTERM);
                            signalled[o] = true;
                        }
                    }
                    kill_at = Some(Instant::now() + args.grace);
                }
            }
        }
        if status.iter().all(|s| s.is_some()) {
            break;
        }
        if let Some(t) = kill_at {
            if !killed && Instant::now() >= t {
                killed = true;
                for (r, c) in children.iter().enumerate() {
                    if status[r].is_none() {
                        eprintln!(
                            "tc-run: rank {r} still running after the grace period; killing it"
                        );
                        signal_group(c.id(), libc::SIGKILL);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in pumps {
        let _ = p.join();
    }
    drop(server);

    let status: Vec<ExitStatus> = status.into_iter().map(|s| s.unwrap()).collect();
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
        let stopped = signalled[r]
            && matches!(st.signal(), Some(s) if s == libc::SIGTERM || s == libc::SIGKILL || Some(s) == interrupted);
        if stopped {
            eprintln!("tc-run:   rank {r}: stopped by tc-run ({})", describe(st));
        } else {
            eprintln!("tc-run:   rank {r}: failed with {}", describe(st));
        }
    }
    let code = match (interrupted, first_failure) {
        (Some(sig), _) => 128 + sig,
        (None, Some(r)) => status_code(&status[r]),
        (None, None) => 1,
    };
    std::process::exit(if code == 0 { 1 } else { code.min(255) });
}
