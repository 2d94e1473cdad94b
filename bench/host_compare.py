#!/usr/bin/env python3
"""Host comparison: torchcomm's gloo backend (tc-perf) against the same Gloo
all-reduce called directly (gloo_direct), interleaved round by round so that
machine drift hits both alike (round 1: ours then direct, round 2: direct
then ours, ...), in two phases: the size sweep (4 B..64 MiB by default) and
small messages (4 B..4 KiB, 1000 iterations, where the per-call overhead
shows). Per size, the figure is the median over rounds of each
run's mean time; the table gives our overhead as a ratio and in us, against
the issue's targets (<= 5 % at >= 64 KiB, <= 10 us at 4 B).

Writes under --out: host_allreduce_runs.csv (every run's rows, with the
round), host_allreduce_summary.csv (medians and overheads), and, when
matplotlib is importable, host_allreduce_latency.png and
host_allreduce_busbw.png.
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, quiet):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        sys.exit(f"bench: {' '.join(cmd)} failed with exit code {p.returncode}")
    if not quiet:
        sys.stdout.write(p.stdout)
    return time.time() - t0


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fmt_size(s):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s >= k and s % k == 0:
            return f"{s // k} {unit}"
    return f"{s} B"


def phase(a, name, b, e, f, n, w, tmp):
    """Runs `rounds` interleaved pairs of the sweep; returns ({who: {size: [us]}}, wrong, raw rows)."""
    tc_run = os.path.join(a.bin, "tc-run")
    sweep = ["-b", b, "-e", e, "-f", f, "-n", n, "-w", w]
    ours_cmd = [tc_run, "-n", str(a.nranks), "--", os.path.join(a.bin, "tc-perf"), *sweep,
                "-o", "all_reduce", "-d", "float32", "-r", "sum"]
    direct_cmd = [tc_run, "-n", str(a.nranks), "--", a.direct, *sweep]
    print(f"## phase '{name}'")
    print("# ours:   " + " ".join(ours_cmd))
    print("# direct: " + " ".join(direct_cmd) + " --store TMPDIR")
    print(f"# {a.rounds} rounds, interleaved (order alternates each round); full tables of round 1:\n", flush=True)
    times = {"ours": {}, "direct": {}}
    wrong = {"ours": 0, "direct": 0}
    raw = []
    for rnd in range(1, a.rounds + 1):
        order = ["ours", "direct"] if rnd % 2 == 1 else ["direct", "ours"]
        for who in order:
            path = os.path.join(tmp, f"{name}-{who}-{rnd}.csv")
            quiet = rnd > 1
            if who == "ours":
                secs = run(ours_cmd + ["--csv", path, "--label", "torchcomm-gloo"], quiet)
            else:
                store = tempfile.mkdtemp(dir=tmp, prefix="store-")
                secs = run(direct_cmd + ["--store", store, "--csv", path, "--label", "gloo-direct"], quiet)
            print(f"# {name} round {rnd}: {who} done in {secs:.1f} s", flush=True)
            for r in read_rows(path):
                raw.append({"phase": name, "round": rnd, **r})
                times[who].setdefault(int(r["size"]), []).append(float(r["time_us"]))
                wrong[who] += max(0, int(r["wrong"]))
    return times, wrong, raw, n, w


def summarize(a, name, times, wrong, n, w):
    sizes = sorted(set(times["ours"]) & set(times["direct"]))
    factor = 2 * (a.nranks - 1) / a.nranks
    print()
    print(f"# phase '{name}': all_reduce float32 sum, {a.nranks} processes, gloo TCP loopback; "
          f"median over {a.rounds} rounds of each run's mean time per call (-n {n} -w {w})")
    print(f"{'size':>9} {'ours us':>10} {'direct us':>10} {'ratio':>7} {'over us':>9} "
          f"{'ours busbw':>10} {'dir busbw':>10} {'ours min-max':>17} {'direct min-max':>17} {'min ratio':>9}  target")
    summary = []
    for s in sizes:
        o, d = statistics.median(times["ours"][s]), statistics.median(times["direct"][s])
        ratio, over = o / d, o - d
        bo = s / (o * 1e-6) / 1e9 * factor
        bd = s / (d * 1e-6) / 1e9 * factor
        if s >= 64 << 10:
            target = "<= 1.05x: " + ("met" if ratio <= 1.05 else "MISSED")
        elif s == 4:
            target = "<= +10 us: " + ("met" if over <= 10 else "MISSED")
        else:
            target = ""
        so = f"{min(times['ours'][s]):.0f}-{max(times['ours'][s]):.0f}"
        sd = f"{min(times['direct'][s]):.0f}-{max(times['direct'][s]):.0f}"
        print(f"{fmt_size(s):>9} {o:>10.1f} {d:>10.1f} {ratio:>7.3f} {over:>9.1f} {bo:>10.3f} {bd:>10.3f} "
              f"{so:>17} {sd:>17} {min(times['ours'][s]) / min(times['direct'][s]):>9.3f}  {target}")
        summary.append({"phase": name, "size": s, "ours_us": f"{o:.3f}", "direct_us": f"{d:.3f}",
                        "ratio": f"{ratio:.4f}", "overhead_us": f"{over:.3f}", "ours_busbw_gbs": f"{bo:.6f}",
                        "direct_busbw_gbs": f"{bd:.6f}", "ours_min_us": min(times["ours"][s]),
                        "ours_max_us": max(times["ours"][s]), "direct_min_us": min(times["direct"][s]),
                        "direct_max_us": max(times["direct"][s]),
                        "min_ratio": f"{min(times['ours'][s]) / min(times['direct'][s]):.4f}", "rounds": a.rounds, "iters": n, "target": target})
    print(f"# wrong elements: ours {wrong['ours']}, direct {wrong['direct']}")
    return sizes, summary


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        wr.writeheader()
        wr.writerows(rows)


def plot(a, sizes, times):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not available (python3 -m pip install matplotlib): plots skipped")
        return
    factor = 2 * (a.nranks - 1) / a.nranks
    series = [("torchcomm gloo backend (tc-perf)", "ours"), ("Gloo called directly", "direct")]
    for kind, ylabel, fname in (("time", "time per all_reduce (us)", "host_allreduce_latency.png"),
                                ("busbw", "bus bandwidth (GB/s)", "host_allreduce_busbw.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, who in series:
            ys = []
            for s in sizes:
                t = statistics.median(times[who][s])
                ys.append(t if kind == "time" else s / (t * 1e-6) / 1e9 * factor)
            ax.plot(sizes, ys, marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"all_reduce float32 sum, {a.nranks} processes, TCP loopback (median of {a.rounds})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(a.out, fname)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        print(f"# wrote {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release", help="directory of tc-run and tc-perf")
    ap.add_argument("--direct", default="build/bench/gloo_direct")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("-b", default="4")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="2")
    ap.add_argument("-n", default="40")
    ap.add_argument("-w", default="5")
    ap.add_argument("--small-n", default="1000", help="iterations of the small-message phase (0: skip it)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    results = []
    with tempfile.TemporaryDirectory(prefix="tc-bench-") as tmp:
        results.append(("sweep", *phase(a, "sweep", a.b, a.e, a.f, a.n, a.w, tmp)))
        if a.small_n != "0":
            results.append(("small", *phase(a, "small", "4", "4K", "4", a.small_n, "50", tmp)))
    raw, summary = [], []
    for name, times, wrong, rows, n, w in results:
        raw += rows
        sizes, summ = summarize(a, name, times, wrong, n, w)
        summary += summ
        if name == "sweep":
            plot_args = (sizes, times)
    write_csv(os.path.join(a.out, "host_allreduce_runs.csv"), raw)
    write_csv(os.path.join(a.out, "host_allreduce_summary.csv"), summary)
    print(f"# wrote {a.out}/host_allreduce_runs.csv and {a.out}/host_allreduce_summary.csv")
    plot(a, *plot_args)


if __name__ == "__main__":
    main()
