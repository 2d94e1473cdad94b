#!/usr/bin/env bash
# Parity of the gradient reducer (allreduce, fp16 and bf16 compress hooks,
# PowerSGD) and tc_broadcast_coalesced with PyTorch's DDP hooks and
# torch.distributed._broadcast_coalesced on a torch gloo process group:
# bit-identical on 2 ranks, within summation-order rounding on 4.
# Needs target/release/libtorchcomm.so (make build). Gets torch through
# scripts/torch-venv.sh; without it, prints a SKIPPED line and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lib="$root/target/release/libtorchcomm.so"
[ -f "$lib" ] || { echo "test-torch-parity-reducer: $lib missing: run make build" >&2; exit 1; }
if ! py="$("$root/scripts/torch-venv.sh")"; then
  echo "test-torch-parity-reducer: SKIPPED: torch unavailable (see the line above), parity of the reducer and tc_broadcast_coalesced not checked"
  exit 0
fi
set -e
for world in 2 4; do
  "$py" "$root/tests/torch_parity/reducer_parity.py" "$lib" "$world"
done
# PowerSGD: the plain and uncompressed parts bit for bit (2 ranks), the
# compressed ones statistically (see the script's docstring).
for world in 2 3; do
  "$py" "$root/tests/torch_parity/powersgd_parity.py" "$lib" "$world"
done
echo "test-torch-parity-reducer: reducer, its PowerSGD hook and tc_broadcast_coalesced match PyTorch"
