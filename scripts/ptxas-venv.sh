#!/usr/bin/env bash
# Makes (once) a Python virtual environment with NVIDIA's ptxas from PyPI
# (the nvidia-cuda-nvcc-cu12 wheel ships bin/ptxas; no GPU, driver or CUDA
# toolkit needed), used by scripts/check-ptx.sh to validate the library's
# hand-written PTX. Prints the path of ptxas on stdout.
#
#   scripts/ptxas-venv.sh                       # build/ptxas-venv under the repository
#   TORCHCOMM_PTXAS_VENV=DIR scripts/ptxas-venv.sh   # another (shared) place
#
# Exit 0: ready. Exit 2: cannot be had here; the reason is printed on stderr
# as a line starting with "SKIPPED", which the callers pass on.
set -uo pipefail
source "$(dirname "$0")/common.sh"
venv="${TORCHCOMM_PTXAS_VENV:-$BUILD/ptxas-venv}"
skip() { echo "SKIPPED: ptxas unavailable: $*" >&2; exit 2; }
ptxas_ready() {
  local p
  p=$(find "$venv" -path '*nvidia/cuda_nvcc/bin/ptxas' -type f 2>/dev/null | head -n 1)
  [ -n "$p" ] && "$p" --version >/dev/null && echo "$p"
}
make_venv "$venv" ptxas-venv "about 120 MB" ptxas_ready "nvidia-cuda-nvcc-cu12==12.9.86"
