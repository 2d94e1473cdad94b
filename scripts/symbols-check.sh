#!/usr/bin/env bash
# Usage: scripts/symbols-check.sh
# The shared library exports tc_* symbols only and carries the soname
# libtorchcomm.so.MAJOR.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
bad=$(nm -D --defined-only "$LIB" | awk '{print $3}' | grep -v '^tc_' || true)
if [ -n "$bad" ]; then echo "symbols-check: non-tc_ exports:"; echo "$bad"; exit 1; fi
readelf -d "$LIB" | grep -q "SONAME.*libtorchcomm.so.$MAJOR\]" || { echo "symbols-check: bad soname"; exit 1; }
echo "symbols-check: $(nm -D --defined-only "$LIB" | wc -l) symbols, all tc_*, soname libtorchcomm.so.$MAJOR"
