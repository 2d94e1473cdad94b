#!/usr/bin/env bash
# Usage: scripts/bench-torchcomms-call.sh [ROUNDS] [ITERS]
# The Python layer's cost per call: a 4-byte float32 all_reduce on 2 ranks
# through torchcomm.torchcomms (bench/torchcomms_call.py) against the same
# call through tc-perf, interleaved ROUNDS times (default 5) in one run,
# ITERS calls each (default 20000). Needs a quiet machine.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
py="$(bash "$(dirname "$0")/torch-venv.sh")"
rounds=${1:-5}
iters=${2:-20000}
export TORCHCOMM_LIBRARY="$LIB" PYTHONPATH="$ROOT/python"
for r in $(seq "$rounds"); do
  echo "== round $r"
  "$REL/tc-run" -n 2 -- "$REL/tc-perf" -B gloo -b 4 -e 4 -n "$iters" -w 1000 -c 0 -o all_reduce |
    grep -E '^\s+4 ' || true
  "$REL/tc-run" -n 2 -- "$py" "$ROOT/bench/torchcomms_call.py" "$iters" | grep torchcomms
done
