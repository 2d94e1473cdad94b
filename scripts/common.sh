# Sourced by the scripts in scripts/ (not run): the repository root, the
# version from Cargo.toml, where the build lands, and the C flags of the tests.
# Environment: CARGO, CC, CXX (defaults cargo, cc, c++); TC_BUILT=1 (set by
# the Makefile after `make build`) skips the incremental build in ensure_built.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CARGO=${CARGO:-cargo}
CC=${CC:-cc}
CXX=${CXX:-c++}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
MAJOR=${VERSION%%.*}
REL=$ROOT/target/release
LIB=$REL/libtorchcomm.so
BUILD=$ROOT/build
CTEST_CFLAGS=(-std=c11 -Wall -Wextra -Werror -pedantic -g -I"$ROOT/include")
CTEST_LIBS=(-L"$REL" -ltorchcomm -Wl,-rpath,"$REL")

# Builds the library and binaries (incremental) unless the Makefile did.
ensure_built() {
  [ "${TC_BUILT:-}" = 1 ] || "$ROOT/scripts/build.sh"
}
