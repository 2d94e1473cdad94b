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
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${TORCHCOMM_PTXAS_VENV:-$root/build/ptxas-venv}"
wheel="nvidia-cuda-nvcc-cu12==12.9.86"
stamp="$venv/.torchcomm-ready"
skip() { echo "SKIPPED: ptxas unavailable: $*" >&2; exit 2; }
find_ptxas() { find "$venv" -path '*nvidia/cuda_nvcc/bin/ptxas' -type f 2>/dev/null | head -n 1; }

p=$(find_ptxas)
if [ -f "$stamp" ] && [ -n "$p" ] && "$p" --version >/dev/null 2>&1; then
  echo "$p"; exit 0
fi
lock="$venv.lock"
mkdir -p "$(dirname "$venv")"
exec 9>"$lock"
flock 9
p=$(find_ptxas)
if [ -f "$stamp" ] && [ -n "$p" ] && "$p" --version >/dev/null 2>&1; then
  echo "$p"; exit 0
fi
command -v python3 >/dev/null || skip "python3 not found"
python3 -m venv "$venv" >/dev/null 2>&1 || skip "python3 -m venv failed (install python3-venv)"
log="$venv.install.log"
echo "ptxas-venv: installing $wheel from PyPI into $venv (about 120 MB)" >&2
if ! "$venv/bin/pip" install --disable-pip-version-check -q "$wheel" >"$log" 2>&1; then
  tail -n 5 "$log" >&2
  skip "pip install $wheel failed (see $log)"
fi
p=$(find_ptxas)
[ -n "$p" ] || skip "$wheel installed but has no bin/ptxas (see $venv)"
"$p" --version >>"$log" 2>&1 || skip "$p does not run on this machine (see $log)"
touch "$stamp"
echo "$p"
