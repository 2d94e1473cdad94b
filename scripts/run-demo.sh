#!/usr/bin/env bash
# Usage: scripts/run-demo.sh [RANKS]
# The main job (`make run`): examples/demo.c, a multi-process demo of the
# library at work (collectives, point-to-point, async work, split, windows, a
# timing table and the tail of the flight recorder), on RANKS processes
# (default 4) under tc-run.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
mkdir -p "$BUILD"
if [ ! "$BUILD/demo" -nt examples/demo.c ] || [ include/torchcomm.h -nt "$BUILD/demo" ]; then
  "$CC" "${CTEST_CFLAGS[@]}" examples/demo.c -o "$BUILD/demo" "${CTEST_LIBS[@]}"
fi
exec "$REL/tc-run" -n "${1:-4}" -- "$BUILD/demo"
