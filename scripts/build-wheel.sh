#!/usr/bin/env bash
# Usage: scripts/build-wheel.sh [OUT_DIR]   (default build/wheel)
# Builds, from the build tree, the wheel torchcomm-VERSION-py3-none-
# linux_ARCH.whl into OUT_DIR: the Python package with libtorchcomm.so and
# libtorchcomm-gloo.so inside it (debug info stripped), tc-run as a script,
# and the torch extension's source (csrc/backend.cpp with include/
# torchcomm.h beside it), which the installed package compiles on first use
# (python/torchcomm/_torch_build.py). So `pip install` of that one file is
# all a user needs (no `make install`, no TORCHCOMM_LIBRARY, no libgloo).
#
# Vendoring, as auditwheel repairs a wheel: every library the gloo module
# needs, directly or not, outside the system's own (glibc's, libgcc_s,
# libstdc++: WHEEL_SYSTEM_LIBS in scripts/common.sh) is copied into
# torchcomm/.libs/ under a name with a digest of its contents (libgloo.so.0
# becomes libgloo-<8 hex>.so.0, so it never meets another copy of the same
# soname in a process, e.g. NCCL's libibverbs), and patchelf points the
# names at the copies: their sonames, the NEEDED entries that name them,
# RUNPATH $ORIGIN in each copy and $ORIGIN/.libs in the gloo module (set
# here rather than at link time: the NEEDED entries must be rewritten
# anyway, and the build tree's and `make install`'s module keep no RUNPATH).
# libtorchcomm.so must need nothing outside the system's libraries
# (checked). Here that is Debian's libgloo.so.0 with libhiredis, libibverbs,
# libnl-3 and libnl-route-3; their packages' copyright files go into
# torchcomm/licenses/.
#
# Standard library only for the zip (scripts/build_wheel.py); patchelf from
# apt (`make deps`); nothing is downloaded. Refuses when the gloo module was
# not built (libgloo-dev missing) or patchelf is missing. Prints each
# library's NEEDED entries, then the wheel's path last.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
OUT=${1:-$BUILD/wheel}
fail() { echo "build-wheel: $*" >&2; exit 1; }
[ -f "$REL/libtorchcomm-gloo.so" ] ||
  fail "$REL/libtorchcomm-gloo.so was not built (apt-get install libgloo-dev, then make build)"
command -v patchelf >/dev/null || fail "patchelf is missing (make deps, or apt-get install patchelf)"
[ -f include/torchcomm.h ] || fail "include/torchcomm.h is missing (make header)"
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

stage=$BUILD/wheel-stage/torchcomm  # the files added to python/torchcomm
tc_run=$BUILD/wheel-stage/tc-run
rm -rf "${stage%/*}" && mkdir -p "$stage/.libs" "$stage/csrc"
for f in libtorchcomm.so libtorchcomm-gloo.so; do strip --strip-debug -o "$stage/$f" "$REL/$f"; done
strip --strip-debug -o "$tc_run" "$REL/tc-run"
cp include/torchcomm.h "$stage/csrc/torchcomm.h"

extra=$(needed "$REL/libtorchcomm.so" | grep -Ev "$WHEEL_SYSTEM_LIBS" || true)
[ -z "$extra" ] || fail "libtorchcomm.so needs $extra, outside the system's libraries: vendor it too"

# The gloo module's whole closure as the loader resolves it here (ldd), less
# the system's libraries: soname and path of each library to carry.
declare -A vendored=()   # soname -> the name of its copy in .libs
closure=$(ldd "$REL/libtorchcomm-gloo.so")
! grep -q "not found" <<<"$closure" || fail "libtorchcomm-gloo.so has unresolved dependencies:"$'\n'"$closure"
while read -r soname path; do
  grep -Eq "$WHEEL_SYSTEM_LIBS" <<<"$soname" && continue
  real=$(readlink -f "$path")
  digest=$(sha256sum "$real" | cut -c1-8)
  base=${soname%%.so*}
  copy="$base-$digest${soname#"$base"}"
  strip --strip-debug -o "$stage/.libs/$copy" "$real"
  vendored[$soname]=$copy
  # Its terms go with it: the Debian package's copyright file.
  # (dpkg knows each file by one spelling: merged /usr has two)
  owner=$(dpkg -S "$path" "$real" "${real#/usr}" 2>/dev/null | cut -d: -f1 | head -n 1 || true)
  if [ -n "$owner" ] && [ -f "/usr/share/doc/$owner/copyright" ]; then
    mkdir -p "$stage/licenses" && cp "/usr/share/doc/$owner/copyright" "$stage/licenses/$owner.copyright"
  else
    echo "build-wheel: warning: no Debian copyright file found for $path; the wheel carries it without one" >&2
  fi
done < <(sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' <<<"$closure")
[ -n "${vendored[libgloo.so.0]:-}" ] || fail "ldd did not show libgloo.so.0 under libtorchcomm-gloo.so:"$'\n'"$closure"

# Points every NEEDED entry of $1 that names a vendored library at its copy.
relink() {
  local dep args=()
  for dep in $(needed "$1"); do
    [ -n "${vendored[$dep]:-}" ] && args+=(--replace-needed "$dep" "${vendored[$dep]}")
  done
  [ ${#args[@]} -eq 0 ] || patchelf "${args[@]}" "$1"
}
for soname in "${!vendored[@]}"; do
  copy=$stage/.libs/${vendored[$soname]}
  relink "$copy"
  patchelf --set-soname "${vendored[$soname]}" --set-rpath '$ORIGIN' "$copy"
done
relink "$stage/libtorchcomm-gloo.so"
patchelf --set-rpath '$ORIGIN/.libs' "$stage/libtorchcomm-gloo.so"

rm -f "$OUT"/torchcomm-*.whl
wheel=$(python3 scripts/build_wheel.py "$OUT" "$stage" "$tc_run")
for f in libtorchcomm.so libtorchcomm-gloo.so $(cd "$stage" && ls .libs/*); do
  echo "build-wheel: $f needs $(needed "$stage/$f" | paste -sd' ')"
done
rm -rf "${stage%/*}"
echo "build-wheel: $(du -h "$wheel" | cut -f1) $wheel"
