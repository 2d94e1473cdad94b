#!/usr/bin/env bash
# Usage: scripts/bench-store.sh [ROUNDS]
# The TCP store benchmark: throughput and rendezvous (tc-store-bench), then
# one client's get latency with 0, 1,024 and 8,192 idle connections open
# (tc-store-bench --latency), each server in its own process, our client for
# all, interleaved rounds (default 5).
#   TC_STORE_BENCH_BASE=<git ref>: also a build of that ref (its library with
#     this bench) as "ours, base build", throughput and latency side by side.
#   torch (scripts/torch-venv.sh; TORCHCOMM_TORCH_VENV): its libuv TCPStore
#     server in the latency table, at 0 idle connections and at
#     TC_STORE_BENCH_TORCH_IDLE (default "0": torch 2.15's libuv server
#     accepted about 12 connections a second on this machine, so 1,024 idle
#     ones take minutes to open); SKIPPED line when torch cannot be had.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
rounds=${1:-5}
bench=$REL/tc-store-bench
base_args=()
if [ -n "${TC_STORE_BENCH_BASE:-}" ]; then
  src=$BUILD/store-bench-base/src
  tgt=$BUILD/store-bench-base/target
  rm -rf "$src" && mkdir -p "$src" "$tgt/release"
  git archive "$TC_STORE_BENCH_BASE" | tar -x -C "$src"
  # The tools live in tools/src/bin since the cargo workspace, in src/bin before.
  bins=$src/tools/src/bin
  [ -d "$bins" ] || bins=$src/src/bin
  rm -rf "$bins/tc-store-bench.rs" "$bins/tc-store-bench"
  cp -r tools/src/bin/tc-store-bench "$bins/"
  # Reuse the compiled dependencies (hard links; only our crate rebuilds).
  for d in deps build .fingerprint; do
    [ -e "$tgt/release/$d" ] || cp -al "$REL/$d" "$tgt/release/" 2>/dev/null || true
  done
  (cd "$src" && "$CARGO" build --release --offline --bin tc-store-bench --target-dir "$tgt")
  base_bin=$tgt/release/tc-store-bench
  base_args=(--base "$base_bin")
fi

echo "== throughput and rendezvous (interleaved: ours, then base when given; $rounds rounds) =="
for r in $(seq 1 "$rounds"); do
  echo "-- round $r: ours"; "$bench" --duration 0.5
  if [ -n "${base_bin:-}" ]; then echo "-- round $r: base $TC_STORE_BENCH_BASE"; "$base_bin" --duration 0.5; fi
done

echo
echo "== latency with idle connections: ours${base_bin:+ and base $TC_STORE_BENCH_BASE} =="
"$bench" --latency --rounds "$rounds" --idle 0,1024,8192 "${base_args[@]}"

echo
if py=$(scripts/torch-venv.sh); then
  echo "== latency beside torch's libuv server (idle ${TC_STORE_BENCH_TORCH_IDLE:-0}) =="
  "$bench" --latency --rounds "$rounds" --idle "${TC_STORE_BENCH_TORCH_IDLE:-0}" \
    "${base_args[@]}" --torch "$py"
else
  echo "SKIPPED: torch's libuv server column (torch unavailable; see above)"
fi
