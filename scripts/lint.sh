#!/usr/bin/env bash
# Usage: scripts/lint.sh
# The code checks `make test` runs first: formatting (cargo fmt --check with the
# committed rustfmt.toml), clippy on every target with warnings as errors, and
# no new import cycle between the crate's top-level modules
# (scripts/check-module-cycles.py against scripts/module-cycles.allow).
# Environment: CARGO (default cargo).
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

for tool in fmt clippy; do
  if ! "$CARGO" "$tool" --version >/dev/null 2>&1; then
    echo "lint: 'cargo $tool' is not installed (rustup component add rustfmt clippy, or make deps)" >&2
    exit 1
  fi
done

"$CARGO" fmt --all -- --check || { echo "lint: formatting differs: run 'cargo fmt' and commit" >&2; exit 1; }
echo "lint: cargo fmt --check clean"
"$CARGO" clippy --all-targets --release --quiet -- -D warnings
echo "lint: cargo clippy --all-targets --release -- -D warnings clean"
python3 scripts/check-module-cycles.py
