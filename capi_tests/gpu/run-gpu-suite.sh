#!/usr/bin/env bash
# The GPU suite, run from the folder `make gpu-suite` gathered (copied there
# as run.sh). On the GPU machine, from the repository root:
#   bash gpu-suite/run.sh            part 1 (under 9 minutes)
#   bash gpu-suite/run.sh part2      part 2 (under 9 minutes)
#   bash gpu-suite/run.sh part3      part 3 (under 9 minutes): the composite operations
#                                    (broadcast_coalesced, reducer, sparse)
#   bash gpu-suite/run.sh part4      part 4: windows on nccl (NCCL 2.29+; older: TC_ERR_UNSUPPORTED checked) and
#                                    torchcomm.cuda_comm against torch.cuda.comm; with parts 1-3, the whole suite
#   bash gpu-suite/run.sh ops2 mem1  the named tests only;  all: every test;  list: the tests
# Needs an NVIDIA GPU and driver (libcuda.so.1, linked at run time by its
# soname: no toolkit stub folder is needed), a C compiler, cuda.h (CUDA_HOME,
# nvcc's installation or /usr/local/cuda), python3 and libnccl: the copy the
# suite carries (lib/nccl/), else TORCHCOMM_NCCL_LIBRARY, else the
# nvidia-nccl-cu13 wheel next to python3 (the one used is logged with its
# version). No cargo, no make, no network.
#
# Every test has a time limit; a part's limits add up to under 9 minutes, so
# a part fits one device command (10 minutes) whatever happens. A test that
# would end past TC_GPU_BUDGET_S (default 520) since the start is not run,
# and the command for the rest is printed. One summary line per test, then a
# final count; full logs in SUITE/results/NAME.log. Multi-rank runs share
# the one GPU between processes: they are skipped, with the reason, when
# `nvidia-smi -q` reports an exclusive compute mode.
#
# Knobs (unset on a GPU machine; `make sim-gpu-test` sets them to rehearse
# the suite on the simulated driver and NCCL):
#   TC_GPU_SIMULATION=1       say loudly that this is a simulation
#   TC_GPU_TIME_SCALE=N       multiply every time limit and the budget by N
#   TC_GPU_NCCL_MAX_RANKS=N   nccl runs needing more ranks are skipped (counted)
#   TC_GPU_TORCH=0            skip the tests that need torch (torch_smoke.py, test_cuda_comm.py)
set -u
SUITE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CC=${CC:-cc}
sim=${TC_GPU_SIMULATION:-0}
scale=${TC_GPU_TIME_SCALE:-1}
budget=$(( ${TC_GPU_BUDGET_S:-520} * scale ))
max_ranks=${TC_GPU_NCCL_MAX_RANKS:-64}
START=$(date +%s)

# name ranks limit_s part program [args]: the suite, in running order.
TESTS=(
  "ops1 1 120 1 test_gpu_ops"
  "ops2 2 150 1 test_gpu_ops"
  "mem1 1 40 1 test_gpu_mem"
  "mem2 2 60 1 test_gpu_mem"
  "timeout2 2 60 1 test_gpu_timeout"
  "dead-peer2 2 60 1 test_gpu_dead_peer"
  "local 1 30 1 test_gpu_local"
  "ops4 4 180 2 test_gpu_ops"
  "split-abort2 2 75 2 test_gpu_split_abort"
  "p2p-order2 2 60 2 test_gpu_p2p_order"
  "staging2 2 60 2 test_gpu_gloo_staging"
  "staging3 3 60 2 test_gpu_gloo_staging"
  "torch-smoke 1 60 2 torch_smoke.py"
  "coalesced1 1 30 3 test_gpu_coalesced"
  "coalesced2 2 45 3 test_gpu_coalesced"
  "coalesced4 4 60 3 test_gpu_coalesced"
  "reducer1 1 30 3 test_gpu_reducer"
  "reducer2 2 45 3 test_gpu_reducer"
  "reducer4 4 75 3 test_gpu_reducer"
  "sparse1 1 30 3 test_gpu_sparse"
  "sparse2 2 45 3 test_gpu_sparse"
  "sparse4 4 60 3 test_gpu_sparse"
  "shrink4 4 60 3 test_gpu_shrink"
  "window2 2 60 4 test_gpu_window"
  "window4 4 90 4 test_gpu_window"
  "reconfigure3 3 90 4 test_gpu_reconfigure"
  "cuda-comm 1 90 4 test_cuda_comm.py"
)

list_tests() {
  printf '%-14s %5s %8s %5s  %s\n' test ranks limit_s part program
  for t in "${TESTS[@]}"; do
    # shellcheck disable=SC2086
    set -- $t
    printf '%-14s %5s %8s %5s  %s\n' "$1" "$2" "$3" "$4" "$5"
  done
}

