#!/usr/bin/env bash
# Usage: scripts/build-wheel.sh [OUT_DIR]   (default build/wheel)
# Builds, from the build tree, the wheel torchcomm-VERSION-py3-none-
# linux_ARCH.whl into OUT_DIR: the Python package with libtorchcomm.so and
# libtorchcomm-gloo.so inside it (debug info stripped) and tc-run as a
# script, so `pip install` of that one file is all a user needs (no `make
# install`, no TORCHCOMM_LIBRARY). Standard library only (scripts/
# build_wheel.py): nothing is downloaded. Refuses when the gloo module was
# not built (libgloo-dev missing). Prints the libraries' dependencies
# outside the C/C++ runtime: the gloo module's libgloo.so.0 (Debian's
# libgloo0 and the packages it pulls in) is not carried; docs/python.md says
# so. Prints the wheel's path last.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
OUT=${1:-$BUILD/wheel}
[ -f "$REL/libtorchcomm-gloo.so" ] ||
  { echo "build-wheel: $REL/libtorchcomm-gloo.so was not built (apt-get install libgloo-dev, then make build)" >&2; exit 1; }
stage=$BUILD/wheel-stage
rm -rf "$stage" && mkdir -p "$stage"
for f in libtorchcomm.so libtorchcomm-gloo.so tc-run; do strip --strip-debug -o "$stage/$f" "$REL/$f"; done
rm -f "$OUT"/torchcomm-*.whl
wheel=$(python3 scripts/build_wheel.py "$OUT" "$stage/libtorchcomm.so" "$stage/libtorchcomm-gloo.so" "$stage/tc-run")
rm -rf "$stage"
for f in libtorchcomm.so libtorchcomm-gloo.so; do
  echo "build-wheel: $f needs $(readelf -d "$REL/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | paste -sd' ')"
done
echo "build-wheel: $(du -h "$wheel" | cut -f1) $wheel"
