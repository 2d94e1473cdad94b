#!/usr/bin/env bash
# Usage: scripts/deps.sh [--bench]
# What the build and the tests need, installed or fetched (the only step that
# downloads; `make test` and `make run` call it first):
#   - Debian packages: libgloo-dev libucx0 pkg-config cmake valgrind g++ python3
#     python3-venv python3-dev ca-certificates patchelf (patchelf: points the
#     wheel's gloo module at the libraries it carries, scripts/build-wheel.sh; libucx0: UCX, loaded at run time by the UCX
#     host transport and its tests; the build needs no UCX headers; python3-dev:
#     Python.h, for scripts/build-torch-ext.sh); installed with apt-get when run as root, otherwise
#     printed (the build goes on without them: no gloo module, fewer checks);
#   - rustfmt and clippy (rustup component add) when missing, for make lint;
#   - the crates of Cargo.lock (cargo fetch), so that `make build` is offline;
#   - NVIDIA's ptxas from PyPI into build/ptxas-venv (scripts/ptxas-venv.sh),
#     which scripts/check-ptx.sh uses; when it cannot be had the check says
#     SKIPPED.
# --bench instead: Open MPI (the figure to beat in make bench-host), ucx-utils
# (ucx_perftest, UCX's own latency) and matplotlib (the plots); when they cannot be had the benchmark says so and
# goes on without them.
set -euo pipefail
source "$(dirname "$0")/common.sh"
LOG=${TMPDIR:-/tmp}/torchcomm-deps.log

# Installs the missing packages of "$@" (root), or prints them. Returns 1 when
# apt-get failed.
apt_install() {
  local missing="" p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "deps: not root, so not installing:$missing (run: sudo apt-get install$missing)"
    return 0
  fi
  echo "deps: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086 # one word per package
  { apt-get install -y --no-install-recommends $missing ||
    { apt-get update && apt-get install -y --no-install-recommends $missing; }; } >"$LOG" 2>&1 ||
    { tail -n 20 "$LOG"; return 1; }
}

if [ "${1:-}" = --bench ]; then
  apt_install libopenmpi-dev openmpi-bin || echo "deps: Open MPI could not be installed; MPI will be skipped"
  apt_install ucx-utils || echo "deps: ucx-utils could not be installed; ucx_perftest will be skipped"
  python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib 2>/dev/null ||
    echo "deps: matplotlib could not be installed; plots will be skipped"
  exit 0
fi

apt_install libgloo-dev libucx0 pkg-config cmake valgrind g++ python3 python3-venv python3-dev ca-certificates patchelf
if ! { "$CARGO" fmt --version && "$CARGO" clippy --version; } >/dev/null 2>&1; then
  if command -v rustup >/dev/null; then
    rustup component add rustfmt clippy
  else
    echo "deps: cargo fmt / cargo clippy missing and no rustup to add them; make lint will fail"
  fi
fi
"$CARGO" fetch
# NVIDIA's ptxas from PyPI (build/ptxas-venv), for scripts/check-ptx.sh.
bash "$(dirname "$0")/ptxas-venv.sh" >/dev/null || echo "deps: ptxas could not be had; check-ptx will say SKIPPED"
