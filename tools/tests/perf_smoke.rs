//! tc-perf under tc-run on 2 real processes: a short all_reduce sweep prints
//! one row per size, every result checked, nothing wrong. A smoke test of the
//! instrument, not a benchmark: no timing is asserted.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn tc_perf_all_reduce_sweep_under_tc_run() {
    if let Err(e) = torchcomm::backend_available("gloo") {
        println!("SKIPPED: the gloo module is unavailable: {}", e.message);
        return;
    }
    let perf = env!("CARGO_BIN_EXE_tc-perf");
    let launcher = env!("CARGO_BIN_EXE_tc-run");
    let start = Instant::now();
    let out = Command::new(launcher)
        .args([
            "-n",
            "2",
            "--",
            perf,
            "-b",
            "8",
            "-e",
            "1024",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
            "-o",
            "all_reduce",
            "-B",
            "gloo",
        ])
        .output()
        .expect("running tc-run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!(
        "status {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
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

/// Whether the nccl backend could run here (then the unavailable path is not
/// what this machine exercises).
fn gpu_stack_present() -> bool {
    torchcomm::cuda::available().is_ok()
        && torchcomm::backend_available("nccl").is_ok()
        && torchcomm::cuda::device_count()
            .map(|n| n > 0)
            .unwrap_or(false)
}

#[test]
fn tc_perf_nccl_without_gpu_fails_cleanly() {
    if gpu_stack_present() {
        println!("SKIPPED: a GPU stack is present; the unavailable path is not reachable here");
        return;
    }
    let perf = env!("CARGO_BIN_EXE_tc-perf");
    let launcher = env!("CARGO_BIN_EXE_tc-run");
    // Alone and under the launcher (world size 1), with and without -G.
    let runs: [Vec<&str>; 3] = [
        vec![perf, "-B", "nccl", "-b", "8", "-e", "8"],
        vec![perf, "-B", "nccl", "-G", "2", "-C", "1"],
        vec![
            launcher, "-n", "1", "--", perf, "-B", "nccl", "-b", "8", "-e", "64",
        ],
    ];
    for argv in runs {
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .output()
            .expect("running tc-perf");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!(
            "{argv:?}: status {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            out.status
        );
        assert_eq!(out.status.code(), Some(1), "{all}");
        assert!(
            stderr.contains("tc-perf: -B nccl: TC_ERR_UNAVAILABLE (library or device unavailable)"),
            "{all}"
        );
        assert!(stderr.contains("the nccl backend is unavailable"), "{all}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
            "{all}"
        );
        // No table was started.
        assert!(!stdout.contains("# Out of bounds"), "{all}");
    }
}

#[test]
fn tc_perf_graphs_need_the_nccl_backend() {
    let perf = env!("CARGO_BIN_EXE_tc-perf");
    let out = Command::new(perf)
        .args(["-B", "gloo", "-G", "3"])
        .output()
        .expect("running tc-perf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("-G (CUDA graph replays) needs -B nccl"),
        "{stderr}"
    );
}

/// The GPU baselines ship as sources compiled on the GPU machine: they must
/// at least compile (C) and parse (Python) here.
#[test]
fn gpu_bench_sources_compile() {
    // The repository root: this package is tools/ inside it.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let c = format!("{root}/bench/nccl_raw.c");
    match Command::new("cc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-Werror",
            "-fsyntax-only",
            &c,
        ])
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "cc -fsyntax-only {c}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => println!("SKIPPED: no C compiler ({e})"),
    }
    for py in ["torch_dist.py", "gpu_compare.py"] {
        let path = format!("{root}/bench/{py}");
        let code = "import ast,sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])";
        match Command::new("python3").args(["-c", code, &path]).output() {
            Ok(out) => assert!(
                out.status.success(),
                "{path}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => println!("SKIPPED: no python3 ({e})"),
        }
    }
}

/// `tc-perf --help` is the manual: on stdout, exit 0, and every flag the
/// parser accepts (read from the source's match arms) is explained.
#[test]
fn tc_perf_help_explains_every_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_tc-perf"))
        .arg("--help")
        .output()
        .expect("running tc-perf --help");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let source = include_str!("../src/bin/tc-perf/options.rs");
    let mut flags: Vec<&str> = Vec::new();
    for line in source.lines() {
        let arm = line.trim_start();
        if !arm.starts_with("\"-") || !arm.contains("=>") {
            continue;
        }
        let pattern = arm.split("=>").next().unwrap();
        flags.extend(pattern.split('|').map(|f| f.trim().trim_matches('"')));
    }
    assert!(flags.len() >= 30, "flags read from the source: {flags:?}");
    for flag in flags {
        let explained = stdout.lines().any(|l| {
            l.split(|c: char| c == ',' || c.is_whitespace())
                .any(|w| w == flag)
        });
        assert!(
            explained,
            "tc-perf --help does not explain {flag}:\n{stdout}"
        );
    }
    let short = Command::new(env!("CARGO_BIN_EXE_tc-perf"))
        .arg("-h")
        .output()
        .expect("running tc-perf -h");
    assert_eq!(short.status.code(), Some(0));
    assert_eq!(short.stdout, out.stdout);
}
