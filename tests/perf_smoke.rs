//! tc-perf under tc-run on 2 real processes: a short all_reduce sweep prints
//! one row per size, every result checked, nothing wrong. A smoke test of the
//! instrument, not a benchmark: no timing is asserted.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn tc_perf_all_reduce_sweep_under_tc_run() {
    if let Err(e) = torchcomm::backends::gloo::shim::module() {
        println!("SKIPPED: the gloo module is unavailable: {}", e.message);
        return;
    }
    let perf = env!("CARGO_BIN_EXE_tc-perf");
    let launcher = env!("CARGO_BIN_EXE_tc-run");
    let start = Instant::now();
    let out = Command::new(launcher)
        .args(["-n", "2", "--", perf, "-b", "8", "-e", "1024", "-f", "4", "-n", "2", "-w", "1", "-o", "all_reduce"])
        .output()
        .expect("running tc-run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("status {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    assert!(out.status.success(), "{all}");
    assert!(start.elapsed() < Duration::from_secs(60), "{all}");

    // Data rows: size count type redop root, then out-of-place (N/A: all_reduce
    // is in place only) and in-place time algbw busbw #wrong.
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[0] "))
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let sizes: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, ["8", "32", "128", "512", "1024"], "{all}");
    for r in &rows {
        assert_eq!(r.len(), 13, "row {r:?}\n{all}");
        let count: usize = r[1].parse().unwrap();
        assert_eq!(count * 4, r[0].parse::<usize>().unwrap(), "{all}");
        assert_eq!(&r[2..5], ["float32", "sum", "-1"], "{all}");
        assert_eq!(&r[5..9], ["N/A"; 4], "{all}");
        let time: f64 = r[9].parse().unwrap();
        assert!(time > 0.0, "{all}");
        assert_eq!(r[12], "0", "wrong elements in {r:?}\n{all}");
    }
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{all}");
    assert!(stdout.contains("# Avg bus bandwidth"), "{all}");
    // Only rank 0 prints.
    assert!(!stdout.lines().any(|l| l.starts_with("[1]")), "{all}");
}
