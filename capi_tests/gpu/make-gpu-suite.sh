#!/usr/bin/env bash
# `make gpu-suite`: gathers into one folder (default ./gpu-suite, ignored by
# git) everything the GPU machine needs to run the GPU suite with no cargo,
# no make and no network: the release library (debug info stripped), tc-run
# and tc-perf, the gloo module and the libraries it links (libgloo,
# libhiredis, libibverbs, libnl), the header, the C/Python test sources and
# the Python package (python/torchcomm, for test_cuda_comm.py), the
# benchmark sources, and run.sh (capi_tests/gpu/run-gpu-suite.sh). The
# fetched NCCL wheel's libnccl.so.2 (target/nccl-wheel/) is carried when it
# fits the transfer limit (TC_GPU_SUITE_MAX_NCCL_MIB, default 40 MiB, so
# that the whole suite stays well under 64 MiB); otherwise the suite uses
# the NCCL the GPU machine has, and this script says so.
#   capi_tests/gpu/make-gpu-suite.sh [OUT [RELEASE_DIR]]
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/gpu-suite}
REL=${2:-$ROOT/target/release}
MAX_NCCL_MIB=${TC_GPU_SUITE_MAX_NCCL_MIB:-40}
major=$(sed -n 's/^version = "\([0-9]*\)\..*/\1/p' "$ROOT/Cargo.toml" | head -n 1)
rm -rf "$OUT" && mkdir -p "$OUT/lib" "$OUT/bin" "$OUT/include" "$OUT/tests" "$OUT/bench"
strip --strip-debug -o "$OUT/lib/libtorchcomm.so" "$REL/libtorchcomm.so"
cp "$OUT/lib/libtorchcomm.so" "$OUT/lib/libtorchcomm.so.$major"
if [ -f "$REL/libtorchcomm-gloo.so" ]; then
  strip --strip-debug -o "$OUT/lib/libtorchcomm-gloo.so" "$REL/libtorchcomm-gloo.so"
  for d in $(ldd "$REL/libtorchcomm-gloo.so" | awk '/libgloo|libhiredis|libibverbs|libnl-/ {print $3}'); do
    strip --strip-debug -o "$OUT/lib/$(basename "$d")" "$d"
  done
fi
for b in tc-run tc-perf; do strip --strip-debug -o "$OUT/bin/$b" "$REL/$b"; done
cp "$ROOT/bench/nccl_raw.c" "$ROOT/bench/torch_dist.py" "$ROOT/bench/gpu_compare.py" "$ROOT/bench/run-gpu-bench.sh" "$OUT/bench/"
cp "$ROOT/include/torchcomm.h" "$OUT/include/"
cp "$ROOT/capi_tests/capi_util.h" "$ROOT"/capi_tests/gpu/*.c "$ROOT"/capi_tests/gpu/*.h "$ROOT"/capi_tests/gpu/*.py "$OUT/tests/"
cp "$ROOT/capi_tests/gpu/run-gpu-suite.sh" "$OUT/run.sh" && chmod +x "$OUT/run.sh"
# The Python package, for tests/test_cuda_comm.py (torchcomm.cuda_comm against torch.cuda.comm).
mkdir -p "$OUT/python/torchcomm" && cp "$ROOT"/python/torchcomm/*.py "$OUT/python/torchcomm/"

nccl_note="not carried: no wheel was fetched (make nccl-wheel); run.sh uses the GPU machine's NCCL"
wheel=$(ls -1 "$ROOT"/target/nccl-wheel/*/lib/libnccl.so.2 2>/dev/null | tail -n 1 || true)
if [ -n "$wheel" ]; then
  mib=$(( $(stat -c %s "$wheel") / 1048576 ))
  if [ "$mib" -le "$MAX_NCCL_MIB" ]; then
    mkdir -p "$OUT/lib/nccl" && cp "$wheel" "$OUT/lib/nccl/libnccl.so.2"
    nccl_note="carried: $wheel ($mib MiB) as lib/nccl/libnccl.so.2"
  else
    nccl_note="not carried: $wheel is $mib MiB, over the $MAX_NCCL_MIB MiB share of the 64 MiB transfer limit; run.sh uses the GPU machine's NCCL (the nvidia-nccl-cu13 wheel next to python3, else the loader's libnccl.so.2)"
  fi
fi
echo "$nccl_note" > "$OUT/NCCL"
size=$(du -sm "$OUT" | cut -f1)
echo "gpu-suite: ${size} MiB in $OUT; NCCL $nccl_note"
if [ "$size" -ge 64 ]; then echo "gpu-suite: $OUT is ${size} MiB, over the 64 MiB transfer limit"; exit 1; fi
echo "gpu-suite: on the GPU machine, from the repository root: bash gpu-suite/run.sh   (then: bash gpu-suite/run.sh part2, then part3, then part4)"
