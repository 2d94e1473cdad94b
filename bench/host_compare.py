#!/usr/bin/env python3
"""Host comparison: torchcomm's gloo backend (tc-perf) against the same Gloo
all-reduce called directly (gloo_direct), interleaved round by round so that
machine drift hits both alike (round 1: ours then direct, round 2: direct
then ours, ...). Per size, the figure is the median over rounds of each
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release", help="directory of tc-run and tc-perf")
    ap.add_argument("--direct", default="build/bench/gloo_direct")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-b", default="4")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="2")
    ap.add_argument("-n", default="40")
    ap.add_argument("-w", default="5")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    tc_run = os.path.join(a.bin, "tc-run")
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f, "-n", a.n, "-w", a.w]
    ours_cmd = [tc_run, "-n", str(a.nranks), "--", os.path.join(a.bin, "tc-perf"), *sweep,
                "-o", "all_reduce", "-d", "float32", "-r", "sum"]
    direct_cmd = [tc_run, "-n", str(a.nranks), "--", a.direct, *sweep]
    print("# ours:   " + " ".join(ours_cmd))
    print("# direct: " + " ".join(direct_cmd) + " --store TMPDIR")
    print(f"# {a.rounds} rounds, interleaved (order alternates each round)\n", flush=True)

    runs = []  # (system, round, rows)
    with tempfile.TemporaryDirectory(prefix="tc-bench-") as tmp:
        for rnd in range(1, a.rounds + 1):
            order = ["ours", "direct"] if rnd % 2 == 1 else ["direct", "ours"]
            for who in order:
                path = os.path.join(tmp, f"{who}-{rnd}.csv")
                quiet = rnd > 1
                if who == "ours":
                    secs = run(ours_cmd + ["--csv", path, "--label", "torchcomm-gloo"], quiet)
                else:
                    store = tempfile.mkdtemp(dir=tmp, prefix="store-")
                    secs = run(direct_cmd + ["--store", store, "--csv", path, "--label", "gloo-direct"], quiet)
                print(f"# round {rnd}: {who} done in {secs:.1f} s", flush=True)
                runs.append((who, rnd, read_rows(path)))

    raw_path = os.path.join(a.out, "host_allreduce_runs.csv")
    with open(raw_path, "w", newline="") as f:
        w = None
        for who, rnd, rows in runs:
            for r in rows:
                r = {"round": rnd, **r}
                if w is None:
                    w = csv.DictWriter(f, fieldnames=list(r.keys()))
                    w.writeheader()
                w.writerow(r)

    times = {"ours": {}, "direct": {}}
    wrong = {"ours": 0, "direct": 0}
    for who, _, rows in runs:
        for r in rows:
            times[who].setdefault(int(r["size"]), []).append(float(r["time_us"]))
            wrong[who] += max(0, int(r["wrong"]))
    sizes = sorted(set(times["ours"]) & set(times["direct"]))
    factor = 2 * (a.nranks - 1) / a.nranks

    def fmt_size(s):
        for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if s >= k and s % k == 0:
                return f"{s // k} {unit}"
        return f"{s} B"

    print()
    print(f"# all_reduce float32 sum, {a.nranks} processes, gloo TCP loopback; medians over {a.rounds} rounds of "
          f"mean time per call (-n {a.n} -w {a.w})")
    hdr = (f"{'size':>9} {'ours us':>10} {'direct us':>10} {'ratio':>7} {'over us':>9} "
           f"{'ours busbw':>10} {'dir busbw':>10} {'ours spread':>17} {'direct spread':>17}  target")
    print(hdr)
    summary = []
    for s in sizes:
        o, d = statistics.median(times["ours"][s]), statistics.median(times["direct"][s])
        ratio, over = o / d, o - d
        bo = s / (o * 1e-6) / 1e9 * factor
        bd = s / (d * 1e-6) / 1e9 * factor
        if s >= 64 << 10:
            target = "<= 1.05x: " + ("met" if ratio <= 1.05 else "MISSED")
        elif s == 4:
            target = "<= 10 us: " + ("met" if over <= 10 else "MISSED")
        else:
            target = ""
        so = f"{min(times['ours'][s]):.0f}-{max(times['ours'][s]):.0f}"
        sd = f"{min(times['direct'][s]):.0f}-{max(times['direct'][s]):.0f}"
        print(f"{fmt_size(s):>9} {o:>10.1f} {d:>10.1f} {ratio:>7.3f} {over:>9.1f} {bo:>10.3f} {bd:>10.3f} "
              f"{so:>17} {sd:>17}  {target}")
        summary.append({"size": s, "ours_us": f"{o:.3f}", "direct_us": f"{d:.3f}", "ratio": f"{ratio:.4f}",
                        "overhead_us": f"{over:.3f}", "ours_busbw_gbs": f"{bo:.6f}", "direct_busbw_gbs": f"{bd:.6f}",
                        "ours_min_us": min(times["ours"][s]), "ours_max_us": max(times["ours"][s]),
                        "direct_min_us": min(times["direct"][s]), "direct_max_us": max(times["direct"][s]),
                        "rounds": a.rounds, "target": target})
    print(f"# wrong elements: ours {wrong['ours']}, direct {wrong['direct']}")
    sum_path = os.path.join(a.out, "host_allreduce_summary.csv")
    with open(sum_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0].keys()))
        w.writeheader()
        w.writerows(summary)
    print(f"# wrote {raw_path} and {sum_path}")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not available (python3 -m pip install matplotlib): plots skipped")
        return
    series = [("torchcomm gloo backend", "ours"), ("Gloo called directly", "direct")]
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


if __name__ == "__main__":
    main()
