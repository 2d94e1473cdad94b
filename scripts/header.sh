#!/usr/bin/env bash
# Usage: scripts/header.sh write|check|compile
#   write    regenerates include/torchcomm.h from the sources (cbindgen, through
#            examples/gen_header.rs); commit the result
#   check    fails when include/torchcomm.h differs from what the sources give
#   compile  the header compiles standalone, twice in one unit, as C11 and C++17
set -euo pipefail
source "$(dirname "$0")/common.sh"
mkdir -p "$BUILD"
case "${1:-}" in
  write)
    "$CARGO" run --quiet --example gen_header -- include/torchcomm.h ;;
  check)
    "$CARGO" run --quiet --example gen_header -- "$BUILD/torchcomm.h"
    diff -u include/torchcomm.h "$BUILD/torchcomm.h" ||
      { echo "include/torchcomm.h is stale: run 'make header' and commit it"; exit 1; }
    echo "header-check: include/torchcomm.h matches the sources" ;;
  compile)
    printf '#include <torchcomm.h>\n#include <torchcomm.h>\nint main(void){return TC_SUCCESS;}\n' >"$BUILD/header_twice.c"
    "$CC" -std=c11 -Wall -Wextra -Werror -pedantic -Iinclude -c "$BUILD/header_twice.c" -o "$BUILD/header_twice_c.o"
    "$CXX" -std=c++17 -Wall -Wextra -Werror -pedantic -Iinclude -x c++ -c "$BUILD/header_twice.c" -o "$BUILD/header_twice_cxx.o"
    echo "header-compile: C11 and C++17 OK" ;;
  *)
    sed -n '2,6s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
