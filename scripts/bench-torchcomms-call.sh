#!/usr/bin/env bash
# Usage: scripts/bench-torchcomms-call.sh [ROUNDS] [ITERS] [RANKS]
# The Python layer's cost per call: a 4-byte float32 all_reduce
# through torchcomm.torchcomms (bench/torchcomms_call.py) against the same
# call through tc-perf, interleaved ROUNDS times (default 5) in one run,
# ITERS calls each (default 20000), on RANKS ranks (default 2; 1 times the
# call path alone). Needs a quiet machine.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
py="$(bash "$(dirname "$0")/torch-venv.sh")"
rounds=${1:-5}
iters=${2:-20000}
ranks=${3:-2}
export TORCHCOMM_LIBRARY="$LIB" PYTHONPATH="$ROOT/python"
for r in $(seq "$rounds"); do
  echo "== round $r"
  "$REL/tc-run" -n "$ranks" -- "$REL/tc-perf" -B gloo -b 4 -e 4 -n "$iters" -w 1000 -c 0 -o all_reduce |
    grep -E '^\[0\] +4 ' || true
  "$REL/tc-run" -n "$ranks" -- "$py" "$ROOT/bench/torchcomms_call.py" "$iters" | grep torchcomms
done
