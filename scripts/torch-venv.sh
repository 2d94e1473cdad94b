#!/usr/bin/env bash
# Makes (once) a Python virtual environment with PyTorch from PyPI, numpy and
# pytest, the independent reference for the parity and interop tests and the
# peer in the benchmarks. Prints the environment's python on stdout.
#
#   scripts/torch-venv.sh            # build/torch-venv under the repository
#   TORCHCOMM_TORCH_VENV=DIR scripts/torch-venv.sh   # another (shared) place
#
# Exit 0: ready. Exit 2: cannot be had here; the reason is printed on stderr
# as a line starting with "SKIPPED", which the callers pass on: a test that
# needs torch reports that line, never a silent pass.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${TORCHCOMM_TORCH_VENV:-$root/build/torch-venv}"
py="$venv/bin/python"
stamp="$venv/.torchcomm-ready"
skip() { echo "SKIPPED: torch unavailable: $*" >&2; exit 2; }

if [ -f "$stamp" ] && "$py" -c 'import torch, numpy' 2>/dev/null; then
  echo "$py"; exit 0
fi
lock="$venv.lock"
mkdir -p "$(dirname "$venv")"
exec 9>"$lock"
flock 9
if [ -f "$stamp" ] && "$py" -c 'import torch, numpy' 2>/dev/null; then
  echo "$py"; exit 0
fi
command -v python3 >/dev/null || skip "python3 not found"
python3 -m venv "$venv" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
log="$venv.install.log"
echo "torch-venv: installing torch, numpy, pytest from PyPI into $venv (about 2 minutes, 5 GB)" >&2
if ! "$venv/bin/pip" install --disable-pip-version-check -q torch numpy pytest >"$log" 2>&1; then
  tail -n 5 "$log" >&2
  skip "pip install torch failed (see $log)"
fi
"$py" -c 'import torch, numpy' 2>>"$log" || skip "torch does not import (see $log)"
touch "$stamp"
echo "$py"
