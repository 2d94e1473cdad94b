#!/usr/bin/env bash
# Usage: scripts/bench-p2p.sh [-b MIN] [-e MAX] [-r ROUNDS]   (default 1 .. 16M, 3 rounds)
# OSU-style point-to-point tables, 2 processes (tc-run): `# Size  Latency (us)`
# (ping-pong, half round trip) and `# Size  Bandwidth (MB/s)` (window of
# non-blocking sends) through our gloo backend's shared-memory
# point-to-point and, interleaved in the same run, with it off (Gloo over
# TCP loopback, hint gloo.shm_p2p=0), plus torch.distributed gloo
# send/recv (bench/torch_p2p.py, measured first; torch from
# scripts/torch-venv.sh, a SKIPPED line when it cannot be had) and Open MPI
# (bench/mpi_p2p.c built with mpicc, run by mpirun -np 2 over shared memory,
# btl self,vader, just before ours) where mpicc and mpirun exist (skipped
# otherwise, said so). Ratios: how many times ours is faster. Ends with the issue's targets, met or missed.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
out=$BUILD/bench/p2p
mkdir -p "$out"
extra=()
if torch_py=$(scripts/torch-venv.sh 2>"$out/torch-venv.err"); then
  echo "bench-p2p: torch.distributed gloo send/recv ($torch_py)"
  "$REL/tc-run" -n 2 -- "$torch_py" bench/torch_p2p.py "$@" "$out/torch.lat" "$out/torch.bw" >"$out/torch.log" 2>&1 ||
    { echo "bench-p2p: torch run failed:"; tail -n 20 "$out/torch.log"; exit 1; }
  extra+=(--extra "torch-gloo=$out/torch.lat,$out/torch.bw")
else
  echo "bench-p2p: $(grep -m1 SKIPPED "$out/torch-venv.err" || echo "SKIPPED: torch unavailable")"
fi
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
  mpi=(mpirun --oversubscribe -np 2 --mca btl self,vader)
  [ "$(id -u)" = 0 ] && mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi[@]}" --allow-run-as-root)
  if ! mpicc -std=c11 -O3 -Wall -Wextra bench/mpi_p2p.c -o "$out/mpi_p2p" >"$out/mpi.log" 2>&1; then
    echo "bench-p2p: bench/mpi_p2p.c did not build: Open MPI skipped"; tail -n 5 "$out/mpi.log"
  elif echo "bench-p2p: Open MPI MPI_Send/MPI_Isend, btl self,vader ($(command -v mpirun))" &&
    "${mpi[@]}" "$out/mpi_p2p" "$@" "$out/mpi.lat" "$out/mpi.bw" >"$out/mpi.log" 2>&1; then
    extra+=(--extra "openmpi=$out/mpi.lat,$out/mpi.bw")
  else
    echo "bench-p2p: Open MPI run failed: Open MPI skipped"; tail -n 20 "$out/mpi.log"
  fi
else
  echo "bench-p2p: mpicc/mpirun not found (make bench-deps installs Open MPI): Open MPI skipped"
fi
# Ours placed as mpirun places Open MPI's 2 ranks on this 2-core machine: one
# per core (the library itself binds nothing; placed by the scheduler, the
# two ranks often share a CPU here).
"$REL/tc-run" -n 2 --bind-to core -- "$REL/tc-osu" "$@" "${extra[@]}" | sed 's/^\[0\] //'