selected=()
sel=("$@")
[ ${#sel[@]} = 0 ] && sel=(part1)
for s in "${sel[@]}"; do
  case $s in
    list) list_tests; exit 0 ;;
    all) selected+=("${TESTS[@]}") ;;
    part1|part2|part3|part4)
      for t in "${TESTS[@]}"; do
        # shellcheck disable=SC2086
        set -- $t
        [ "part$4" = "$s" ] && selected+=("$t")
      done ;;
    *)
      found=0
      for t in "${TESTS[@]}"; do [ "${t%% *}" = "$s" ] && { selected+=("$t"); found=1; }; done
      [ "$found" = 1 ] || { echo "gpu-test: unknown test '$s' (bash $0 list)"; exit 2; } ;;
  esac
done

# ---- the machine --------------------------------------------------------
[ "$sim" = 1 ] && echo "gpu-test: SIMULATION: simulated CUDA driver and NCCL (test doubles), not a GPU verification"
cuda_home=${CUDA_HOME:-}
if [ -z "$cuda_home" ] && command -v nvcc >/dev/null; then cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
[ -z "$cuda_home" ] && [ -d /usr/local/cuda ] && cuda_home=/usr/local/cuda
if [ -z "$cuda_home" ] || [ ! -f "$cuda_home/include/cuda.h" ]; then
  echo "gpu-test: cuda.h not found (set CUDA_HOME or put nvcc on PATH)"; exit 2
fi
# The driver itself, by soname: the dynamic loader's path first, then the
# system's cache (never a toolkit's link-time stub).
cuda_dir=""
IFS=: read -r -a ld_dirs <<< "${LD_LIBRARY_PATH:-}"
for d in "${ld_dirs[@]}" $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF}' | xargs -r -n1 dirname) \
         /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib; do
  [ -n "$d" ] && [ -e "$d/libcuda.so.1" ] && { cuda_dir=$d; break; }
done
[ -n "$cuda_dir" ] || { echo "gpu-test: libcuda.so.1 (the NVIDIA driver) not found on LD_LIBRARY_PATH or in ldconfig's cache"; exit 2; }

if [ -z "${TORCHCOMM_NCCL_LIBRARY:-}" ]; then
  if [ -f "$SUITE/lib/nccl/libnccl.so.2" ]; then
    export TORCHCOMM_NCCL_LIBRARY=$SUITE/lib/nccl/libnccl.so.2
  else
    wheel=$(python3 -c "import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib','libnccl.so.2'))" 2>/dev/null || true)
    [ -n "$wheel" ] && [ -f "$wheel" ] && export TORCHCOMM_NCCL_LIBRARY=$wheel
  fi
fi
nccl_version=$(python3 - "${TORCHCOMM_NCCL_LIBRARY:-libnccl.so.2}" 2>&1 <<'PY'
import ctypes, sys
v = ctypes.c_int(0)
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
x = v.value
print("%d.%d.%d" % (x // 10000, x // 100 % 100, x % 100) if x >= 10000 else "%d.%d.%d" % (x // 1000, x // 100 % 10, x % 100))
PY
)
[ $? = 0 ] || nccl_version="unknown (ncclGetVersion failed: $(echo "$nccl_version" | tail -n 1))"
echo "gpu-test: NCCL $nccl_version from ${TORCHCOMM_NCCL_LIBRARY:-the default search (libnccl.so.2)}"
[ -f "$SUITE/NCCL" ] && echo "gpu-test: the suite's own copy of NCCL: $(cat "$SUITE/NCCL")"
echo "gpu-test: CUDA headers from $cuda_home; driver libcuda.so.1 from $cuda_dir"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu-test: GPU /'
exclusive=""
if command -v nvidia-smi >/dev/null; then
  mode=$(nvidia-smi -q 2>/dev/null | sed -n 's/^ *Compute Mode *: *//p' | head -n 1)
  echo "gpu-test: compute mode: ${mode:-unknown}"
  case $mode in *Exclusive*|*Prohibited*) exclusive=$mode ;; esac
else
  echo "gpu-test: nvidia-smi not found: compute mode not checked"
fi

# ---- build the C tests (only those selected) ----------------------------
mkdir -p "$SUITE/bin" "$SUITE/results"
export LD_LIBRARY_PATH="$SUITE/lib:$cuda_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
built=" "
for t in "${selected[@]}"; do
  # shellcheck disable=SC2086
  set -- $t
  prog=$5
  case $prog in *.py) continue ;; esac
  case $built in *" $prog "*) continue ;; esac
  $CC -std=c11 -O1 -g -Wall -Wextra -I"$SUITE/include" -I"$SUITE/tests" -I"$cuda_home/include" "$SUITE/tests/$prog.c" \
    -o "$SUITE/bin/$prog" -L"$SUITE/lib" -ltorchcomm -Wl,-rpath,"$SUITE/lib" -L"$cuda_dir" -l:libcuda.so.1 -lm -lpthread \
    || { echo "gpu-test: compiling $prog failed"; exit 1; }
  built="$built$prog "
done

