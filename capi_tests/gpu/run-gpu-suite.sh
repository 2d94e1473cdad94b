#!/usr/bin/env bash
# Runs the GPU suite from the folder `make gpu-suite` prepared (default
# ./gpu-suite). Needs an NVIDIA GPU and driver, a C compiler, cuda.h (CUDA_HOME
# or nvcc's installation) and libnccl (TORCHCOMM_NCCL_LIBRARY, or the
# nvidia-nccl-cu13 pip package next to python3). No cargo, no network.
#
# Runs: one rank (every op x dtype x reduce op x issue mode, graphs, split),
# 2 and 4 ranks as separate processes on one GPU (each its own NCCL_HOSTID,
# sockets over loopback), registration and tc_mem_alloc on 1 and 2 ranks,
# the timeout/abort test on 2 ranks, and the Python
# ctypes smoke test against torch when torch is importable.
#
# Knobs (unset on a GPU machine; `make sim-gpu-test` sets them to run the
# suite on a simulated driver and NCCL):
#   TC_GPU_SIMULATION=1       say loudly that this is a simulation
#   TC_GPU_NCCL_MAX_RANKS=N   nccl runs needing more ranks are skipped (counted)
#   TC_GPU_STAGING_RANKS="2"  rank counts of the gloo staging test
#   TC_GPU_TORCH=0            skip the torch smoke test
set -u
SUITE=$(cd "${1:-gpu-suite}" && pwd) || { echo "gpu-test: no suite folder; run 'make gpu-suite' on a build machine"; exit 2; }
CC=${CC:-cc}

cuda_home=${CUDA_HOME:-}
if [ -z "$cuda_home" ] && command -v nvcc >/dev/null; then cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
[ -z "$cuda_home" ] && [ -d /usr/local/cuda ] && cuda_home=/usr/local/cuda
if [ -z "$cuda_home" ] || [ ! -f "$cuda_home/include/cuda.h" ]; then
  echo "gpu-test: cuda.h not found (set CUDA_HOME or put nvcc on PATH)"; exit 2
fi
libdirs=""
for d in "$cuda_home/lib64/stubs" "$cuda_home/lib/stubs" "$cuda_home/targets/x86_64-linux/lib/stubs" "$cuda_home/lib64"; do
  [ -d "$d" ] && libdirs="$libdirs -L$d"
done

if [ -z "${TORCHCOMM_NCCL_LIBRARY:-}" ]; then
  wheel=$(python3 -c "import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib','libnccl.so.2'))" 2>/dev/null || true)
  [ -n "$wheel" ] && [ -f "$wheel" ] && export TORCHCOMM_NCCL_LIBRARY=$wheel
fi
max_ranks=${TC_GPU_NCCL_MAX_RANKS:-64}
sim=${TC_GPU_SIMULATION:-0}
[ "$sim" = 1 ] && echo "gpu-test: SIMULATION: simulated CUDA driver and NCCL (test doubles), not a GPU verification"
echo "gpu-test: CUDA headers from $cuda_home; NCCL: ${TORCHCOMM_NCCL_LIBRARY:-default search (libnccl.so.2)}"
python3 -c "import importlib.metadata as m;print('gpu-test: nvidia-nccl-cu13', m.version('nvidia-nccl-cu13'))" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu-test: GPU /'

mkdir -p "$SUITE/bin"
for t in test_gpu_ops test_gpu_mem test_gpu_timeout test_gpu_gloo_staging; do
  $CC -std=c11 -O1 -g -Wall -Wextra -I"$SUITE/include" -I"$cuda_home/include" "$SUITE/tests/$t.c" -o "$SUITE/bin/$t" \
    -L"$SUITE/lib" -ltorchcomm -Wl,-rpath,"$SUITE/lib" $libdirs -lcuda -lm -lpthread || { echo "gpu-test: compiling $t failed"; exit 1; }
done

export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 TORCHCOMM_ABORT_ON_ERROR=0
# The gloo module's own dependencies (libgloo, libhiredis, ...) travel in lib/.
export LD_LIBRARY_PATH="$SUITE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TCRUN="$SUITE/bin/tc-run"
summary=()
fails=0
skips=0
skip() { # name reason
  echo "== $1: SKIPPED ($2)"
  summary+=("$1: SKIPPED ($2)")
  skips=$((skips + 1))
}
nccl_run() { # like run, for the nccl backend: skipped beyond TC_GPU_NCCL_MAX_RANKS
  if [ "$2" -gt "$max_ranks" ]; then skip "$1 x$2" "needs $2 nccl ranks; this NCCL runs at most $max_ranks"; return; fi
  run "$@"
}
run() { # name ranks program...
  local name=$1 n=$2; shift 2
  echo "== $name ($n rank(s))"
  local out rc
  out=$(timeout 900 "$TCRUN" -n "$n" -- sh -c 'NCCL_HOSTID=rank$RANK exec "$0" "$@"' "$@" 2>&1); rc=$?
  echo "$out" | tail -n 40
  local line
  line=$(echo "$out" | grep -E '^(\[[^]]*\] *)?[0-9]+ passed, [0-9]+ failed' | tail -n 1 | sed 's/^\[[^]]*\] *//')
  summary+=("$name x$n: ${line:-no result line} (exit $rc)")
  [ "$rc" = 0 ] || fails=$((fails + 1))
}
nccl_run ops 1 "$SUITE/bin/test_gpu_ops"
TC_GPU_MODES=${TC_GPU_MODES_MULTI:-2} nccl_run ops 2 "$SUITE/bin/test_gpu_ops"
TC_GPU_MODES=${TC_GPU_MODES_MULTI:-1} nccl_run ops 4 "$SUITE/bin/test_gpu_ops"
nccl_run mem 1 "$SUITE/bin/test_gpu_mem"
nccl_run mem 2 "$SUITE/bin/test_gpu_mem"
nccl_run timeout 2 "$SUITE/bin/test_gpu_timeout"
for n in ${TC_GPU_STAGING_RANKS:-2}; do run gloo-staging "$n" "$SUITE/bin/test_gpu_gloo_staging"; done
# tc_local_*: one process driving every visible device plus the CPU (path checks from the INFO log).
$CC -std=c11 -O1 -g -Wall -Wextra -I"$SUITE/include" -I"$cuda_home/include" "$SUITE/tests/test_gpu_local.c" -o "$SUITE/bin/test_gpu_local" -L"$SUITE/lib" -ltorchcomm -Wl,-rpath,"$SUITE/lib" $libdirs -lcuda -lm -lpthread \
  && TORCHCOMM_DEBUG=INFO run local-device-group 1 "$SUITE/bin/test_gpu_local" || { summary+=("local-device-group: compiling failed"); fails=$((fails + 1)); }
if [ "${TC_GPU_TORCH:-1}" = 0 ]; then
  skip torch-smoke "TC_GPU_TORCH=0"
elif python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  run torch-smoke 1 python3 "$SUITE/tests/torch_smoke.py" "$SUITE/lib/libtorchcomm.so"
else
  skip torch-smoke "torch with CUDA not importable"
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
total_pass=0; total_fail=0
for s in "${summary[@]}"; do
  p=$(echo "$s" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed.*/\1/p'); f=$(echo "$s" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed.*/\2/p')
  total_pass=$((total_pass + ${p:-0})); total_fail=$((total_fail + ${f:-0}))
done
echo "gpu-test: $total_pass passed, $total_fail failed, $skips run(s) skipped ($fails run(s) exited non-zero)"
[ "$sim" = 1 ] && echo "gpu-test: (SIMULATION: these results say nothing about real GPUs)"
[ "$fails" = 0 ]
