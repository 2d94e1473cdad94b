#!/usr/bin/env bash
# Usage: scripts/install.sh [--uninstall]
# Installs (or removes) under $DESTDIR$PREFIX (PREFIX default /usr/local):
#   lib/libtorchcomm.so.VERSION with the .so.MAJOR and .so links,
#   lib/libtorchcomm-gloo.so (the gloo backend module, when it was built),
#   bin/tc-run and bin/tc-perf, include/torchcomm.h (C) and torchcomm.hpp,
#   torchcomm_base.hpp (the header-only C++17 interface),
#   lib/pkgconfig/torchcomm.pc (its --libs carry -Wl,-rpath to PREFIX/lib) and
#   lib/cmake/torchcomm/ (find_package(torchcomm)).
# Lists every file it installs. Run `make build` (scripts/build.sh) first.
set -euo pipefail
source "$(dirname "$0")/common.sh"
PREFIX=${PREFIX:-/usr/local}
D=${DESTDIR:-}$PREFIX

if [ "${1:-}" = --uninstall ]; then
  rm -f "$D/lib/libtorchcomm.so" "$D/lib/libtorchcomm.so.$MAJOR" "$D/lib/libtorchcomm.so.$VERSION" \
    "$D/lib/libtorchcomm-gloo.so" "$D/bin/tc-run" "$D/bin/tc-perf" \
    "$D/include/torchcomm.h" "$D/include/torchcomm.hpp" "$D/include/torchcomm_base.hpp" \
    "$D/lib/pkgconfig/torchcomm.pc"
  rm -rf "$D/lib/cmake/torchcomm"
  echo "uninstall: removed libtorchcomm $VERSION from $D"
  exit 0
fi

[ -f "$LIB" ] || { echo "install: $LIB is missing: run 'make build' first" >&2; exit 1; }
install -d "$D/lib" "$D/include" "$D/bin" "$D/lib/pkgconfig" "$D/lib/cmake/torchcomm"
installed=()
put() { # MODE SOURCE DEST
  install -m "$1" "$2" "$3"
  installed+=("$3")
}
put 755 "$LIB" "$D/lib/libtorchcomm.so.$VERSION"
ln -sf "libtorchcomm.so.$VERSION" "$D/lib/libtorchcomm.so.$MAJOR"
ln -sf "libtorchcomm.so.$MAJOR" "$D/lib/libtorchcomm.so"
installed+=("$D/lib/libtorchcomm.so.$MAJOR -> libtorchcomm.so.$VERSION" "$D/lib/libtorchcomm.so -> libtorchcomm.so.$MAJOR")
if [ -f "$REL/libtorchcomm-gloo.so" ]; then
  put 755 "$REL/libtorchcomm-gloo.so" "$D/lib/libtorchcomm-gloo.so"
else
  echo "install: no libtorchcomm-gloo.so was built (Gloo's headers missing): the gloo backend will be unavailable"
fi
for b in tc-run tc-perf; do put 755 "$REL/$b" "$D/bin/$b"; done
for h in torchcomm.h torchcomm.hpp torchcomm_base.hpp; do put 644 "include/$h" "$D/include/$h"; done
sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@VERSION@|$VERSION|g" pkgconfig/torchcomm.pc.in >"$D/lib/pkgconfig/torchcomm.pc"
installed+=("$D/lib/pkgconfig/torchcomm.pc")
for f in torchcommConfig torchcommConfigVersion; do
  sed -e "s|@VERSION@|$VERSION|g" "cmake/$f.cmake.in" >"$D/lib/cmake/torchcomm/$f.cmake"
  installed+=("$D/lib/cmake/torchcomm/$f.cmake")
done
printf 'install: %s\n' "${installed[@]}"
