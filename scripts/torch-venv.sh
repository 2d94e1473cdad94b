#!/usr/bin/env bash
# Makes (once) a Python virtual environment with PyTorch from PyPI, numpy,
# pytest, and expecttest and hypothesis (imported by torch's own distributed
# suite, torch.testing._internal), the independent reference for the parity and interop tests and the
# peer in the benchmarks. Prints the environment's python on stdout.
#
#   scripts/torch-venv.sh            # build/torch-venv under the repository
#   TORCHCOMM_TORCH_VENV=DIR scripts/torch-venv.sh   # another (shared) place
#
# Exit 0: ready. Exit 2: cannot be had here; the reason is printed on stderr
# as a line starting with "SKIPPED", which the callers pass on: a test that
# needs torch reports that line, never a silent pass.
set -uo pipefail
source "$(dirname "$0")/common.sh"
venv="${TORCHCOMM_TORCH_VENV:-$BUILD/torch-venv}"
skip() { echo "SKIPPED: torch unavailable: $*" >&2; exit 2; }
torch_ready() { "$venv/bin/python" -c 'import torch, numpy, expecttest, hypothesis' && echo "$venv/bin/python"; }
make_venv "$venv" torch-venv "about 2 minutes, 5 GB" torch_ready torch numpy pytest expecttest hypothesis
