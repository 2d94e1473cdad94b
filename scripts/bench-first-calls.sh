#!/usr/bin/env bash
# Two builds side by side, rounds interleaved (A B, then B A, ...), for
# short runs and first calls of the gloo backend's shared memory on one host:
#   - the short sweep of issue 30, `tc-perf -b 4 -e 4K -f 4 -n 40 -w 5`
#     (float32 all_reduce), on 2, 3 and 4 ranks (3 and 4: more ranks than
#     this machine's CPUs, when it has 2);
#   - bench/first_calls (4 B all_reduce, 400 calls from a fresh comm), 2
#     ranks, placed by the scheduler (free) and pinned after tc_comm_new to
#     one CPU (same: what the scheduler does when it puts both on one CPU)
#     or to two (apart), and apart with the ranks aligned before the first
#     call (apart-aligned: the first call's own cost, without waiting for a
#     peer that left tc_comm_new later): the first call (the slower rank's),
#     the median of the first 100, the median and the mean of the warm calls
#     (the last 200); and, from the apart-aligned run, a warm call after a
#     busy-waited pause of 1, 10 and 100 ms beside a library-free 16 KiB
#     cache-line chase after the same pause and back to back (pause-N);
#   - Open MPI (btl self,vader) measured by the same program built with
#     mpicc, where mpicc and mpirun exist, in every round (the table's
#     "Open MPI" column; it has no sweep rows).
#   scripts/bench-first-calls.sh BEFORE_DIR AFTER_DIR [ROUNDS]
# Each DIR holds tc-run, tc-perf, libtorchcomm.so and libtorchcomm-gloo.so
# of one build. Prints median [min, max] over the rounds of each figure.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_DIR AFTER_DIR [ROUNDS]" >&2
  exit 2
fi
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
rounds=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
for d in "$before" "$after"; do
  for f in tc-run tc-perf libtorchcomm.so libtorchcomm-gloo.so; do
    [ -e "$d/$f" ] || { echo "$d/$f is missing" >&2; exit 2; }
  done
  [ -e "$d/libtorchcomm.so.0" ] || ln -sf libtorchcomm.so "$d/libtorchcomm.so.0"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -Wall -Wextra -I"$root/include" "$root/bench/first_calls.c" -o "$work/first_calls" \
  -L"$after" -ltorchcomm
results=$work/results
mpi=()
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 &&
  mpicc -O2 -DUSE_MPI "$root/bench/first_calls.c" -o "$work/first_calls_mpi" 2>/dev/null; then
  mpi=(mpirun --oversubscribe -np 2 --mca btl self,vader)
  [ "$(id -u)" = 0 ] && mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi[@]}" --allow-run-as-root)
else
  echo "bench-first-calls: mpicc/mpirun not found; Open MPI is skipped" >&2
fi

# "sweep-N SIZE US" lines of one short tc-perf run on N ranks.
sweep() {
  LD_LIBRARY_PATH=$1 "$1/tc-run" -n "$2" -- "$1/tc-perf" -B gloo -b 4 -e 4K -f 4 -n 40 -w 5 2>&1 |
    awk -v n="$2" '$1 == "[0]" && $2 ~ /^[0-9]+$/ && NF >= 12 {t = ($7 == "N/A") ? $11 : $7; print "sweep-" n "ranks", $2, t}'
}
# "first-PLACE WHAT US" lines of one first_calls run (DIR, or "mpi" for
# Open MPI), and with apart-aligned its "pause-N WHAT US" lines.
first() {
  local opts=() run
  case $2 in
    free) ;;
    apart-aligned) opts=(-p apart -a 1) ;;
    *) opts=(-p "$2") ;;
  esac
  if [ "$1" = mpi ]; then
    run=("${mpi[@]}" "$work/first_calls_mpi")
  else
    run=(env LD_LIBRARY_PATH="$1" "$1/tc-run" -n 2 -- "$work/first_calls")
  fi
  "${run[@]}" -n 400 "${opts[@]}" 2>&1 | sed 's/^\[0\] //' |
    awk -v p="$2" '$1 ~ /^[0-9]+$/ && NF >= 14 {
        if ($3 > f) f = $3; m100 += $4 / 2; w += $5 / 2; mw += $9 / 2 }
      $1 == "#" && $2 == "pause" { print "pause-" $3 "ms", "warm_call", $9; print "pause-" $3 "ms", "chase", $21;
        print "pause-" $3 "ms", "chase_back_to_back", $26 }
      END { print "first-" p, "first", f; print "first-" p, "median_first100", m100;
            print "first-" p, "median_warm", w; print "first-" p, "mean_warm", mw }'
}
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then order="before after"; else order="after before"; fi
  for which in $order; do
    dir=$before
    [ "$which" = after ] && dir=$after
    { sweep "$dir" 2; sweep "$dir" 3; sweep "$dir" 4; first "$dir" free; first "$dir" same; first "$dir" apart
      first "$dir" apart-aligned; } |
      while read -r what size us; do
        echo "$which $what $size $us" | tee -a "$results" >&2
      done
  done
  if ((${#mpi[@]})); then
    for place in free same apart apart-aligned; do first mpi "$place"; done |
      while read -r what size us; do
        echo "openmpi $what $size $us" | tee -a "$results" >&2
      done
  fi
done
python3 - "$results" "$rounds" <<'PY'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    which, what, size, us = line.split()
    times.setdefault((what, size), {}).setdefault(which, []).append(float(us))
print(f"gloo shared memory, one host; {sys.argv[2]} interleaved rounds; microseconds: median [min, max] of the rounds")
print()
print("| measurement | size / figure | before | after | after / before (medians) | Open MPI | after / Open MPI |")
print("|---|---|---|---|---|---|---|")
key = lambda kv: (kv[0][0], int(kv[0][1]) if kv[0][1].isdigit() else kv[0][1])
for (what, size), t in sorted(times.items(), key=key):
    b, a, m = t.get("before", []), t.get("after", []), t.get("openmpi", [])
    if not b or not a:
        continue
    fmt = lambda v: f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]" if v else "-"
    ratio = lambda x, y: f"{statistics.median(x) / statistics.median(y):.3f}" if x and y and statistics.median(y) else "-"
    label = f"{size} B" if size.isdigit() else size
    print(f"| {what} | {label} | {fmt(b)} | {fmt(a)} | {ratio(a, b)} | {fmt(m)} | {ratio(a, m)} |")
PY
