//! Real-process harness of the store tests: the test binary re-executes
//! itself (`TC_STORE_ROLE` selects the child's job); children report on
//! stdout with `PORT n` and `RESULT ...` lines.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The role of this process when it is a child of a store test.
pub fn role() -> Option<String> {
    std::env::var("TC_STORE_ROLE").ok()
}

/// A child process running `test` (this binary's test of that name) in
/// `role`, with `env`; killed when dropped.
pub struct Proc {
    pub child: Child,
    stdout: Option<BufReader<std::process::ChildStdout>>,
    pub lines: Vec<String>,
}

pub fn spawn(test: &str, role: &str, env: &[(&str, &str)]) -> Proc {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("TC_STORE_ROLE", role)
        .env("TORCHCOMM_ABORT_ON_ERROR", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().map(BufReader::new);
    Proc {
        child,
        stdout,
        lines: Vec::new(),
    }
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads stdout until a line starting with `prefix`; returns the rest.
    pub fn expect_line(&mut self, prefix: &str) -> String {
        let out = self.stdout.as_mut().expect("stdout already consumed");
        loop {
            let mut line = String::new();
            let n = out.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "child ended before printing {prefix:?}: {:?}",
                self.lines
            );
            let line = line.trim_end().to_string();
            self.lines.push(line.clone());
            if let Some(p) = line.find(prefix) {
                return line[p + prefix.len()..].trim().to_string();
            }
        }
    }

    /// The port a server child printed.
    pub fn port(&mut self) -> u16 {
        self.expect_line("PORT ").parse().unwrap()
    }

    /// Waits up to `limit` for the exit; kills the child after it. Returns
    /// (success, stdout, stderr).
    pub fn finish(mut self, limit: Duration) -> (bool, String, String) {
        drop(self.child.stdin.take());
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break Some(s);
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = self.lines.join("\n");
        if let Some(mut s) = self.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status.is_some_and(|s| s.success()), out, err)
    }

    /// Stops the child (closing its stdin, then SIGKILL) and returns its
    /// stderr.
    pub fn stop(mut self) -> String {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a child: blocks until the parent closes stdin (or dies).
pub fn wait_for_parent() {
    let mut buf = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut buf);
}

/// Resident memory of process `pid` in bytes.
pub fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

/// A port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Local addresses of the sockets listening on `port` (from /proc/net/tcp
/// and tcp6), as hex strings like `0100007F` (127.0.0.1) or 32 hex digits.
pub fn listening_addresses(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // f[1] = local "ADDR:PORT", f[3] = state (0A = LISTEN).
            if f.len() > 3 && f[3] == "0A" {
                if let Some((addr, p)) = f[1].split_once(':') {
                    if u16::from_str_radix(p, 16).ok() == Some(port) {
                        found.push(addr.to_string());
                    }
                }
            }
        }
    }
    found
}

/// A non-loopback IPv4 address of this machine (from `hostname -I`), if any.
pub fn non_loopback_ipv4() -> Option<std::net::Ipv4Addr> {
    let out = Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.parse::<std::net::Ipv4Addr>().ok())
        .find(|a| !a.is_loopback())
}
