#!/usr/bin/env bash
# torch's whole distributed test suite (DistributedTest._DistTestBase, 285
# tests) on the "torchcomm" backend and on gloo, side by side, 3 ranks
# (tests/torch_backend/torch_suite.py --all). Long: about 9 s a test on a
# quiet 2-core machine, so about 45 minutes per backend; not in `make test`.
# Results go to tests/torch_backend/results/BACKEND.json (kept in the repo:
# gloo's side need not be run again) and the table of both to stdout
# (scripts/torch-suite-table.py, the one in docs/testing.md).
# BACKENDS="torchcomm" runs one side; extra arguments pass through (e.g.
# -k test_all_reduce instead of --all).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if ! py="$(bash scripts/torch-venv.sh)"; then
  echo "torch-suite: SKIPPED: torch unavailable (see the line above)"
  exit 0
fi
export TORCHCOMM_LIBRARY="$root/target/release/libtorchcomm.so" PYTHONPATH="$root/python"
# torchcomm's C++ implementation when it can be built (else the Python one;
# torch_suite.py names the one it runs, TORCHCOMM_TORCH_BACKEND forces one).
TORCHCOMM_TORCH_VENV="$(dirname "$(dirname "$py")")" bash scripts/build-torch-ext.sh
out=tests/torch_backend/results
mkdir -p "$out"
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(--all)
status=0
for backend in ${BACKENDS:-torchcomm gloo}; do
  echo "== torch's distributed suite on $backend"
  "$py" tests/torch_backend/torch_suite.py --backend "$backend" "${args[@]}" --results "$out/$backend.json" 2>&1 |
    grep '^PASS\|^FAIL\|^SKIP\|^KNOWN\|^torch_suite' || status=1
done
# Ours, ours with the tests chosen as for gloo (torch_suite.py --as-gloo,
# run by hand: its results file is kept), then gloo's.
"$py" scripts/torch-suite-table.py "$out/torchcomm.json" "$out/torchcomm-as-gloo.json" "$out/gloo.json"
exit $status
