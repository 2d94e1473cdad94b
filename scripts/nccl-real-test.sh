#!/usr/bin/env bash
# Usage: scripts/nccl-real-test.sh fetch|test
# The real NCCL on a machine without a GPU.
#   fetch  fetches the nvidia-nccl-cu13 wheel of NCCL_WHEEL_VERSION (default
#          2.28.9, the GPU machine's; its x86-64 sha256 is pinned here and
#          PyPI's listed sha256 is checked too) into the ignored
#          target/nccl-wheel/VERSION, keeping only libnccl.so.2 and nccl.h, reused
#          from then on (tests/nccl_abi/fetch_wheel.py: pip when installed, else
#          PyPI's JSON API over HTTPS). When it cannot be had (no network, ...)
#          it says why in that folder's SKIPPED file; never a failure.
#   test   runs the loader's ABI test against that nccl.h, the real-library
#          case of src/comm/nccl_unavailable_tests.rs and, through the C API,
#          tests/nccl_abi/test_nccl_real.c (TC_ERR_UNAVAILABLE naming the NCCL
#          version and the missing CUDA driver); without the wheel it reports
#          the 3 checks SKIPPED with the reason.
# Another version: NCCL_WHEEL_VERSION=2.32.3 (checked against PyPI's sha256).
set -euo pipefail
source "$(dirname "$0")/common.sh"
NCCL_WHEEL_VERSION=${NCCL_WHEEL_VERSION:-2.28.9}
declare -A PINNED=([2.28.9_x86_64]=e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42)
DIR=target/nccl-wheel/$NCCL_WHEEL_VERSION
NCCL_LIB=$ROOT/$DIR/lib/libnccl.so.2
NCCL_HDR=$ROOT/$DIR/include/nccl.h

case "${1:-}" in
  fetch)
    python3 tests/nccl_abi/fetch_wheel.py --version "$NCCL_WHEEL_VERSION" --out "$DIR" \
      --sha256 "${PINNED[${NCCL_WHEEL_VERSION}_$(uname -m)]:-}" ||
      echo "nccl-wheel: could not run tests/nccl_abi/fetch_wheel.py; the real-NCCL checks will be SKIPPED" ;;
  test)
    ensure_built
    if [ ! -f "$NCCL_LIB" ] || [ ! -f "$NCCL_HDR" ]; then
      echo "nccl-real-test: SKIPPED 3 checks (loader ABI against nccl.h, real libnccl in src/comm/nccl_unavailable_tests.rs," \
        "test_nccl_real.c): $(cat "$DIR/SKIPPED" 2>/dev/null || echo 'no wheel was fetched (make nccl-wheel)')"
      exit 0
    fi
    TORCHCOMM_TEST_NCCL_HEADER=$NCCL_HDR \
      "$CARGO" test --release --lib nccl_loader::tests::abi_matches_the_nccl_header -- --nocapture
    TORCHCOMM_TEST_NCCL_LIBRARY=$NCCL_LIB \
      "$CARGO" test --release --lib comm::nccl_unavailable_tests::a_real_libnccl -- --nocapture
    mkdir -p "$BUILD/nccl_abi"
    "$CC" -std=c11 -Wall -Wextra -g -Iinclude -Icapi_tests -Itests/nccl_abi/cuda_stub -I"$DIR/include" \
      tests/nccl_abi/test_nccl_real.c -o "$BUILD/nccl_abi/test_nccl_real" "${CTEST_LIBS[@]}" -lpthread
    TC_TEST_BIN_DIR=$REL TORCHCOMM_NCCL_LIBRARY=$NCCL_LIB "$BUILD/nccl_abi/test_nccl_real"
    echo "nccl-real-test: NCCL $NCCL_WHEEL_VERSION from the wheel: ABI, loader and C API checks passed" ;;
  *)
    sed -n '2,18s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
