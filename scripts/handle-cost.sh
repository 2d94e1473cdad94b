#!/usr/bin/env bash
# Instructions per call of cheap C API calls, counted by callgrind, for one
# or more builds of libtorchcomm side by side (e.g. before and after a change
# to the handle checks):
#   scripts/handle-cost.sh [LIBDIR ...]      (default: target/release)
# Each LIBDIR holds a libtorchcomm.so (and libtorchcomm-gloo.so). Prints one
# row per function: Ir per call in each build, and the difference and ratio
# of the last build to the first. Instruction counts are deterministic up to
# a few instructions, so one run of each build suffices.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "SKIPPED: valgrind is not installed" >&2; exit 0; }
[ $# -gt 0 ] || set -- target/release
N=${TC_HANDLE_COST_CALLS:-10000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -O2 -g -Iinclude capi_tests/bench_handle_cost.c -o "$out/bench" -Ltarget/release -ltorchcomm
funcs="tc_comm_get_rank tc_work_wait tc_work_status tc_all_reduce tc_barrier tc_work_free"
i=0
for dir in "$@"; do
  lib=$(cd "$dir" && pwd)
  mkdir -p "$out/lib$i"
  ln -sf "$lib/libtorchcomm.so" "$out/lib$i/libtorchcomm.so.0"
  (cd "$out" && LD_LIBRARY_PATH="$out/lib$i:$lib" valgrind -q --tool=callgrind \
     --callgrind-out-file="$out/cg.$i" ./bench "$N" >/dev/null)
  callgrind_annotate --inclusive=yes "$out/cg.$i" > "$out/ann.$i"
  i=$((i + 1))
done
printf '%-18s' "Ir per call"
for dir in "$@"; do printf '%16s' "$(basename "$(dirname "$dir/x")")"; done
[ $# -gt 1 ] && printf '%10s%8s' "delta" "ratio"
echo
for f in $funcs; do
  printf '%-18s' "$f"
  vals=()
  for ((j = 0; j < i; j++)); do
    # "=> file:func (COUNTx)" lines give the inclusive cost and call count.
    v=$(awk -v f="$f" '$0 ~ "=> .*:" f " \\(" {gsub(",", "", $1); c=$NF; gsub("[(,x)]", "", c); t+=$1; n+=c}
          END {if (n) printf "%.0f", t / n; else print "-"}' "$out/ann.$j")
    vals+=("$v")
    printf '%16s' "$v"
  done
  if [ $i -gt 1 ] && [ "${vals[0]}" != - ] && [ "${vals[$((i - 1))]}" != - ]; then
    awk -v a="${vals[0]}" -v b="${vals[$((i - 1))]}" 'BEGIN {printf "%+10d%8.2f", b - a, b / a}'
  fi
  echo
done
echo "(calls: $N of each query, $((N / 10)) of each operation; one-rank gloo comm; instructions of the calling thread)"
