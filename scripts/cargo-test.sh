#!/usr/bin/env bash
# Usage: scripts/cargo-test.sh [ARGS...]
# The Rust tests: unit tests and tests/*.rs (multi-process ones spawn real
# processes), release profile. ARGS go to cargo test, e.g. --test gloo_ops.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
exec "$CARGO" test --release "$@"
