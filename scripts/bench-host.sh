#!/usr/bin/env bash
# Usage: scripts/bench-host.sh [host_compare.py options, e.g. --rounds 3 -e 1M]
# Host comparison, all-reduce float32 SUM on 2 processes: tc-perf through our
# gloo backend (shared memory, and TORCHCOMM_GLOO_SHM=0: Gloo's algorithm)
# against the same Gloo calls made directly (bench/gloo_direct.cc) and Open
# MPI (bench/mpi_allreduce.c, built only where mpicc and mpirun exist;
# torch.distributed gloo via bench/torch_host.py under tc-run, torch from
# scripts/torch-venv.sh, SKIPPED line when it cannot be had;
# host_compare.py skips MPI and says so when it is absent), interleaved.
# Tables on stdout; CSV and PNG plots under bench/results/. Open MPI and
# matplotlib come from `scripts/deps.sh --bench` (make bench-deps).
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
mkdir -p "$BUILD/bench"
"$CXX" -std=c++17 -O3 -Wall -Wextra bench/gloo_direct.cc -o "$BUILD/bench/gloo_direct" -lgloo -lpthread
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
  mpicc -std=c11 -O3 -Wall -Wextra bench/mpi_allreduce.c -o "$BUILD/bench/mpi_allreduce" ||
    { rm -f "$BUILD/bench/mpi_allreduce"; echo "bench: mpi_allreduce did not build; MPI will be skipped"; }
else
  rm -f "$BUILD/bench/mpi_allreduce"
  echo "bench: mpicc/mpirun not found; MPI will be skipped"
fi
# torch.distributed (gloo) from PyPI in the bench's virtual environment.
torch_args=()
if torch_py=$(scripts/torch-venv.sh 2>"$BUILD/bench/torch-venv.err"); then
  torch_args=(--torch "$torch_py")
else
  note=$(grep -m1 SKIPPED "$BUILD/bench/torch-venv.err" || echo "SKIPPED: torch unavailable")
  echo "bench: $note"
  torch_args=(--torch-note "$note")
fi
python3 bench/host_compare.py --bin "$REL" --direct "$BUILD/bench/gloo_direct" \
  --mpi "$BUILD/bench/mpi_allreduce" --out bench/results "${torch_args[@]}" "$@"
