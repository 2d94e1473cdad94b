#!/usr/bin/env bash
# Sparse all-reduce benchmark (bench/sparse_bench.py): an embedding-gradient
# workload (1,000,000 x 64 float32 table, 1%, 10%, 50% of rows touched per
# rank, Zipf skew) on 2 and 4 ranks: tc_sparse_all_reduce against torch's
# gloo sparse all-reduce and against our dense all-reduce of the table, in
# one run, interleaved; the table goes to stdout and
# bench/results/sparse_bench.txt. Extra arguments go to the script (e.g.
# --rounds 3 --worlds 2; --before OTHER/libtorchcomm.so adds a before/after
# table of another build, timed in the same rounds). Needs target/release/libtorchcomm.so (make build);
# torch from scripts/torch-venv.sh (SKIPPED when it cannot be had).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lib="$root/target/release/libtorchcomm.so"
[ -f "$lib" ] || { echo "bench-sparse: $lib missing (run make build)"; exit 1; }
py="$("$root/scripts/torch-venv.sh")"
rc=$?
if [ $rc -eq 2 ] || [ -z "$py" ]; then
  echo "bench-sparse: SKIPPED: torch unavailable (see the SKIPPED line above)"
  exit 0
fi
[ $rc -eq 0 ] || exit $rc
mkdir -p "$root/bench/results"
PYTHONWARNINGS=ignore "$py" "$root/bench/sparse_bench.py" "$lib" "$@" | tee "$root/bench/results/sparse_bench.txt"
exit "${PIPESTATUS[0]}"
