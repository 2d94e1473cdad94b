#!/usr/bin/env bash
# Usage: scripts/bench-local.sh [max_devices] [max_bytes]
# Host-side cost per call (microseconds to issue) of tc_local_broadcast and
# tc_local_reduce_add, NCCL and copies paths, 1..max_devices (default 4)
# devices, on the SIMULATED CUDA driver and NCCL of tests/sim_gpu (built by
# `make sim-gpu-test` into target/sim_gpu; run that first). Only the issue_us
# column means something here: the simulated device runs on host threads.
# On a GPU machine, the same program gives the device table (device_us,
# algbw) — see the command it prints at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SIM=$ROOT/target/sim_gpu
[ -f "$SIM/libcuda.so.1" ] && [ -f "$SIM/libnccl.so.2" ] || { echo "bench-local: run 'make sim-gpu-test' first (builds $SIM)"; exit 2; }
[ -f "$ROOT/target/release/libtorchcomm.so" ] || { echo "bench-local: run 'make build' first"; exit 2; }
mkdir -p "$ROOT/build"
${CC:-cc} -std=c11 -O2 -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/capi_tests/gpu/bench_local.c" -o "$ROOT/build/bench_local" -L"$ROOT/target/release" -ltorchcomm \
  -Wl,-rpath,"$ROOT/target/release" -L"$SIM" -lcuda -lm
echo "# SIMULATED driver and NCCL: issue_us is the host cost per call; device_us/algbw mean nothing here"
TC_SIM_DEVICES=${1:-4} TC_SIM_DELAY_US=0 LD_LIBRARY_PATH="$SIM" TORCHCOMM_NCCL_LIBRARY="$SIM/libnccl.so.2" \
  TC_SIM_NCCL_DIR="${TMPDIR:-/tmp}" "$ROOT/build/bench_local" "${1:-4}" "${2:-1048576}"
echo "# Device table on a GPU machine (after make gpu-suite, from the repository root):"
echo "#   cc -std=c11 -O2 -Igpu-suite/include -Igpu-suite/tests -I\$CUDA_HOME/include gpu-suite/tests/bench_local.c -o gpu-suite/bin/bench_local -Lgpu-suite/lib -ltorchcomm -Wl,-rpath,\$PWD/gpu-suite/lib -l:libcuda.so.1 -lm && TORCHCOMM_NCCL_LIBRARY=\$(python3 -c \"import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib','libnccl.so.2'))\") gpu-suite/bin/bench_local"
