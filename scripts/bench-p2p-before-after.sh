#!/usr/bin/env bash
# Two builds side by side on shared-memory point-to-point (2 ranks, one
# host): tc-osu's latency and bandwidth columns ("ours") from MIN to MAX,
# runs interleaved (A B, then B A, ...), each run's value being tc-osu's
# own median of its rounds; prints, per size, the median over the runs of
# each build and after/before (latency: before/after, so that above 1 is
# better for both).
#
#   scripts/bench-p2p-before-after.sh BEFORE_DIR AFTER_DIR [RUNS] [MIN] [MAX]
#
# Each DIR holds tc-run, tc-osu and libtorchcomm-gloo.so of one build.
# Defaults: 5 runs, 1 B to 64 KiB. Raw per-run values go to stderr.
# TC_RUN_ARGS: more tc-run options for both builds (e.g. "--bind-to core").
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_DIR AFTER_DIR [RUNS] [MIN] [MAX]" >&2
  exit 2
fi
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
runs=${3:-5}
min=${4:-1}
max=${5:-64K}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
one_run() { # DIR WHICH
  TORCHCOMM_GLOO_LIBRARY=$1/libtorchcomm-gloo.so "$1/tc-run" -n 2 ${TC_RUN_ARGS:-} -- "$1/tc-osu" -b "$min" -e "$max" -r 3 2>&1 |
    sed 's/^\[0\] //' | awk -v which="$2" '
      /^# OSU-style latency/ {t = "lat"} /^# OSU-style bandwidth/ {t = "bw"}
      t != "" && $1 ~ /^[0-9]+$/ {print which, t, $1, $2}'
}
for ((i = 0; i < runs; i++)); do
  if ((i % 2 == 0)); then order="before after"; else order="after before"; fi
  for which in $order; do
    dir=$before
    [ "$which" = after ] && dir=$after
    one_run "$dir" "$which" | tee -a "$results" >&2
  done
done
python3 - "$results" <<'PY'
import sys, statistics
v = {}
for line in open(sys.argv[1]):
    which, t, size, x = line.split()
    v.setdefault((t, int(size)), {}).setdefault(which, []).append(float(x))
for t, title, unit in (("lat", "latency", "us"), ("bw", "bandwidth", "MB/s")):
    print(f"# {title} ({unit}), median of the runs [min-max]")
    print(f"{'size':>8} {'before':>26} {'after':>26} {'gain':>7}")
    for (tt, size), d in sorted(v.items()):
        if tt != t or "before" not in d or "after" not in d:
            continue
        b, a = statistics.median(d["before"]), statistics.median(d["after"])
        gain = b / a if t == "lat" else a / b
        fmt = lambda xs, m: f"{m:.3g} [{min(xs):.3g}-{max(xs):.3g}]"
        print(f"{size:>8} {fmt(d['before'], b):>26} {fmt(d['after'], a):>26} {gain:>6.2f}x")
PY
