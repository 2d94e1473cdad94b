#!/usr/bin/env bash
# torch.distributed's C++ "torchcomm" backend (python/torchcomm/csrc/backend.cpp):
# compiled against the torch of scripts/torch-venv.sh into
# build/torch-ext/<torch>-<python>/ by scripts/build_torch_ext.py, with the
# command of python/torchcomm/_torch_build.py (the one an installed wheel
# uses for its per-user cache; cached: nothing to do while the command and
# the sources are unchanged; one translation unit, 25-33 s, 22 s of CPU, on
# this 2-core machine at a load of 4-5; up to 200 s at 15). Prints
# "SKIPPED: <reason>" and exits 0 when torch or a C++ compiler cannot be
# had: torchcomm.distributed then uses the Python backend and logs that it
# does.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if ! py="$(bash scripts/torch-venv.sh 2>/tmp/torchcomm-venv.$$)"; then
  echo "build-torch-ext: SKIPPED: $(grep -m1 SKIPPED /tmp/torchcomm-venv.$$ || echo 'scripts/torch-venv.sh failed')"
  rm -f /tmp/torchcomm-venv.$$; exit 0
fi
rm -f /tmp/torchcomm-venv.$$
exec "$py" scripts/build_torch_ext.py "$@"
