#!/usr/bin/env bash
# Usage: scripts/build.sh
# Builds the release library, binaries and examples (target/release) and the
# libtorchcomm.so.MAJOR link the tests load. Installs nothing and downloads
# nothing: cargo runs --offline on the crates `make deps` fetched.
set -euo pipefail
source "$(dirname "$0")/common.sh"
"$CARGO" build --offline --release --lib --bins --examples ||
  { echo "build: failed; if crates are missing, fetch them first with 'make deps' (cargo fetch)" >&2; exit 1; }
ln -sf libtorchcomm.so "$REL/libtorchcomm.so.$MAJOR"
