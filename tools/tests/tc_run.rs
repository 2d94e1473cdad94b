//! tc-run with real processes: environment, output prefixes, the hosted
//! store, failure propagation (exit code, signal, grace period), and
//! forwarding of SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TC_RUN: &str = env!("CARGO_BIN_EXE_tc-run");

fn run(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(TC_RUN).args(args).output().unwrap();
    (out, start.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn environment_and_prefixed_output() {
    let (out, _) = run(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "echo \"env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $TORCHELASTIC_USE_AGENT_STORE\"; echo err >&2; printf partial",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for r in 0..3 {
        assert!(
            stdout.contains(&format!("[{r}] env {r} 3 {r} 3 127.0.0.1 True\n")),
            "{stdout}"
        );
        assert!(stdout.contains(&format!("[{r}] partial\n")), "{stdout}");
        assert!(text(&out.stderr).contains(&format!("[{r}] err\n")));
    }
    assert!(stdout.lines().all(|l| l.starts_with('[')), "{stdout}");
}

#[test]
fn exit_rank_names_failed_ranks() {
    let (out, _) = run(&["-n", "4", "--", "sh", "-c", "exit $RANK"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    for r in 1..4 {
        assert!(err.contains(&format!("rank {r}")), "{err}");
    }
    // Rank 0 exits 0 unless tc-run stopped it first; it never "failed".
    assert!(!err.contains("rank 0: failed"), "{err}");
}

#[test]
fn a_rank_exiting_3_stops_the_others() {
    let (out, el) = run(&[
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ $RANK = 1 ]; then exit 3; fi; sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(err.contains("rank 1: failed with exit code 3"), "{err}");
    assert!(
        err.contains("rank 0: stopped by tc-run") && err.contains("rank 2: stopped by tc-run"),
        "{err}"
    );
    assert!(el < Duration::from_secs(10), "{el:?}");
}

#[test]
fn a_rank_killed_by_a_signal_is_named() {
    let (out, el) = run(&[
        "-n",
        "2",
        "--",
        "sh",
        "-c",
        "if [ $RANK = 1 ]; then kill -9 $$; fi; sleep 30",
    ]);
    assert_eq!(out.status.code(), Some(128 + 9));
    let err = text(&out.stderr);
    assert!(
        err.contains("rank 1: failed with signal 9 (SIGKILL)"),
        "{err}"
    );
    assert!(el < Duration::from_secs(10), "{el:?}");
}

#[test]
fn ranks_ignoring_sigterm_are_killed_after_the_grace_period() {
    // Rank 0 fails only once rank 1 ignores SIGTERM (it says so in a file).
    let flag = std::env::temp_dir().join(format!("tc-run-grace-{}", std::process::id()));
    let _ = std::fs::remove_file(&flag);
    let script = format!(
        "trap '' TERM; F={}; if [ $RANK = 0 ]; then while [ ! -e $F ]; do sleep 0.01; done; exit 1; fi; \
         touch $F; while :; do sleep 0.1; done",
        flag.display()
    );
    let (out, el) = run(&[
        "-n",
        "2",
        "--grace-period",
        "0.5",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let _ = std::fs::remove_file(&flag);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("rank 1: stopped by tc-run (signal 9 (SIGKILL))"),
        "{err}"
    );
    assert!(el < Duration::from_secs(8), "{el:?}");
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    let mut child = Command::new(TC_RUN)
        .args([
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.1; done",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ready = 0;
    while ready < 2 {
        let l = lines.next().unwrap().unwrap();
        ready += l.ends_with("ready") as i32;
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let st = child.wait().unwrap();
    assert_eq!(
        st.code(),
        Some(128 + libc::SIGTERM),
        "interrupted runs exit non-zero"
    );
    assert!(
        rest.iter().any(|l| l == "[0] got-term") && rest.iter().any(|l| l == "[1] got-term"),
        "{rest:?}"
    );
}

#[test]
fn ranks_reach_the_hosted_store() {
    // A raw-socket client in Python, written from the protocol reference:
    // VALIDATE, ADD "init/", WAIT on the other rank's key, GET it.
    let py = r#"
import os, socket, struct
r, n = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])))
def lp(b): return struct.pack('<Q', len(b)) + b
def recv(k):
    d = b''
    while len(d) < k:
        c = s.recv(k - len(d)); assert c; d += c
    return d
s.sendall(b'\x00' + struct.pack('<I', 0x3C85F7CE))
s.sendall(b'\x04' + lp(b'init/') + struct.pack('<q', 1)); recv(8)
s.sendall(b'\x01' + lp(b'/k%d' % r) + lp(b'hello from %d' % r))
o = (r + 1) % n
s.sendall(b'\x06' + struct.pack('<Q', 1) + lp(b'/k%d' % o)); assert recv(1) == b'\x00'
s.sendall(b'\x03' + lp(b'/k%d' % o)); (l,) = struct.unpack('<Q', recv(8))
print(recv(l).decode())
"#;
    if Command::new("python3")
        .arg("-c")
        .arg("1")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!("python3 not available; skipping");
        return;
    }
    let (out, _) = run(&["-n", "3", "--", "python3", "-c", py]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    for r in 0..3 {
        assert!(
            stdout.contains(&format!("[{r}] hello from {}", (r + 1) % 3)),
            "{stdout}"
        );
    }
}

#[test]
fn usage_errors() {
    let (out, _) = run(&["--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("-n"));
    let (out, _) = run(&["-n", "2"]);
    assert_eq!(out.status.code(), Some(2));
}

/// The CPUs each rank may run on, from /proc (`Cpus_allowed_list`).
fn allowed_cpus_per_rank(bind: &str, n: usize) -> Vec<String> {
    let (out, _) = run(&[
        "-n",
        &n.to_string(),
        "--bind-to",
        bind,
        "--",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    (0..n)
        .map(|r| {
            let prefix = format!("[{r}] Cpus_allowed_list:");
            let line = stdout.lines().find(|l| l.starts_with(&prefix));
            line.unwrap_or_else(|| panic!("rank {r}: {stdout}"))[prefix.len()..]
                .trim()
                .to_string()
        })
        .collect()
}

#[test]
fn bind_to_core_pins_ranks_round_robin_and_none_leaves_them() {
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    let free = allowed_cpus_per_rank("none", 2);
    assert_eq!(free, vec![own.clone(), own], "unbound ranks keep every CPU");
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let bound = allowed_cpus_per_rank("core", cpus + 1);
    for (r, list) in bound.iter().enumerate() {
        assert!(
            list.parse::<usize>().is_ok(),
            "rank {r} bound to one CPU, got '{list}'"
        );
    }
    if cpus > 1 {
        assert_ne!(bound[0], bound[1], "ranks 0 and 1 share a CPU");
    }
    assert_eq!(
        bound[0], bound[cpus],
        "round robin: rank {cpus} takes rank 0's CPU"
    );
}
