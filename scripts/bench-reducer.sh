#!/usr/bin/env bash
# One training step's gradient exchange (ResNet-50 and BERT-base float32
# gradient lists) on 2 and 4 ranks: the reducer against per-tensor
# all-reduce through libtorchcomm and torch DDP's gloo reducer, side by side
# in one run (bench/reducer_bench.py explains each column). Needs
# target/release/libtorchcomm.so (make build) and torch (scripts/torch-venv.sh;
# without it, a SKIPPED line). Options pass through, e.g.
#   scripts/bench-reducer.sh --steps 9 --backward-ms 100
# WORLDS="2" and MODELS="resnet50" narrow the run.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lib="$root/target/release/libtorchcomm.so"
[ -f "$lib" ] || { echo "bench-reducer: $lib missing: run make build" >&2; exit 1; }
if ! py="$("$root/scripts/torch-venv.sh")"; then
  echo "bench-reducer: SKIPPED: torch unavailable (see the line above)"
  exit 0
fi
set -e
echo "## Gradient exchange of one training step (ms, median; rank 0; $(nproc) cores)"
echo
echo "Each side: a backward that writes every gradient, with the exchange, minus the same backward alone (--cold: ours on gradients written long before)."
echo
echo "| model | ranks | ours | ours view | per-tensor | torch DDP | torch DDP view | torch / ours | torch view / ours view | per-tensor / ours view | backward | exposed (view) | hidden |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for world in ${WORLDS:-2 4}; do
  "$py" "$root/bench/reducer_bench.py" "$lib" "$world" --models "${MODELS:-resnet50,bert_base}" "$@"
done
