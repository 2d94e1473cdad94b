#!/usr/bin/env bash
# Usage: scripts/run-reducer.sh [RANKS]
# examples/reducer_train.c: a data-parallel SGD loop whose gradients go
# through the bucketed reducer (parameters first made equal with
# tc_broadcast_coalesced), on RANKS processes (default 4) under tc-run. The
# example checks that every rank ends with the same parameters and a falling
# loss.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
mkdir -p "$BUILD"
if [ ! "$BUILD/reducer_train" -nt examples/reducer_train.c ] || [ include/torchcomm.h -nt "$BUILD/reducer_train" ]; then
  "$CC" "${CTEST_CFLAGS[@]}" examples/reducer_train.c -o "$BUILD/reducer_train" "${CTEST_LIBS[@]}" -lm
fi
exec "$REL/tc-run" -n "${1:-4}" -- "$BUILD/reducer_train"
