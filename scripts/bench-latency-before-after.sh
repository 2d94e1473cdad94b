#!/usr/bin/env bash
# Two builds side by side, rounds interleaved (A B, then B A, ...), for the
# small-message latencies of the gloo backend on one host:
#   - shared-memory point-to-point one-way latency (tc-osu ping-pong, half
#     the round trip), 2 ranks, 4 B to 4 KiB;
#   - Gloo point-to-point latency (hint gloo.shm_p2p=0), same run;
#   - 4-byte float32 all_reduce (tc-perf), 2 ranks and 4 ranks (4 ranks on
#     this 2-core machine: more ranks than cores).
#   scripts/bench-latency-before-after.sh BEFORE_DIR AFTER_DIR [ROUNDS]
# Each DIR holds tc-run, tc-osu, tc-perf and libtorchcomm-gloo.so of one
# build. Prints median [min, max] over the rounds of each round's figure,
# and after / before of the medians.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_DIR AFTER_DIR [ROUNDS]" >&2
  exit 2
fi
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
rounds=${3:-5}
for d in "$before" "$after"; do
  for f in tc-run tc-osu tc-perf libtorchcomm-gloo.so; do
    [ -e "$d/$f" ] || { echo "$d/$f is missing" >&2; exit 2; }
  done
done
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# "p2p SIZE US" and "gloo-p2p SIZE US" lines of one tc-osu run.
osu() {
  "$1/tc-run" -n 2 -- "$1/tc-osu" -b 4 -e 4K -r 1 2>&1 |
    awk '/^\[0\] # OSU-style latency/ {on = 1; next} /^\[0\] # OSU-style bandwidth/ {on = 0}
         on && $2 ~ /^[0-9]+$/ {print "p2p", $2, $3; print "gloo-p2p", $2, $5}'
}
# "all_reduce-N 4 US" of one tc-perf run with N ranks.
perf() {
  "$1/tc-run" -n "$2" -- "$1/tc-perf" -B gloo -b 4 -e 4 -f 2 -n "$3" -w 50 -o all_reduce \
    -d float32 -r sum -c 0 2>&1 |
    awk -v n="$2" '$1 == "[0]" && $2 == 4 {t = ($7 == "N/A") ? $11 : $7; print "all_reduce-" n "ranks", $2, t}'
}
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then order="before after"; else order="after before"; fi
  for which in $order; do
    dir=$before
    [ "$which" = after ] && dir=$after
    { osu "$dir"; perf "$dir" 2 2000; perf "$dir" 4 300; } | while read -r what size us; do
      echo "$which $what $size $us" | tee -a "$results" >&2
    done
  done
done
python3 - "$results" "$rounds" <<'PY'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    which, what, size, us = line.split()
    times.setdefault((what, int(size)), {}).setdefault(which, []).append(float(us))
print(f"gloo backend, one host; {sys.argv[2]} interleaved rounds; microseconds: median [min, max] of the rounds")
print()
print("| measurement | size | before | after | after / before (medians) |")
print("|---|---|---|---|---|")
names = {"p2p": "shared-memory p2p one-way (2 ranks)", "gloo-p2p": "Gloo p2p one-way, gloo.shm_p2p=0 (2 ranks)",
         "all_reduce-2ranks": "all_reduce float32 (2 ranks)", "all_reduce-4ranks": "all_reduce float32 (4 ranks, 2 cores)"}
for (what, size), t in sorted(times.items(), key=lambda kv: (list(names).index(kv[0][0]), kv[0][1])):
    b, a = t.get("before", []), t.get("after", [])
    if not b or not a:
        continue
    fmt = lambda v: f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]"
    print(f"| {names[what]} | {size} B | {fmt(b)} | {fmt(a)} | {statistics.median(a) / statistics.median(b):.3f} |")
PY
