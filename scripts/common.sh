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
# Sonames every glibc Linux has (auditwheel's manylinux policy, those our
# libraries can meet), as an extended regex: the wheel carries every other
# library its libraries need (scripts/build-wheel.sh, test-wheel.sh).
WHEEL_SYSTEM_LIBS='^(linux-vdso\.so\.1|ld-linux[-a-z0-9_]*\.so\.[0-9]+|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libutil\.so\.1|libresolv\.so\.2|libgcc_s\.so\.1|libstdc\+\+\.so\.6)$'
CTEST_CFLAGS=(-std=c11 -Wall -Wextra -Werror -pedantic -g -I"$ROOT/include")
CTEST_LIBS=(-L"$REL" -ltorchcomm -Wl,-rpath,"$REL")

# Builds the library and binaries (incremental) unless the Makefile did.
ensure_built() {
  [ "${TC_BUILT:-}" = 1 ] || "$ROOT/scripts/build.sh"
}

# Makes the Python virtual environment VENV once, under a lock (callers may
# run at the same time): pip installs the remaining arguments into it,
# announced as WHAT (SIZE). READY names a function that prints the tool's
# path and succeeds once the environment works. Prints that path; when the
# environment cannot be had, calls the caller's `skip` with the reason.
make_venv() {
  local venv=$1 what=$2 size=$3 ready=$4
  shift 4
  local stamp="$venv/.torchcomm-ready" log="$venv.install.log" out
  if [ -f "$stamp" ] && out=$("$ready" 2>/dev/null); then
    echo "$out"
    return 0
  fi
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if [ -f "$stamp" ] && out=$("$ready" 2>/dev/null); then
    echo "$out"
    return 0
  fi
  command -v python3 >/dev/null || skip "python3 not found"
  python3 -m venv "$venv" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
  echo "$what: installing $* from PyPI into $venv ($size)" >&2
  if ! "$venv/bin/pip" install --disable-pip-version-check -q "$@" >"$log" 2>&1; then
    tail -n 5 "$log" >&2
    skip "pip install $* failed (see $log)"
  fi
  out=$("$ready" 2>>"$log") || skip "$* installed but not usable (see $log)"
  touch "$stamp"
  echo "$out"
}
