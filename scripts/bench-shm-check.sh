#!/usr/bin/env bash
# Cost of the shared-memory path's always-on collective check: tc-perf
# all_reduce (float32 sum, 2 ranks, gloo backend on one host) at 4 B and
# 64 KiB, for two builds side by side, rounds interleaved (A B, then B A,
# ...), median, min and max of the per-call time over the rounds.
#
#   scripts/bench-shm-check.sh BEFORE_DIR AFTER_DIR [ROUNDS] [ITERS]
#
# Each DIR holds tc-run, tc-perf and libtorchcomm-gloo.so of one build
# (for example a copy of target/release built from main, and this
# branch's). Prints one table; the raw per-round times go to stderr.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_DIR AFTER_DIR [ROUNDS] [ITERS]" >&2
  exit 2
fi
before=$1
after=$2
rounds=${3:-9}
iters=${4:-2000}
for d in "$before" "$after"; do
  for f in tc-run tc-perf libtorchcomm-gloo.so; do
    [ -e "$d/$f" ] || { echo "$d/$f is missing" >&2; exit 2; }
  done
done

# One tc-perf run; prints "SIZE MICROSECONDS" per size (rank 0's figures).
one_run() {
  "$1/tc-run" -n 2 -- "$1/tc-perf" -B gloo -b 4 -e 64K -f 16384 -n "$iters" -w 200 \
    -o all_reduce -d float32 -r sum -c 0 2>&1 |
    awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { t = ($7 == "N/A") ? $11 : $7; print $2, t }'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then order="before after"; else order="after before"; fi
  for which in $order; do
    dir=$before
    [ "$which" = after ] && dir=$after
    one_run "$dir" | while read -r size us; do
      echo "$which $size $us" | tee -a "$results" >&2
    done
  done
done

python3 - "$results" "$rounds" "$iters" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
rounds, iters = sys.argv[2], sys.argv[3]
times = {}
for which, size, us in rows:
    times.setdefault((int(size), which), []).append(float(us))
print(f"all_reduce float32 sum, 2 ranks, shared-memory path; {rounds} interleaved rounds of {iters} calls;")
print("per-call time in us: median [min, max]")
print()
print("| size | before (main) | after (check) | after / before (medians) |")
print("|---|---|---|---|")
for size in sorted({s for s, _ in times}):
    b, a = times.get((size, "before"), []), times.get((size, "after"), [])
    if not b or not a:
        continue
    fmt = lambda v: f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]"
    label = f"{size} B" if size < 1024 else f"{size // 1024} KiB"
    print(f"| {label} | {fmt(b)} | {fmt(a)} | {statistics.median(a) / statistics.median(b):.3f} |")
EOF
