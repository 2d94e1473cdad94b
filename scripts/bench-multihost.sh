#!/usr/bin/env bash
# Usage: scripts/bench-multihost.sh [multihost_compare.py options, e.g. --rounds 3 -e 64M --setups ns,lo --ranks 2,4]
# Between hosts (issue 29): all_reduce float32 sum 4 B..64 MiB and OSU-style
# point-to-point latency and bandwidth, side by side in one interleaved run
# (bench/multihost_compare.py): ours over UCX (TORCHCOMM_HOST_TRANSPORT=ucx,
# UCX_TLS=tcp,self), ours over Gloo, Open MPI over TCP (--mca btl self,tcp),
# Open MPI with UCX (--mca pml ucx --mca pml_ucx_tls any --mca
# pml_ucx_devices any -x UCX_TLS=tcp,self), torch.distributed gloo, and
# ucx_perftest's tag latency at 8 B; 2 and 4 ranks, on two setups: hosts made
# of network namespaces (one rank per host, veth links on a bridge in a
# namespace of its own, as scripts/test-ucx-hosts.sh; root only, else
# skipped and said so) and TCP loopback with shared memory off. Open MPI,
# ucx-utils and torch come from make bench-deps / scripts/torch-venv.sh;
# what is missing is skipped and said so. Markdown tables on stdout; runs
# and a CSV of the medians under build/bench/multihost.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ensure_built
out=$BUILD/bench/multihost
mkdir -p "$out"
args=(--bin "$REL" --out "$out")
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
  mpicc -std=c11 -O3 -Wall -Wextra bench/mpi_allreduce.c -o "$out/mpi_allreduce" &&
    mpicc -std=c11 -O3 -Wall -Wextra bench/mpi_p2p.c -o "$out/mpi_p2p" &&
    args+=(--mpi-allreduce "$out/mpi_allreduce" --mpi-p2p "$out/mpi_p2p") ||
    echo "bench-multihost: the MPI benchmarks did not build; Open MPI skipped"
else
  echo "bench-multihost: mpicc/mpirun not found (make bench-deps installs Open MPI): Open MPI skipped"
fi
if torch_py=$(scripts/torch-venv.sh 2>"$out/torch-venv.err"); then
  args+=(--torch "$torch_py")
else
  echo "bench-multihost: $(grep -m1 SKIPPED "$out/torch-venv.err" || echo "SKIPPED: torch unavailable")"
fi
# Four hosts: namespaces tcbh<pid>0..3 at 10.78.1.<h+1>.
source scripts/netns.sh
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && netns_hosts "tcbs$$" "tcbh$$" 4 10.78.1.; then
  args+=(--ns "tcbh$$" --addr-prefix 10.78.1. --iface "$netns_iface")
  # The switch on the hosts' network too, for mpirun's PMIx server.
  ip -n "tcbs$$" addr add 10.78.1.100/24 dev br0 && args+=(--switch-ns "tcbs$$")
else
  echo "bench-multihost: SKIPPED the network-namespace hosts (needs root and ip with veth/bridge support${netns_why:+: $netns_why})"
fi
echo "# command: make bench-multihost ($0 $*)"
python3 bench/multihost_compare.py "${args[@]}" "$@"
