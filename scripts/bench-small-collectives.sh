#!/usr/bin/env bash
# Small collectives on one host against Open MPI's shared memory (issue 30):
# all_reduce, broadcast, reduce, all_gather, reduce_scatter and barrier from
# 4 B to 4 KiB on 2, 3 and 4 ranks, ours (tc-perf on the gloo backend's
# shared memory) and Open MPI (bench/mpi_collectives.c, `--mca btl
# self,vader`, `--oversubscribe` as bench-host runs it: mpirun refuses more
# processes than this machine's slots without it), rounds interleaved (ours
# then Open MPI, then the other way round), each library with its default
# waiting policy and the same placement: mpirun binds each rank to a core
# when there are no more ranks than cores and none otherwise, so ours runs
# under `tc-run --bind-to core` in the first case (the library itself
# binds nothing; placed by the scheduler, two ranks often share one CPU
# here, which costs two switches per call). Prints one table of medians
# [min, max] over the rounds.
#   scripts/bench-small-collectives.sh [--rounds R] [--ranks "2 3 4"] [-n ITERS] [-w WARMUP]
# all_reduce, broadcast and reduce in place (float32 SUM, root 0);
# all_gather and reduce_scatter out of place, the size being the whole
# n-rank buffer (tc-perf's and nccl-tests' convention); time per call is
# the mean over ranks. Needs mpicc and mpirun (make bench-deps).
set -euo pipefail
source "$(dirname "$0")/common.sh"
rounds=3 ranks="2 3 4" iters=1000 warmup=50
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds R] [--ranks \"2 3 4\"] [-n ITERS] [-w WARMUP]" >&2; exit 2 ;;
  esac
done
ensure_built
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
  echo "bench-small-collectives: SKIPPED: mpicc/mpirun not found (make bench-deps)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpicc -std=c11 -O3 -Wall -Wextra bench/mpi_collectives.c -o "$work/mpi_collectives"
mpi=(mpirun --oversubscribe --mca btl self,vader)
[ "$(id -u)" = 0 ] && mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi[@]}" --allow-run-as-root)
ops="all_reduce broadcast reduce all_gather reduce_scatter barrier"
sweep=(-b 4 -e 4K -f 4 -n "$iters" -w "$warmup")

# "ours N OP SIZE US" lines: tc-perf's out-of-place time where it has one
# for the operation (all_gather, reduce_scatter), else the in-place time.
ours() {
  local bind=()
  (($1 <= $(nproc))) && bind=(--bind-to core)
  LD_LIBRARY_PATH=$REL "$REL/tc-run" -n "$1" "${bind[@]}" -- "$REL/tc-perf" -B gloo -o "$2" "${sweep[@]}" 2>&1 |
    awk -v n="$1" -v op="$2" '$1 == "[0]" && $2 ~ /^[0-9]+$/ && NF >= 12 {
      t = ($7 == "N/A") ? $11 : $7; if (op == "barrier") $2 = 0; print "ours", n, op, $2, t }'
}
theirs() {
  "${mpi[@]}" -np "$1" "$work/mpi_collectives" -o "$2" "${sweep[@]}" 2>"$work/mpi.err" |
    awk -v n="$1" '{ print "openmpi", n, $1, $2, $3 }' || { cat "$work/mpi.err" >&2; return 1; }
}
for ((i = 0; i < rounds; i++)); do
  for n in $ranks; do
    for op in $ops; do
      if ((i % 2 == 0)); then ours "$n" "$op"; theirs "$n" "$op"; else theirs "$n" "$op"; ours "$n" "$op"; fi
    done
  done | tee -a "$work/results" >&2
done
python3 - "$work/results" "$rounds" "$ranks" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, n, op, size, us = line.split()
    rows.setdefault((op, int(size)), {}).setdefault((who, int(n)), []).append(float(us))
ranks = [int(r) for r in sys.argv[3].split()]
order = "all_reduce broadcast reduce all_gather reduce_scatter barrier".split()
fmt = lambda v: f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]" if v else "-"
print(f"One host, shared memory, float32; {sys.argv[2]} interleaved rounds; us per call, median [min, max] of the rounds;"
      " ratio = ours / Open MPI (medians)")
print()
head = "| operation | size (B) |" + "".join(f" ours, {n} ranks | Open MPI, {n} ranks | ratio |" for n in ranks)
print(head)
print("|---|---|" + "---|---|---|" * len(ranks))
for (op, size) in sorted(rows, key=lambda k: (order.index(k[0]), k[1])):
    cells = []
    for n in ranks:
        a, b = rows[(op, size)].get(("ours", n), []), rows[(op, size)].get(("openmpi", n), [])
        ratio = f"{statistics.median(a) / statistics.median(b):.2f}" if a and b else "-"
        cells.append(f" {fmt(a)} | {fmt(b)} | {ratio} |")
    print(f"| {op} | {size} |" + "".join(cells))
PY
