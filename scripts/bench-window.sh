#!/usr/bin/env bash
# Usage: scripts/bench-window.sh
# One-sided windows through the C API: a ring of put + signal + wait on 2
# ranks (bench/window_bench.c), with the buffers from malloc (puts travel as
# messages) and from tc_mem_alloc (shared memory: puts are copies); tables on
# stdout and in bench/results/window_bench.txt.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
mkdir -p "$BUILD/bench" bench/results
"$CC" -std=c11 -O2 -Wall -Wextra -Werror -Iinclude bench/window_bench.c -o "$BUILD/bench/window_bench" \
  -L"$REL" -ltorchcomm -Wl,-rpath,"$REL"
rc=0
: >bench/results/window_bench.txt
for m in 0 1; do
  "$REL/tc-run" -n 2 -- "$BUILD/bench/window_bench" -b 8 -e 16M -f 8 -n 50 -w 5 -m $m \
    >"$BUILD/bench/window_bench.out" || rc=1
  sed 's/^\[0\] //' "$BUILD/bench/window_bench.out" | tee -a bench/results/window_bench.txt
done
exit $rc
