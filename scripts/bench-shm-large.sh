#!/usr/bin/env bash
# Large all_reduce through the gloo backend's shared-memory path, two builds
# side by side: tc-perf float32 sum, in place, at SIZES (default 16M 64M)
# on 2 and 4 ranks (WORLDS), rounds interleaved (A B, then B A, ...);
# prints median [min, max] of the per-call time per build and the ratio.
#
#   scripts/bench-shm-large.sh BEFORE_DIR AFTER_DIR [ROUNDS]
#
# Each DIR holds tc-run, tc-perf and libtorchcomm-gloo.so of one build.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_DIR AFTER_DIR [ROUNDS]" >&2; exit 2; }
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
rounds=${3:-8}
sizes=${SIZES:-16M 64M}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One tc-perf run: "BYTES US" per size (rank 0, in-place time).
one_run() {
  local dir=$1 world=$2 size=$3
  timeout 300 "$dir/tc-run" -n "$world" -- "$dir/tc-perf" -B gloo -b "$size" -e "$size" -n 6 -w 2 \
    -o all_reduce -d float32 -r sum -c 0 2>&1 | awk '/^\[0\] +[0-9]/ {print $2, $11}'
}

for world in ${WORLDS:-2 4}; do
  for size in $sizes; do
    for r in $(seq 1 "$rounds"); do
      if [ $((r % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
      for which in $order; do
        dir=$before; [ "$which" = after ] && dir=$after
        one_run "$dir" "$world" "$size" | awk -v w="$world" -v b="$which" '{print w, $1, b, $2}' >>"$tmp/times"
      done
    done
  done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/times" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    w, size, which, us = line.split()
    rows.setdefault((int(w), int(size)), {}).setdefault(which, []).append(float(us) / 1e3)
print("| ranks | bytes | before ms, median [min, max] | after ms, median [min, max] | before/after |")
print("|---|---|---|---|---|")
for (w, size), t in sorted(rows.items()):
    f = lambda v: f"{statistics.median(v):.1f} [{min(v):.1f}, {max(v):.1f}]"
    b, a = t.get("before", [0]), t.get("after", [0])
    print(f"| {w} | {size} | {f(b)} | {f(a)} | {statistics.median(b) / statistics.median(a):.2f}x |")
PY
