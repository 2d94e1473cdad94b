#!/usr/bin/env bash
# Instructions per call of 4-byte all_reduce, broadcast and barrier on the
# calling thread, this library (gloo backend, shared memory) against Open
# MPI (btl self,vader), measured the same way by bench/call_cost.c: rank 0
# under callgrind, collecting only inside each call, arriving after its
# peers (which run natively), so that its wait ends at the first look;
# median over the calls (a peer descheduled for over 1 ms makes a call
# count some polls). Counts do not depend on the machine's load. 200
# calls: the steady state, where the flight recorder's ring (64 entries)
# is full and the host executor reuses the works it releases.
#   scripts/callgrind-small.sh [RANKS...]     (default: 2 3 4)
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
command -v valgrind >/dev/null || { echo "callgrind-small: valgrind not found" >&2; exit 2; }
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 3 4)
calls=200
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$CC" -O2 -Wall -Wextra -I"$ROOT/include" bench/call_cost.c -o "$work/call_cost_tc" -L"$REL" -ltorchcomm \
  -Wl,-rpath,"$REL"
mpi=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 -DUSE_MPI bench/call_cost.c -o "$work/call_cost_mpi" && mpi=1
fi
cg=(valgrind --tool=callgrind --collect-atstart=no)
# Median instructions per call over callgrind's per-call dumps $1.N.
per_call() {
  for f in "$1".*; do awk '/^(summary|totals):/ && $2 > 0 {print $2; exit}' "$f"; done | sort -n |
    awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}
printf '| ranks | operation | ours | Open MPI |\n|---|---|---|---|\n'
for n in "${ranks[@]}"; do
  for op in all_reduce broadcast barrier; do
    "$REL/tc-run" -n "$n" -- sh -c "if [ \"\$RANK\" = 0 ]; then exec ${cg[*]} --callgrind-out-file=$work/tc.out $work/call_cost_tc $op $calls; \
      else exec $work/call_cost_tc $op $calls; fi" >"$work/tc.log" 2>&1 ||
      { cat "$work/tc.log" >&2; exit 1; }
    ours=$(per_call "$work/tc.out")
    rm -f "$work"/tc.out*
    theirs=skipped
    if [ $mpi = 1 ]; then
      mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 1 "${cg[@]}" \
        --callgrind-out-file="$work/mpi.out" "$work/call_cost_mpi" $op $calls : \
        -np $((n - 1)) "$work/call_cost_mpi" $op $calls >"$work/mpi.log" 2>&1 ||
        { cat "$work/mpi.log" >&2; exit 1; }
      theirs=$(per_call "$work/mpi.out")
      rm -f "$work"/mpi.out*
    fi
    printf '| %s | %s (4 B) | %s | %s |\n' "$n" "$op" "$ours" "$theirs"
  done
done
