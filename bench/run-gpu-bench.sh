#!/usr/bin/env bash
# GPU benchmark from the folder `make gpu-suite` prepared (default ./gpu-suite):
# our nccl backend (tc-perf -B nccl) against raw NCCL calls (nccl_raw, compiled
# here from its source with cc) and torch.distributed (torch_dist.py), world
# size 1, all_reduce float32 sum 8 B .. 256 MiB, interleaved. Tables on
# stdout; CSV and PNG plots under SUITE/results/. Needs an NVIDIA GPU and
# driver, a C compiler, python3, libnccl (the suite's own copy in lib/nccl/,
# TORCHCOMM_NCCL_LIBRARY, or the nvidia-nccl-cu13 pip package next to python3); torch and matplotlib are
# used when importable. No cargo, no CUDA headers, no network.
# Extra arguments for bench/gpu_compare.py: GPU_BENCH_ARGS (e.g. "--rounds 3").
set -u
SUITE=$(cd "${1:-gpu-suite}" && pwd) || { echo "gpu-bench: no suite folder; run 'make gpu-suite' on a build machine"; exit 2; }
CC=${CC:-cc}
for f in bin/tc-run bin/tc-perf bench/nccl_raw.c bench/torch_dist.py bench/gpu_compare.py; do
  [ -e "$SUITE/$f" ] || { echo "gpu-bench: $SUITE/$f is missing; rebuild the suite with 'make gpu-suite'"; exit 2; }
done

if [ -z "${TORCHCOMM_NCCL_LIBRARY:-}" ] && [ -f "$SUITE/lib/nccl/libnccl.so.2" ]; then
  export TORCHCOMM_NCCL_LIBRARY=$SUITE/lib/nccl/libnccl.so.2 # the copy the suite carries (see make gpu-suite)
fi
if [ -z "${TORCHCOMM_NCCL_LIBRARY:-}" ]; then
  wheel=$(python3 -c "import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib','libnccl.so.2'))" 2>/dev/null || true)
  [ -n "$wheel" ] && [ -f "$wheel" ] && export TORCHCOMM_NCCL_LIBRARY=$wheel
fi
echo "gpu-bench: NCCL: ${TORCHCOMM_NCCL_LIBRARY:-default search (libnccl.so.2)}"
python3 -c "import importlib.metadata as m;print('gpu-bench: nvidia-nccl-cu13', m.version('nvidia-nccl-cu13'))" 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu-bench: GPU /'

mkdir -p "$SUITE/bin" "$SUITE/results"
$CC -std=c11 -O2 -Wall -Wextra "$SUITE/bench/nccl_raw.c" -o "$SUITE/bin/nccl_raw" -ldl \
  || { echo "gpu-bench: compiling nccl_raw failed"; exit 1; }
export LD_LIBRARY_PATH="$SUITE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# shellcheck disable=SC2086
python3 "$SUITE/bench/gpu_compare.py" --tc-run "$SUITE/bin/tc-run" --tc-perf "$SUITE/bin/tc-perf" \
  --raw "$SUITE/bin/nccl_raw" --torch-script "$SUITE/bench/torch_dist.py" --out "$SUITE/results" ${GPU_BENCH_ARGS:-} \
  2>&1 | tee "$SUITE/results/gpu_bench.txt"
rc=${PIPESTATUS[0]}
echo "gpu-bench: exit $rc; output also in $SUITE/results/gpu_bench.txt"
exit "$rc"
