#!/usr/bin/env bash
# Usage: scripts/capi-test.sh [--valgrind]
# The C API from C: every capi_tests/test_*.c compiled with -Werror and run
# (test_any_source.c also over Gloo TCP and UCX);
# bad environment values warn and fall back to defaults; every exported
# function is exercised by test_every_function.c; the ctypes example's
# constants match the header and it runs on 3 ranks; the demo (make run) runs
# on 3 ranks and its flight-recorder title counts the rows it prints.
# --valgrind instead: every C test under valgrind, no errors and no definite
# or indirect leaks.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
mkdir -p "$BUILD/capi"
tests=()
for src in capi_tests/test_*.c; do
  bin=$BUILD/capi/$(basename "$src" .c)
  if [ ! "$bin" -nt "$src" ] || [ include/torchcomm.h -nt "$bin" ] || [ capi_tests/capi_util.h -nt "$bin" ]; then
    "$CC" "${CTEST_CFLAGS[@]}" "$src" -o "$bin" "${CTEST_LIBS[@]}" -lpthread
  fi
  tests+=("$bin")
done
export TC_TEST_BIN_DIR=$REL

if [ "${1:-}" = --valgrind ]; then
  for t in "${tests[@]}"; do
    echo "== valgrind $t"
    TC_UNDER_VALGRIND=1 valgrind -q --error-exitcode=99 --leak-check=full \
      --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect "$t" >/dev/null
  done
  echo "capi-valgrind: no errors, no leaks"
  exit 0
fi

for t in "${tests[@]}"; do echo "== $t"; "$t"; done

# Receives from any source over the other host transports too (the loop
# above ran them on shared memory): Gloo over TCP, and UCX where installed.
echo "== test_any_source over Gloo TCP"; TORCHCOMM_GLOO_SHM=0 "$BUILD/capi/test_any_source"
# (grep reads all of ldconfig's output: with -q it could stop early, and pipefail
# would take the writer's SIGPIPE for "not found".)
if ldconfig -p 2>/dev/null | grep 'libucp\.so\.0 ' >/dev/null; then
  echo "== test_any_source over UCX"
  TORCHCOMM_GLOO_SHM=0 TORCHCOMM_HOST_TRANSPORT=ucx UCX_TLS=tcp,self "$BUILD/capi/test_any_source"
else
  echo "capi-test: test_any_source over UCX SKIPPED: libucp.so.0 is not installed"
fi

# Bad environment values: a warning naming each variable, then defaults.
out=$(TORCHCOMM_TIMEOUT_SECONDS=soon TORCHCOMM_ABORT_ON_ERROR=maybe TORCHCOMM_DEBUG=LOUD \
  "$BUILD/capi/test_errors" 2>&1) || { echo "$out"; exit 1; }
for v in TORCHCOMM_TIMEOUT_SECONDS TORCHCOMM_ABORT_ON_ERROR TORCHCOMM_DEBUG; do
  echo "$out" | grep -q "WARN $v=" || { echo "capi-test: no warning for a bad $v"; echo "$out"; exit 1; }
done
echo "capi-test: bad environment values warn and fall back to defaults"

# Every exported function has its argument checks exercised.
missing=$(for f in $(nm -D --defined-only "$LIB" | awk '{print $3}'); do
  grep -q "\b$f(" capi_tests/test_every_function.c || echo "$f"; done)
if [ -n "$missing" ]; then echo "capi-test: not covered by test_every_function.c:" $missing; exit 1; fi
echo "capi-test: every exported function is covered by test_every_function.c"

# The ctypes example: its constants match the header, and it runs on 3 ranks.
for kv in $(sed -n 's/^\(TC_[A-Z0-9_]*\) = \(-\{0,1\}[0-9]*\)$/\1=\2/p' examples/python/ring.py); do
  grep -q "^#define ${kv%%=*} ${kv#*=}$" include/torchcomm.h ||
    { echo "capi-test: examples/python/ring.py has $kv, the header differs"; exit 1; }
done
"$REL/tc-run" -n 3 -- python3 examples/python/ring.py "$LIB"

# The demo on 3 ranks: all results correct, and the flight-recorder title
# ("last K of N operations") counts exactly the K rows printed under it.
"$ROOT/scripts/run-demo.sh" 3 >"$BUILD/demo.out" 2>&1 || { cat "$BUILD/demo.out"; exit 1; }
python3 - "$BUILD/demo.out" <<'PY'
import re, sys
lines = [l.removeprefix("[0] ") for l in open(sys.argv[1]).read().splitlines() if l.startswith("[0] ")]
i = next(i for i, l in enumerate(lines) if l.startswith("flight recorder of"))
claimed = int(re.search(r": last (\d+) of \d+ operations", lines[i]).group(1))
rows = 0
for l in lines[i + 2:]:
    if not re.match(r"\s*\d+\s", l):
        break
    rows += 1
if claimed != rows or rows == 0 or "all results correct" not in lines[-1]:
    sys.exit(f"capi-test: the demo's flight recorder says 'last {claimed}' over {rows} rows:\n" + "\n".join(lines))
print(f"capi-test: the demo runs on 3 ranks; its flight recorder shows the last {rows} operations it says")
PY
