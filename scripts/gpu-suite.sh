#!/usr/bin/env bash
# Usage: scripts/gpu-suite.sh
# On a build machine (with cargo): gathers into the ignored folder gpu-suite/
# what the GPU machine needs, a few MiB: the release library, libtorchcomm-gloo
# and its Gloo libraries (debug info stripped), tc-run, tc-perf, the header,
# the C/Python GPU tests, the GPU benchmark's sources and run.sh. On the GPU
# machine (no cargo, from the repository root): `make gpu-test` runs
# gpu-suite/run.sh (capi_tests/gpu/run-gpu-suite.sh: 1, 2 and 4 ranks) and
# `make gpu-bench` runs gpu-suite/bench/run-gpu-bench.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
S=$ROOT/gpu-suite
rm -rf "$S" && mkdir -p "$S/lib" "$S/bin" "$S/include" "$S/tests" "$S/bench"
strip --strip-debug -o "$S/lib/libtorchcomm.so" "$LIB"
cp "$S/lib/libtorchcomm.so" "$S/lib/libtorchcomm.so.$MAJOR"
if [ -f "$REL/libtorchcomm-gloo.so" ]; then
  strip --strip-debug -o "$S/lib/libtorchcomm-gloo.so" "$REL/libtorchcomm-gloo.so"
  for d in $(ldd "$REL/libtorchcomm-gloo.so" | awk '/libgloo|libhiredis|libibverbs|libnl-/ {print $3}'); do
    strip --strip-debug -o "$S/lib/$(basename "$d")" "$d"
  done
fi
strip --strip-debug -o "$S/bin/tc-run" "$REL/tc-run"
strip --strip-debug -o "$S/bin/tc-perf" "$REL/tc-perf"
cp bench/nccl_raw.c bench/torch_dist.py bench/gpu_compare.py bench/run-gpu-bench.sh "$S/bench/"
cp include/torchcomm.h "$S/include/"
cp capi_tests/capi_util.h capi_tests/gpu/*.c capi_tests/gpu/*.h capi_tests/gpu/*.py "$S/tests/"
cp capi_tests/gpu/run-gpu-suite.sh "$S/run.sh" && chmod +x "$S/run.sh"
echo "gpu-suite: $(du -sh "$S" | cut -f1) in gpu-suite/; on the GPU machine run: make gpu-test, make gpu-bench"