# ---- run ---------------------------------------------------------------
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1} TORCHCOMM_ABORT_ON_ERROR=0
summary=() left=()
n_pass=0 n_fail=0 n_skip=0 checks_pass=0 checks_fail=0
line_for() { summary+=("$1"); echo "$1"; }
for t in "${selected[@]}"; do
  # shellcheck disable=SC2086
  set -- $t
  name=$1 ranks=$2 limit=$(( $3 * scale )) prog=$5
  elapsed=$(( $(date +%s) - START ))
  if [ $(( elapsed + limit )) -gt "$budget" ]; then
    left+=("$name"); line_for "NOT RUN $name: its ${limit} s limit would pass the ${budget} s budget (elapsed ${elapsed} s)"
    n_skip=$((n_skip + 1)); continue
  fi
  reason=""
  case $prog in test_gpu_gloo_staging) nccl=0 ;; *) nccl=1 ;; esac
  if [ "$nccl" = 1 ] && [ "$ranks" -gt "$max_ranks" ]; then reason="needs $ranks nccl ranks; this NCCL runs at most $max_ranks"; fi
  if [ "$nccl" = 0 ] && [ ! -f "$SUITE/lib/libtorchcomm-gloo.so" ]; then reason="the gloo module was not built into the suite (libgloo-dev missing on the build machine?)"; fi
  if [ "$ranks" -gt 1 ] && [ -n "$exclusive" ]; then reason="$ranks processes on one GPU, but its compute mode is $exclusive (nvidia-smi -c DEFAULT to allow)"; fi
  case $prog in *.py)
    if [ "${TC_GPU_TORCH:-1}" = 0 ]; then reason="TC_GPU_TORCH=0"
    elif ! python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then reason="torch with CUDA not importable"; fi ;;
  esac
  if [ -n "$reason" ]; then line_for "SKIP $name: $reason"; n_skip=$((n_skip + 1)); continue; fi
  case $prog in
    torch_smoke.py) cmd=(python3 "$SUITE/tests/torch_smoke.py" "$SUITE/lib/libtorchcomm.so") ;;
    *.py) cmd=(env PYTHONPATH="$SUITE/python" TORCHCOMM_LIBRARY="$SUITE/lib/libtorchcomm.so" python3 "$SUITE/tests/$prog") ;;
    *) cmd=("$SUITE/bin/$prog") ;;
  esac
  # tc_local_*: one process, every visible device plus the CPU; its path checks read the INFO log.
  [ "$prog" = test_gpu_local ] && cmd=(env TORCHCOMM_DEBUG=INFO "${cmd[@]}")
  case $name in ops2) export TC_GPU_MODES=${TC_GPU_MODES_MULTI:-2} ;; ops4) export TC_GPU_MODES=${TC_GPU_MODES_MULTI:-1} ;; *) unset TC_GPU_MODES ;; esac
  log=$SUITE/results/$name.log
  t0=$(date +%s)
  # Each rank its own NCCL_HOSTID: NCCL then takes the processes for
  # different nodes and accepts them on one GPU (sockets over loopback).
  timeout -k 10 "$limit" "$SUITE/bin/tc-run" -n "$ranks" -- sh -c 'NCCL_HOSTID=rank$RANK exec "$0" "$@"' "${cmd[@]}" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  result=$(grep -E '^(\[[^]]*\] *)?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 | sed 's/^\[[^]]*\] *//')
  p=$(echo "$result" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed.*/\1/p')
  f=$(echo "$result" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed.*/\2/p')
  checks_pass=$((checks_pass + ${p:-0})) checks_fail=$((checks_fail + ${f:-0}))
  if [ "$rc" = 0 ] && [ -n "$result" ] && [ "${f:-1}" = 0 ]; then
    n_pass=$((n_pass + 1)); line_for "PASS $name ($ranks rank(s), ${secs} s): $result"
  else
    why="exit $rc"; [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="killed at its ${limit} s limit"
    n_fail=$((n_fail + 1)); line_for "FAIL $name ($ranks rank(s), ${secs} s, $why): ${result:-no result line}"
    grep -E 'FAIL|failed|error|panicked|\[sim-nccl\]' "$log" | grep -v ' 0 failed' | head -n 15 | sed 's/^/    /'
    echo "    (full log: $log; last lines:)"; tail -n 8 "$log" | sed 's/^/    /'
  fi
done
echo "== summary"
printf '%s\n' "${summary[@]}"
echo "gpu-test: ${#selected[@]} test(s): $n_pass passed, $n_fail failed, $n_skip skipped or not run; checks: $checks_pass passed, $checks_fail failed; $(( $(date +%s) - START )) s"
[ ${#left[@]} = 0 ] || echo "gpu-test: not run for lack of time; next: bash $0 ${left[*]}"
case " ${sel[*]} " in *" part1 "*) echo "gpu-test: the rest of the suite: bash $0 part2; bash $0 part3; bash $0 part4" ;; esac
[ "$sim" = 1 ] && echo "gpu-test: (SIMULATION: these results say nothing about real GPUs)"
[ "$n_fail" = 0 ]
