#!/usr/bin/env bash
# Instructions per call of a blocking 4-byte f32 tc_all_reduce on a 2-rank
# comm on one host (the gloo shared-memory path), counted by callgrind on
# rank 0 (rank 1 runs natively), for builds side by side:
#   scripts/hook-cost.sh [LIBDIR ...]     (default: target/release)
# Each LIBDIR holds a libtorchcomm.so. For every LIBDIR: no hook; and where
# the library has hooks, also a no-op pre + post hook, and
# TORCHCOMM_NAN_CHECK=1. Instruction counts of the calling thread (the
# shared-memory path runs a blocking call inline on it).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "SKIPPED: valgrind is not installed" >&2; exit 0; }
[ $# -gt 0 ] || set -- target/release
N=${TC_HOOK_COST_CALLS:-2000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -std=c11 -O2 -g -Iinclude capi_tests/bench_hook_cost.c -o "$out/bench" -Ltarget/release -ltorchcomm -ldl
measure() { # LIBDIR LABEL ENV... -- ARGS...
  local lib=$1 label=$2; shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local store=$out/store.$label
  rm -f "$store"
  mkdir -p "$out/lib.$label"
  ln -sf "$lib/libtorchcomm.so" "$out/lib.$label/libtorchcomm.so.0"
  local lp="$out/lib.$label:$lib"
  (cd "$out" && env "${envs[@]}" LD_LIBRARY_PATH="$lp" ./bench "$store" 1 "$N" "$@" >/dev/null) &
  local peer=$!
  (cd "$out" && env "${envs[@]}" LD_LIBRARY_PATH="$lp" valgrind -q --tool=callgrind \
     --callgrind-out-file="$out/cg.$label" ./bench "$store" 0 "$N" "$@" >/dev/null)
  wait $peer
  # Inclusive cost of tc_all_reduce, and that less the backend's run (the
  # shared-memory reduction, whose waits for the peer spin a number of
  # times that depends on timing; the rest of the call does not). A
  # function has one entry per file its inlined code comes from; the
  # largest is the inclusive one.
  callgrind_annotate --inclusive=yes --tree=calling "$out/cg.$label" |
    awk -v n="$N" '/^ *[0-9,]+ .* \* .*:tc_all_reduce( \[|$)/ {gsub(",", "", $1); if ($1 > t) t=$1}
         /^ *[0-9,]+ .* \* .*GlooBackend as .*Backend>::run( \[|$)/ {gsub(",", "", $1); if ($1 > w) w=$1}
         END {if (t) printf "%.0f %.0f", t / n, (t - w) / n; else print "- -"}'
}
printf '%-28s %14s %22s\n' "build / case" "Ir per call" "less the backend run"
i=0
for dir in "$@"; do
  lib=$(cd "$dir" && pwd)
  name=$(basename "$(dirname "$dir/x")")
  row() { local r; r=($2); printf '%-28s %14s %22s\n' "$1" "${r[0]}" "${r[1]}"; }
  row "$name: no hook" "$(measure "$lib" "$i.none" X=1 --)"
  if nm -D --defined-only "$lib/libtorchcomm.so" | grep -q ' tc_comm_add_pre_hook$'; then
    row "$name: pre+post no-op hook" "$(measure "$lib" "$i.hooks" X=1 -- hooks)"
    row "$name: TORCHCOMM_NAN_CHECK=1" "$(measure "$lib" "$i.nan" TORCHCOMM_NAN_CHECK=1 --)"
  fi
  i=$((i + 1))
done
echo "($N calls; 2 ranks, one host; rank 0 under callgrind)"
