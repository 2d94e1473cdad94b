#!/usr/bin/env bash
# Usage: scripts/install-check.sh
# Installs into the scratch prefix build/stage (as a user's non-system prefix)
# and uses it as a newcomer would, with no LD_LIBRARY_PATH and from outside
# the repository:
#   - `make install` lists every file, tc-run and tc-perf included; the
#     library's links; torchcomm.pc's version is Cargo.toml's;
#   - examples/version.c built with pkg-config and with CMake find_package,
#     and README.md's first C program built with pkg-config and run on 2
#     ranks under the installed tc-run (its printed sums checked): each runs
#     without LD_LIBRARY_PATH (pkg-config's --libs carry the rpath);
#   - the installed tc-perf: --help on stdout with exit 0, and an all_reduce
#     on 2 ranks under the installed tc-run, finding the gloo module in
#     PREFIX/lib by itself.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
STAGE=$BUILD/stage
fail() { echo "install-check: $*" >&2; exit 1; }
# Nothing may come from the build tree's environment.
unset LD_LIBRARY_PATH TORCHCOMM_GLOO_LIBRARY
rm -rf "$STAGE"
listing=$(PREFIX=$STAGE "$ROOT/scripts/install.sh")
for f in bin/tc-run bin/tc-perf include/torchcomm.h lib/libtorchcomm.so.$VERSION lib/pkgconfig/torchcomm.pc; do
  grep -q "^install: $STAGE/$f\$" <<<"$listing" || fail "make install does not list $f:"$'\n'"$listing"
  [ -e "$STAGE/$f" ] || fail "$f was listed but not installed"
done
ls -l "$STAGE/lib" | grep -q "libtorchcomm.so -> libtorchcomm.so.$MAJOR\$" || fail "bad libtorchcomm.so link"
ls -l "$STAGE/lib" | grep -q "libtorchcomm.so.$MAJOR -> libtorchcomm.so.$VERSION\$" || fail "bad .so.$MAJOR link"
export PKG_CONFIG_PATH=$STAGE/lib/pkgconfig
[ "$(pkg-config --modversion torchcomm)" = "$VERSION" ] ||
  fail "torchcomm.pc version differs from Cargo.toml ($VERSION)"
pc_flags=$(pkg-config --cflags --libs torchcomm)

"$CC" -std=c11 -Wall -Wextra -Werror examples/version.c -o "$BUILD/version_pc" $pc_flags
(cd /tmp && "$BUILD/version_pc" "$VERSION")
rm -rf "$BUILD/cmake-user" && mkdir -p "$BUILD/cmake-user"
cmake -S examples/cmake -B "$BUILD/cmake-user" -DCMAKE_PREFIX_PATH="$STAGE" >/dev/null
cmake --build "$BUILD/cmake-user" >/dev/null
(cd /tmp && "$BUILD/cmake-user/version_cmake" "$VERSION")
echo "install-check: pkg-config and CMake users build and run against the installed library (no LD_LIBRARY_PATH)"

# README.md's minimal program, exactly as printed there.
awk '/^```c$/ {on = 1; next} on && /^```$/ {exit} on' README.md >"$BUILD/readme_example.c"
[ -s "$BUILD/readme_example.c" ] || fail "README.md has no C program"
"$CC" -std=c11 -Wall -Wextra -Werror "$BUILD/readme_example.c" -o "$BUILD/readme_example" $pc_flags
out=$(cd /tmp && "$STAGE/bin/tc-run" -n 2 -- "$BUILD/readme_example" 2>&1) || fail "README's program failed:"$'\n'"$out"
for r in 0 1; do
  grep -q "^\[$r\] rank $r of 2: sum = {2, 4, 6, 1}\$" <<<"$out" || fail "README's program printed:"$'\n'"$out"
done
echo "install-check: README.md's C program builds with pkg-config and runs on 2 ranks under the installed tc-run"

help=$("$STAGE/bin/tc-perf" --help) || fail "tc-perf --help exits with $?"
grep -q -- "--backend" <<<"$help" || fail "tc-perf --help does not explain its flags"
if [ ! -f "$STAGE/lib/libtorchcomm-gloo.so" ]; then
  echo "install-check: SKIPPED the installed tc-perf run: no libtorchcomm-gloo.so was built (libgloo-dev missing)"
  exit 0
fi
out=$(cd /tmp && "$STAGE/bin/tc-run" -n 2 -- "$STAGE/bin/tc-perf" -B gloo -b 8 -e 1K -f 8 -n 2 -w 1 2>&1) ||
  fail "the installed tc-perf failed:"$'\n'"$out"
rows=$(grep -cE '^\[0\] +[0-9]+ ' <<<"$out" || true)
[ "$rows" -ge 3 ] || fail "the installed tc-perf printed $rows rows, not one per size from 8 B to 1 KiB:"$'\n'"$out"
echo "install-check: the installed tc-perf runs on 2 ranks under the installed tc-run (gloo module from PREFIX/lib)"
