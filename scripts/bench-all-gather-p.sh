#!/usr/bin/env bash
# Persistent all-gather (tc_all_gather_p_exec) against tc_all_gather_single
# on gloo: (1) time per call, interleaved medians, on 2 and 4 ranks of this
# host (examples/bench_all_gather_p.rs); (2) instructions per call on one
# rank, counted by callgrind (deterministic; the host-side work of a call,
# without the waiting between ranks that dominates times on a loaded host).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --lib --bins --examples >/dev/null
BENCH=target/release/examples/bench_all_gather_p
for n in 2 4; do target/release/tc-run -n "$n" -- "$BENCH" | sed 's/^\[0\] //'; echo; done
command -v valgrind >/dev/null || { echo "SKIPPED: callgrind counts: valgrind is not installed"; exit 0; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "instructions per call, 1 rank, callgrind (inclusive Ir / calls)"
printf '%10s %14s %14s %8s\n' "bytes/rank" "plain" "persistent" "ratio"
for bytes in 4 512; do
  TC_BENCH_BYTES=$bytes TC_BENCH_ROUNDS=2 TC_BENCH_ITERS=500 TORCHCOMM_RANK=0 TORCHCOMM_SIZE=1 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29000 + RANDOM % 1000)) \
    valgrind -q --tool=callgrind --callgrind-out-file="$out/cg.$bytes" "$BENCH" >/dev/null
  callgrind_annotate --inclusive=yes "$out/cg.$bytes" > "$out/ann.$bytes"
  per_call() { awk -v f="$1" '$0 ~ "=> .*:" f " \\(" {gsub(",", "", $1); c=$NF; gsub("[(,x)]", "", c); t+=$1; n+=c}
                 END {if (n) printf "%.0f", t / n; else print "-"}' "$out/ann.$bytes"; }
  p=$(per_call tc_all_gather_single) q=$(per_call tc_all_gather_p_exec)
  printf '%10s %14s %14s %7.3fx\n' "$bytes" "$p" "$q" "$(echo "$p / $q" | bc -l)"
done
