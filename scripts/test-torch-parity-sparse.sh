#!/usr/bin/env bash
# Parity of tc_sparse_all_reduce with torch.distributed.all_reduce of sparse
# tensors on a torch gloo process group, 2 and 3 ranks
# (tests/torch_parity/sparse_parity.py). Needs target/release/libtorchcomm.so
# (make build). Torch comes from scripts/torch-venv.sh; when it cannot be had
# this prints a SKIPPED line with the reason and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lib="$root/target/release/libtorchcomm.so"
[ -f "$lib" ] || { echo "test-torch-parity-sparse: $lib missing (run make build)"; exit 1; }
py="$("$root/scripts/torch-venv.sh")"
rc=$?
if [ $rc -eq 2 ] || [ -z "$py" ]; then
  echo "test-torch-parity-sparse: SKIPPED: torch unavailable (see the SKIPPED line above)"
  exit 0
fi
[ $rc -eq 0 ] || exit $rc
# torch warns once per process that sparse invariant checks are off.
PYTHONWARNINGS=ignore "$py" "$root/tests/torch_parity/sparse_parity.py" "$lib" --world 2,3
