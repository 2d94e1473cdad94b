#!/usr/bin/env bash
# torch.distributed on the "torchcomm" backend against torch's gloo and
# against the same all_reduce through our C ABI, one job per world size
# (bench/torch_backend_bench.py explains each table): dist.all_reduce from
# 4 B to 64 MiB, and DDP's gradient exchange of ResNet-50 and BERT-base
# gradient shapes (default and gradient_as_bucket_view). Needs a quiet
# machine; needs target/release/libtorchcomm.so (make build) and torch
# (scripts/torch-venv.sh; without it, a SKIPPED line). Options pass through,
# e.g. scripts/bench-torch.sh --only all_reduce --sizes 4; WORLDS="2" narrows.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
lib="$root/target/release/libtorchcomm.so"
[ -f "$lib" ] || { echo "bench-torch: $lib missing: run make build" >&2; exit 1; }
if ! py="$("$root/scripts/torch-venv.sh")"; then
  echo "bench-torch: SKIPPED: torch unavailable (see the line above)"
  exit 0
fi
set -e
export TORCHCOMM_LIBRARY="$lib" PYTHONPATH="$root/python"
echo "## torch.distributed: \"torchcomm\" against gloo ($(nproc) cores)"
for world in ${WORLDS:-2 4}; do
  "$py" "$root/bench/torch_backend_bench.py" "$world" "$@" 2>&1 | grep -v '^\[W\|^W[0-9]\|OMP_NUM'
done
