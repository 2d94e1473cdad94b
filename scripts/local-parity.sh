#!/usr/bin/env bash
# Usage: scripts/local-parity.sh
# tc_local_scatter's default split (chunk_counts NULL) against torch.chunk
# itself (tests/interop/local_chunk_parity.py, CPU members: no GPU needed).
# torch comes from scripts/torch-venv.sh; without it this prints SKIPPED with
# the reason and exits 0.
set -uo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
py=$("$ROOT/scripts/torch-venv.sh" 2>/tmp/local-parity.$$) || {
  echo "local-parity: $(grep -m1 '^SKIPPED' /tmp/local-parity.$$ || echo 'SKIPPED: torch unavailable')"; rm -f /tmp/local-parity.$$; exit 0; }
rm -f /tmp/local-parity.$$
"$py" "$ROOT/tests/interop/local_chunk_parity.py" "$LIB"
