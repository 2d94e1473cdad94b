#!/usr/bin/env bash
# Usage: scripts/bench-window-ucx.sh [ROUNDS]
# One-sided windows over UCX against the Gloo windows, malloc buffers, 2
# ranks over TCP loopback (shared memory off, UCX_TLS=tcp,self, UCX as the
# host transport), interleaved round by round in one run
# (TORCHCOMM_UCX_WINDOWS=1, then 0); tables on stdout and in
# bench/results/window_bench_ucx.txt.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
rounds=${1:-3}
mkdir -p "$BUILD/bench" bench/results
"$CC" -std=c11 -O2 -Wall -Wextra -Werror -Iinclude bench/window_bench.c -o "$BUILD/bench/window_bench" \
  -L"$REL" -ltorchcomm -Wl,-rpath,"$REL"
export TORCHCOMM_GLOO_SHM=0 TORCHCOMM_HOST_TRANSPORT=ucx UCX_TLS=tcp,self
rc=0
: >bench/results/window_bench_ucx.txt
for round in $(seq "$rounds"); do
  for u in 1 0; do
    echo "== round $round TORCHCOMM_UCX_WINDOWS=$u" | tee -a bench/results/window_bench_ucx.txt
    TORCHCOMM_UCX_WINDOWS=$u "$REL/tc-run" -n 2 -- "$BUILD/bench/window_bench" -b 8 -e 2M -f 64 -n 50 -w 5 -m 0 \
      >"$BUILD/bench/window_bench.out" || rc=1
    sed 's/^\[0\] //' "$BUILD/bench/window_bench.out" | tee -a bench/results/window_bench_ucx.txt
  done
done
exit $rc
