#!/usr/bin/env bash
# `make sim-gpu-test`: the GPU suite on a SIMULATED CUDA driver and NCCL
# (test doubles written for this project, tests/sim_gpu/fake_*.c), on a
# machine without a GPU. It runs our GPU code paths (src/cuda/, the nccl
# backend, CUDA staging on gloo) against strict models of the driver and of
# NCCL (one rank, or 2 and 4 ranks as separate processes exchanging messages
# through files): API misuse, stream ordering, capture rules, asynchronous
# completion, the multi-rank compositions of the nccl backend (grouped
# fallbacks, roots, split, timeout/abort) and buffer overlaps NCCL leaves
# undefined show up here. It is NOT a GPU verification: kernels, real NCCL
# (its algorithms, transports and timing) and performance are only tested by
# `make gpu-test` on a GPU machine.
#
# `run-sim.sh NAME...` (test names as gpu-suite/run.sh takes them, e.g.
# ops2 ops4) does step 1 and rehearses only those tests.
#
#   1. builds target/sim_gpu/libcuda.so.1 (+ libcuda.so) and libnccl.so.2
#      (NCCL 2.29.7, with the host RMA calls windows use), nccl-2.28/libnccl.so.2
#      (2.28.9, the wheel's version: no ncclPutSignal) and
#      nccl-2.18/libnccl.so.2 (an NCCL 2.18.5 without the newer optional symbols);
#   2. rehearses the GPU suite exactly as the GPU machine runs it: the folder
#      `make gpu-suite` makes (capi_tests/gpu/make-gpu-suite.sh, into
#      target/sim_gpu/rehearsal/gpu-suite), then `bash run.sh`,
#      `bash run.sh part2` and `bash run.sh part3` from it, as three commands, with no cargo on PATH;
#      only the driver (libcuda.so.1 on LD_LIBRARY_PATH), cuda.h and NCCL are
#      the simulated ones, and time limits are scaled (TC_GPU_TIME_SCALE=4)
#      for this slower machine; then once more with an nvidia-smi that
#      reports an exclusive compute mode (multi-rank runs must be skipped);
#   3. checks src/cuda/kernels.ptx with NVIDIA's ptxas (scripts/check-ptx.sh,
#      SKIPPED with the reason when the PyPI wheel cannot be had), then
#      runs what only a simulation can: ops (1 and 2 ranks) and mem on the
#      NCCL 2.18 double (grouped send/recv instead of ncclAlltoAll),
#      mem with a stub libcuda.so ahead of the driver on the loader's path,
#      the C++ wrapper tc::Local (tests/cpp/test_cpp_local.cpp, 3 devices),
#      a one-rank timeout/abort test over a simulated hung collective, a
#      two-rank test where one process dies (test_sim_peer_exit.c), a
#      two-rank refusal whose peer's timeout names it (test_sim_refusal.c), a
#      checked tc-perf -B nccl pass on 1, 2 and 4 ranks (with and without
#      graph replay), and the
#      Rust unit tests of src/cuda/ and staging that need a driver (cargo
#      builds the test binary if `make cargo-test` has not), and the nccl
#      programs under valgrind.
# Every work item on a simulated stream takes TC_SIM_DELAY_US (default 50 us)
# so that completion is really asynchronous.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-cc}
SIM=$ROOT/target/sim_gpu
REL=$ROOT/target/release
mkdir -p "$SIM/nccl-2.18" "$SIM/nccl-2.28" "$SIM/cuda/include" "$SIM/cuda/lib64"

# The output is long and CI keeps only its tail: run once more under tee and,
# on failure, repeat every failing line last so the tail names them.
if [ -z "${TC_SIM_LOGGED:-}" ]; then
  log=$SIM/run-sim.log
  TC_SIM_LOGGED=1 bash "$0" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "sim-gpu-test: the failing lines again (whole output: $log):"
    grep -E '(^|[^0-9])[1-9][0-9]* failed|FAIL|failed \(exit|: failed|compiling .* failed' "$log" \
      | grep -v 'SIMULATION total' | head -n 40 | sed 's/^/sim-gpu-test:   /'
  fi
  exit "$rc"
fi

echo "sim-gpu-test: ================================================================"
echo "sim-gpu-test: SIMULATION, not GPU verification: a simulated CUDA driver and a"
echo "sim-gpu-test: simulated NCCL, 1 to 4 ranks as processes (test doubles in tests/sim_gpu/)"
echo "sim-gpu-test: ================================================================"

CFLAGS="-std=c11 -O1 -g -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden -I$ROOT/tests/sim_gpu"
set -e
$CC $CFLAGS "$ROOT/tests/sim_gpu/fake_cuda.c" "$ROOT/tests/sim_gpu/fake_cuda_kernels.c" -o "$SIM/libcuda.so.1" \
  -Wl,-soname,libcuda.so.1 -lpthread -lm
# A link, not a copy: a process that opens both names must get one driver.
ln -sf libcuda.so.1 "$SIM/libcuda.so"
# The toolkit's link-time stub, to be put before the driver on the path.
mkdir -p "$SIM/stub"
$CC $CFLAGS -DSIM_STUB "$ROOT/tests/sim_gpu/fake_cuda.c" "$ROOT/tests/sim_gpu/fake_cuda_kernels.c" \
  -o "$SIM/stub/libcuda.so" -Wl,-soname,libcuda.so.1 -lpthread -lm
# (No $ORIGIN rpath: libcuda.so.1 comes from LD_LIBRARY_PATH, and
# valgrind's checks trip over glibc's $ORIGIN expansion.)
$CC $CFLAGS "$ROOT/tests/sim_gpu/fake_nccl.c" -o "$SIM/libnccl.so.2" -Wl,-soname,libnccl.so.2 \
  -L"$SIM" -lcuda -lpthread -lm
$CC $CFLAGS -DSIM_NCCL_VERSION=22809 "$ROOT/tests/sim_gpu/fake_nccl.c" -o "$SIM/nccl-2.28/libnccl.so.2" \
  -Wl,-soname,libnccl.so.2 -L"$SIM" -lcuda -lpthread -lm
$CC $CFLAGS -DSIM_NCCL_VERSION=21805 "$ROOT/tests/sim_gpu/fake_nccl.c" -o "$SIM/nccl-2.18/libnccl.so.2" \
  -Wl,-soname,libnccl.so.2 -L"$SIM" -lcuda -lpthread -lm
# CUDA_HOME for the suite script: our cuda.h and the simulated libcuda.
cp "$ROOT/tests/sim_gpu/cuda.h" "$SIM/cuda/include/cuda.h"
ln -sf ../../libcuda.so.1 "$SIM/cuda/lib64/libcuda.so"
# The suite folder, gathered as `make gpu-suite` does.
RH=$SIM/rehearsal/gpu-suite
mkdir -p "$SIM/rehearsal"
bash "$ROOT/capi_tests/gpu/make-gpu-suite.sh" "$RH" "$REL"
set +e

export LD_LIBRARY_PATH="$SIM${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TC_SIM_DELAY_US=${TC_SIM_DELAY_US:-50}
export TORCHCOMM_ABORT_ON_ERROR=0
# The simulated NCCL's job directories (one per multi-rank comm; removed by
# the comms, and here in case a crashed run left one).
export TC_SIM_NCCL_DIR=$SIM/nccl-jobs
rm -rf "$TC_SIM_NCCL_DIR" && mkdir -p "$TC_SIM_NCCL_DIR"
status=0

# PATH without cargo, as on the GPU machine.
nocargo_path=$(echo "$PATH" | tr ':' '\n' | while read -r d; do [ -n "$d" ] && [ ! -x "$d/cargo" ] && echo "$d"; done | paste -sd:)
rehearse() { # label, then run.sh's arguments; adds to pass/fail/skipped
  local label=$1 o rc line
  shift
  o=$(env -u CARGO PATH="$nocargo_path" TC_GPU_SIMULATION=1 TC_GPU_NCCL_MAX_RANKS=4 TC_GPU_TORCH=0 TC_GPU_TIME_SCALE=4 \
      TC_GPU_DEAD_PEER_REMOTE=1 CUDA_HOME="$SIM/cuda" TORCHCOMM_NCCL_LIBRARY="$SIM/libnccl.so.2" CC=$CC \
      bash "$RH/run.sh" "$@" 2>&1); rc=$?
  echo "$o" | sed -n '/^== summary/,$p' | sed "s/^/sim-gpu-test: [$label] /"
  [ "$rc" = 0 ] || { echo "$o" | tail -n 60; status=1; }
  line=$(echo "$o" | grep '^gpu-test: [0-9]* test(s):' | tail -n 1)
  local tf ts cp cf
  tf=$(echo "$line" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped.*/\2/p')
  ts=$(echo "$line" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped.*/\3/p')
  cp=$(echo "$line" | sed -n 's/.*checks: \([0-9]*\) passed, \([0-9]*\) failed.*/\1/p')
  cf=$(echo "$line" | sed -n 's/.*checks: \([0-9]*\) passed, \([0-9]*\) failed.*/\2/p')
  # checks are counted, as everywhere below; a failed run counts once more
  pass=$((pass + ${cp:-0})) fail=$((fail + ${cf:-0} + ${tf:-1})) skipped=$((skipped + ${ts:-0}))
  REHEARSAL_OUT=$o
}
pass=0 fail=0 skipped=0
# Named tests only (as gpu-suite/run.sh takes them, e.g. `run-sim.sh ops2
# ops4`): those, rehearsed as above, and nothing else.
if [ $# -gt 0 ]; then
  echo "sim-gpu-test: == rehearsal of the named GPU-suite tests only: $*"
  rehearse named "$@"
  rm -rf "$TC_SIM_NCCL_DIR"
  echo "sim-gpu-test: SIMULATION (named tests: $*): $pass passed, $fail failed, $skipped skipped"
  [ "$status" = 0 ] && [ "$fail" = 0 ]
  exit
fi
echo "sim-gpu-test: == rehearsal of the GPU suite (gpu-suite/run.sh from the gathered folder, no cargo)"
rehearse part1
rehearse part2 part2
rehearse part3 part3
rehearse part4 part4
# An exclusive compute mode: the multi-rank runs are skipped, with the reason.
mkdir -p "$SIM/rehearsal/smi"
printf '#!/bin/sh\ncase "$1" in -q) printf "    Compute Mode                          : Exclusive_Process\\n" ;; esac\n' > "$SIM/rehearsal/smi/nvidia-smi"
chmod +x "$SIM/rehearsal/smi/nvidia-smi"
saved=$nocargo_path nocargo_path="$SIM/rehearsal/smi:$nocargo_path"
rehearse exclusive mem1 mem2
nocargo_path=$saved
if echo "$REHEARSAL_OUT" | grep -q "^SKIP mem2: 2 processes on one GPU, but its compute mode is Exclusive_Process" \
   && echo "$REHEARSAL_OUT" | grep -q "^PASS mem1"; then
  echo "sim-gpu-test: exclusive compute mode: multi-rank runs skipped with the reason: 1 passed, 0 failed"; pass=$((pass + 1))
else
  echo "sim-gpu-test: exclusive compute mode: the multi-rank run was not skipped as it should be"; fail=$((fail + 1)); status=1
fi

# Runs one extra program under tc-run -n ${RANKS:-1}; counts its "N passed, M failed".
extra() { # name program... (environment set by the caller)
  local name=$1 o rc line p f
  shift
  o=$(timeout 120 "$REL/tc-run" -n "${RANKS:-1}" -- "$@" 2>&1); rc=$?
  line=$(echo "$o" | grep -E '^(\[[^]]*\] *)?[0-9]+ passed, [0-9]+ failed' | tail -n 1 | sed 's/^\[[^]]*\] *//')
  p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed.*/\1/p')
  f=$(echo "$line" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed.*/\2/p')
  echo "sim-gpu-test: $name: ${line:-no result line} (exit $rc)"
  if [ "$rc" != 0 ] || [ -z "$line" ]; then echo "$o" | tail -n 30; status=1; f=${f:-1}; fi
  pass=$((pass + ${p:-0})) fail=$((fail + ${f:-0}))
}

# The library's hand-written PTX through NVIDIA's ptxas (a PyPI wheel, no
# GPU needed): SKIPPED with the reason when ptxas cannot be had.
o=$(bash "$ROOT/scripts/check-ptx.sh" 2>&1); rc=$?
echo "$o" | sed 's/^/sim-gpu-test: /'
if echo "$o" | grep -q "^check-ptx: SKIPPED"; then
  skipped=$((skipped + 1))
else
  line=$(echo "$o" | grep -E '^check-ptx: [0-9]+ passed, [0-9]+ failed' | tail -n 1)
  p=$(echo "$line" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed.*/\1/p')
  f=$(echo "$line" | sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed.*/\2/p')
  [ "$rc" = 0 ] && [ -n "$line" ] || { status=1; f=${f:-1}; }
  pass=$((pass + ${p:-0})) fail=$((fail + ${f:-0}))
fi

echo "sim-gpu-test: == simulation-only runs"
B=$RH/bin
TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.18/libnccl.so.2 TC_GPU_MODES=1 extra "ops on NCCL 2.18 (no ncclAlltoAll, fp8, registration, ncclMemAlloc)" "$B/test_gpu_ops"
for n in 2 3 4; do TC_SIM_DEVICES=$n TORCHCOMM_DEBUG=INFO TC_LOCAL_NCCL=1 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "tc_local device group, $n devices in one process" "$B/test_gpu_local"; done
TC_SIM_DEVICES=3 TORCHCOMM_DEBUG=INFO TC_LOCAL_NCCL=0 TORCHCOMM_NCCL_LIBRARY=$SIM/absent/libnccl.so.2 extra "tc_local device group, 3 devices, NCCL absent (copies path)" "$B/test_gpu_local"
# The C++ wrapper of the same calls (tc::Local in include/torchcomm.hpp).
${CXX:-c++} -std=c++17 -O1 -g -Wall -Wextra -Werror -pedantic -I"$ROOT/include" -I"$SIM/cuda/include" "$ROOT/tests/cpp/test_cpp_local.cpp" \
  -o "$B/test_cpp_local" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda \
  || { echo "sim-gpu-test: compiling tests/cpp/test_cpp_local.cpp failed"; status=1; }
TC_SIM_DEVICES=3 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "tc::Local (C++ wrapper of tc_local_*), 3 devices in one process" "$B/test_cpp_local"
RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.18/libnccl.so.2 TC_GPU_MODES=1 extra "ops on NCCL 2.18, 2 ranks (all-to-all as grouped send/recv)" "$B/test_gpu_ops"
TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.18/libnccl.so.2 extra "mem on NCCL 2.18 (cuMemAlloc fallback, registration unsupported)" "$B/test_gpu_mem"
LD_LIBRARY_PATH="$SIM/stub:$LD_LIBRARY_PATH" TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 \
  extra "mem with a stub libcuda.so (lib64/stubs) ahead of the driver on LD_LIBRARY_PATH" "$B/test_gpu_mem"
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/tests/sim_gpu/test_sim_timeout.c" -o "$B/test_sim_timeout" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm \
  || { echo "sim-gpu-test: compiling test_sim_timeout failed"; status=1; }
TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 TC_SIM_NCCL_HANG_CALL=2,3 extra "timeout/abort at one rank (simulated hung collective)" "$B/test_sim_timeout"
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" "$ROOT/tests/sim_gpu/test_sim_sparse.c" -o "$B/test_sim_sparse" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm && TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "sparse all-reduce with CUDA memory: gloo staging, nccl, result placement" "$B/test_sim_sparse" || { echo "sim-gpu-test: test_sim_sparse failed"; status=1; }
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/tests/sim_gpu/test_sim_peer_exit.c" -o "$B/test_sim_peer_exit" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm \
  || { echo "sim-gpu-test: compiling test_sim_peer_exit failed"; status=1; }
RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "a peer process that dies, 2 ranks (TC_ERR_REMOTE, not a hang)" "$B/test_sim_peer_exit"
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/tests/sim_gpu/test_sim_refusal.c" -o "$B/test_sim_refusal" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm \
  || { echo "sim-gpu-test: compiling test_sim_refusal failed"; status=1; }
RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "a collective refused on one rank, 2 ranks (the peer's timeout names it)" "$B/test_sim_refusal"
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/tests/sim_gpu/test_sim_nan_check.c" -o "$B/test_sim_nan_check" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm \
  || { echo "sim-gpu-test: compiling test_sim_nan_check failed"; status=1; }
for n in 2 3; do RANKS=$n TORCHCOMM_NAN_CHECK=1 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "TORCHCOMM_NAN_CHECK with CUDA memory (nccl, gloo staging), $n ranks" "$B/test_sim_nan_check"; done
RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.18/libnccl.so.2 extra "tc_comm_shrink on NCCL 2.18 (TC_ERR_UNSUPPORTED)" "$B/test_gpu_shrink" old
# A rank dying mid all_reduce: the failure revokes the NCCL comm (ncclCommRevoke, 2.28+) so the
# survivors can shrink it; an NCCL 2.27 double (ncclCommShrink, no ncclCommRevoke) refuses, saying why.
mkdir -p "$SIM/nccl-2.27"
$CC $CFLAGS -DSIM_NCCL_VERSION=22703 "$ROOT/tests/sim_gpu/fake_nccl.c" -o "$SIM/nccl-2.27/libnccl.so.2" \
  -Wl,-soname,libnccl.so.2 -L"$SIM" -lcuda -lpthread -lm || { echo "sim-gpu-test: compiling the NCCL 2.27 double failed"; status=1; }
RANKS=4 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "tc_comm_shrink after a rank died mid all_reduce, 4 ranks (ncclCommRevoke)" "$B/test_gpu_shrink" failure
RANKS=4 TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.27/libnccl.so.2 extra "tc_comm_shrink after a failure on NCCL 2.27 (no ncclCommRevoke: TC_ERR_UNSUPPORTED)" "$B/test_gpu_shrink" failure-norevoke
# Reconfigure forms a fresh NCCL comm each time, so an NCCL without ncclCommShrink can (the suite's run is on 2.29).
RANKS=3 TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.18/libnccl.so.2 extra "tc_comm_reconfigure on NCCL 2.18 (form, shrink, grow, re-form after a death), 3 ranks" "$B/test_gpu_reconfigure"
# Two comms on one device in opposite orders on two ranks: a deadlock (a
# device runs one NCCL kernel at a time), ended by the library's timeout.
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/tests/sim_gpu/test_sim_kernel_order.c" -o "$B/test_sim_kernel_order" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm \
  || { echo "sim-gpu-test: compiling test_sim_kernel_order failed"; status=1; }
RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "two comms in opposite orders on one device, 2 ranks (deadlock ended by the timeout)" "$B/test_sim_kernel_order"
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/tests/sim_gpu/test_sim_window.c" -o "$B/test_sim_window" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm \
  || { echo "sim-gpu-test: compiling test_sim_window failed"; status=1; }
TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.28/libnccl.so.2 TC_SIM_EXPECT_NCCL=2.28.9 extra "windows on nccl 2.28.9: TC_ERR_UNSUPPORTED naming the version" "$B/test_sim_window"
TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.18/libnccl.so.2 TC_SIM_EXPECT_NCCL=2.18.5 extra "windows on nccl 2.18.5: TC_ERR_UNSUPPORTED naming the version" "$B/test_sim_window"
RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/nccl-2.28/libnccl.so.2 extra "GPU-suite window test on NCCL 2.28.9, 2 ranks (TC_ERR_UNSUPPORTED path)" "$B/test_gpu_window"
RANKS=3 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 extra "windows on nccl 2.29.7, 3 ranks (uneven sizes, staged and direct puts, signals)" "$B/test_gpu_window"
# The simulated driver's modules and launches on the library's PTX: what it
# refuses (not PTX, unknown kernels, parameter lists and counts that differ,
# 2-D launches, unloaded modules, memory not the device's) and IEEE results.
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/tests/sim_gpu" "$ROOT/tests/sim_gpu/test_sim_kernels.c" \
  -o "$B/test_sim_kernels" -L"$SIM" -lcuda -Wl,-rpath,"$SIM" || { echo "sim-gpu-test: compiling test_sim_kernels failed"; status=1; }
extra "PTX modules and kernel launches of the simulated driver (refusals, IEEE results)" "$B/test_sim_kernels" "$ROOT/src/cuda/kernels.ptx"
# Capture rules of the driver: fork/join legal, legacy-stream use during a
# blocking stream's capture and waits on non-captured events invalid.
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/tests/sim_gpu" "$ROOT/tests/sim_gpu/test_sim_capture.c" \
  -o "$B/test_sim_capture" -L"$SIM" -lcuda -Wl,-rpath,"$SIM" || { echo "sim-gpu-test: compiling test_sim_capture failed"; status=1; }
extra "capture rules (fork/join, legacy stream, non-captured events)" "$B/test_sim_capture"
# A non-blocking comm and its call's stream are refused until the comm
# reported success.
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/tests/sim_gpu" "$ROOT/tests/sim_gpu/test_sim_nonblocking.c" \
  -o "$B/test_sim_nonblocking" -L"$SIM" -l:libnccl.so.2 -lcuda -Wl,-rpath,"$SIM" \
  || { echo "sim-gpu-test: compiling test_sim_nonblocking failed"; status=1; }
extra "a non-blocking comm and its stream before the comm reported success" "$B/test_sim_nonblocking"
# A use of a comm after ncclCommAbort ends the process (NCCL freed it).
if $CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/tests/sim_gpu" "$ROOT/tests/sim_gpu/test_sim_use_after_abort.c" \
     -o "$B/test_sim_use_after_abort" -L"$SIM" -l:libnccl.so.2 -lcuda -Wl,-rpath,"$SIM"; then
  o=$("$B/test_sim_use_after_abort" 2>&1); rc=$?
  if [ "$rc" = 134 ] && echo "$o" | grep -q "after ncclCommAbort: a use-after-free"; then
    echo "sim-gpu-test: a use of a comm after ncclCommAbort ends the process: 1 passed, 0 failed"; pass=$((pass + 1))
  else
    echo "sim-gpu-test: a use of a comm after ncclCommAbort did not end the process (exit $rc): $o"; fail=$((fail + 1)); status=1
  fi
else
  echo "sim-gpu-test: compiling test_sim_use_after_abort failed"; fail=$((fail + 1)); status=1
fi
# Several devices in one process (TC_SIM_DEVICES): the simulation itself
# (ncclCommInitAll, grouped per-device init, device checks), then the
# library with each rank on a device of its own.
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/tests/sim_gpu" "$ROOT/tests/sim_gpu/test_sim_multi_device.c" \
  -o "$B/test_sim_multi_device" -L"$SIM" -l:libnccl.so.2 -lcuda -Wl,-rpath,"$SIM" \
  || { echo "sim-gpu-test: compiling test_sim_multi_device failed"; status=1; }
TC_SIM_DEVICES=3 extra "3 devices in one process (ncclCommInitAll, grouped per-device init, device checks)" "$B/test_sim_multi_device"
RANKS=2 TC_SIM_DEVICES=2 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 TC_GPU_MODES=1 \
  extra "ops, 2 ranks on 2 devices (TC_SIM_DEVICES=2: buffers and streams of each rank's own device)" "$B/test_gpu_ops"
$CC -std=c11 -O1 -g -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/capi_tests" -I"$ROOT/capi_tests/gpu" -I"$SIM/cuda/include" \
  "$ROOT/tests/sim_gpu/test_sim_init_hang.c" -o "$B/test_sim_init_hang" -L"$REL" -ltorchcomm -Wl,-rpath,"$REL" -L"$SIM" -lcuda -lm \
  || { echo "sim-gpu-test: compiling test_sim_init_hang failed"; status=1; }
# A rank that never arrives at creation: with abort-on-error off, a warning
# at the comm's timeout (2 s) and the error when the simulated rendezvous
# gives up (5 s); with it on, the process ends with a message soon after 2 s.
hang_warning="has not returned after the comm's timeout (2000 ms): a rank did not arrive"
o=$(RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 TC_SIM_NCCL_INIT_TIMEOUT_MS=5000 \
  timeout 60 "$REL/tc-run" -n 2 -- "$B/test_sim_init_hang" wait 2>&1); rc=$?
if [ "$rc" = 0 ] && echo "$o" | grep -q "$hang_warning; a blocking NCCL creation cannot be interrupted" \
   && echo "$o" | grep -q "2 passed, 0 failed"; then
  echo "sim-gpu-test: a rank missing at creation, abort-on-error off (warning, then the error): 1 passed, 0 failed"; pass=$((pass + 1))
else
  echo "sim-gpu-test: a rank missing at creation, abort-on-error off: failed (exit $rc)"; echo "$o" | tail -n 20; status=1; fail=$((fail + 1))
fi
# The same with the hint blocking=0: NCCL's init goes on in its own thread,
# so the creation fails at the comm's 2 s timeout.
RANKS=2 TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 TC_SIM_NCCL_INIT_TIMEOUT_MS=30000 \
  extra "a rank missing at a non-blocking creation (TC_ERR_TIMEOUT at the comm's timeout)" "$B/test_sim_init_hang" nonblocking
start=$(date +%s)
o=$(TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 TC_SIM_NCCL_INIT_TIMEOUT_MS=30000 \
  timeout 60 "$REL/tc-run" -n 2 -- "$B/test_sim_init_hang" abort 2>&1); rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" != 0 ] && [ "$took" -lt 20 ] && echo "$o" | grep -q "$hang_warning; aborting the process" \
   && ! echo "$o" | grep -q "passed, 1 failed"; then
  echo "sim-gpu-test: a rank missing at creation, abort-on-error on (process aborted in ${took} s): 1 passed, 0 failed"; pass=$((pass + 1))
else
  echo "sim-gpu-test: a rank missing at creation, abort-on-error on: failed (exit $rc after ${took} s)"; echo "$o" | tail -n 20; status=1; fail=$((fail + 1))
fi

# The nccl programs once more under valgrind (as capi-valgrind does for the
# host tests): no memory errors, no definite or indirect leaks in our GPU
# paths. Skipped without valgrind.
if command -v valgrind >/dev/null; then
  VG="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect"
  export TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2
  # shellcheck disable=SC2086
  TC_GPU_MODES=1 extra "valgrind ops" $VG "$B/test_gpu_ops"
  # shellcheck disable=SC2086
  extra "valgrind mem" $VG "$B/test_gpu_mem"
  # shellcheck disable=SC2086
  TC_SIM_NCCL_HANG_CALL=2,3 extra "valgrind timeout/abort" $VG "$B/test_sim_timeout"
  # shellcheck disable=SC2086
  RANKS=2 TC_GPU_MODES=1 extra "valgrind ops, 2 ranks" $VG "$B/test_gpu_ops"
  # shellcheck disable=SC2086
  RANKS=2 extra "valgrind timeout/abort, 2 ranks (a peer that does not join)" $VG "$B/test_gpu_timeout"
  # shellcheck disable=SC2086
  TC_SIM_DEVICES=3 extra "valgrind tc::Local (C++), 3 devices" $VG "$B/test_cpp_local"
  unset TORCHCOMM_NCCL_LIBRARY
else
  echo "sim-gpu-test: valgrind runs SKIPPED: valgrind not installed"
  skipped=$((skipped + 1))
fi

# tc-perf -B nccl with result checks: every collective (1 and 2 ranks), then
# dtypes x reduce ops and CUDA-graph replays (1, 2 and 4 ranks; at 4 ranks
# only these, to keep the run short on small machines).
perf_ok=0 perf_fail=0
runs=()
for n in 1 2; do
  for o in all_reduce all_gather reduce_scatter broadcast reduce all_to_all sendrecv gather scatter barrier; do
    runs+=("$n -o $o -a 0" "$n -o $o -a 1")
  done
done
for n in 1 2 4; do runs+=("$n -o all_reduce -d all -r all" "$n -o all_reduce -G 2" "$n -o all_gather -G 2"); done
runs+=("4 -o all_to_all -a 1" "4 -o reduce_scatter -a 1")
for args in "${runs[@]}"; do
  n=${args%% *} args=${args#* }
  # shellcheck disable=SC2086
  o=$(TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 timeout 120 "$REL/tc-run" -n "$n" -- "$REL/tc-perf" -B nccl -b 8 -e 4K -f 8 -n 2 -w 1 -c 1 $args 2>&1)
  rc=$?
  if [ "$rc" = 0 ] && ! echo "$o" | grep -q "FAILED"; then perf_ok=$((perf_ok + 1)); else
    perf_fail=$((perf_fail + 1)); status=1; echo "sim-gpu-test: tc-perf -n $n $args failed (exit $rc):"; echo "$o" | tail -n 20; fi
done
echo "sim-gpu-test: tc-perf -B nccl -c 1 (checked results, 1/2/4 ranks): $perf_ok passed, $perf_fail failed"
pass=$((pass + perf_ok)) fail=$((fail + perf_fail))

# The GPU benchmark's pipeline (bench/nccl_raw.c built with cc, tc-perf
# -B nccl, bench/gpu_compare.py's tables, CSV and plots) at tiny sizes:
# every system must run and check its results. The figures mean nothing here.
gb=$SIM/gpu-bench && rm -rf "$gb" && mkdir -p "$gb"
if $CC -std=c11 -O2 -Wall -Wextra -Werror "$ROOT/bench/nccl_raw.c" -o "$gb/nccl_raw" -ldl; then
  o=$(TORCHCOMM_NCCL_LIBRARY=$SIM/libnccl.so.2 timeout 300 python3 "$ROOT/bench/gpu_compare.py" --tc-run "$REL/tc-run" \
    --tc-perf "$REL/tc-perf" --raw "$gb/nccl_raw" --torch-script "$ROOT/bench/torch_dist.py" --out "$gb/results" --no-torch \
    -b 8 -e 64K -f 64 -n 20 -w 2 --rounds 1 --graph-iters 4 --graph-replays 2 2>&1); rc=$?
  if [ "$rc" = 0 ] && echo "$o" | grep -q "^# wrong elements: ours 0, ours_a1 0, raw 0, ours_g 0, raw_g 0" \
     && ! echo "$o" | grep -q "failed (dropped)" && [ -f "$gb/results/gpu_allreduce_summary.csv" ]; then
    echo "sim-gpu-test: gpu-bench pipeline (nccl_raw, tc-perf -B nccl, gpu_compare.py): 1 passed, 0 failed"
    pass=$((pass + 1))
  else
    echo "sim-gpu-test: gpu-bench pipeline failed (exit $rc):"; echo "$o" | tail -n 30; status=1; fail=$((fail + 1))
  fi
else
  echo "sim-gpu-test: compiling bench/nccl_raw.c failed"; status=1; fail=$((fail + 1))
fi

# The unit tests of src/cuda/ and staging that need a driver (they return
# early without one, as in `cargo test`), with slow simulated streams; and
# the reducer's PTX kernels against its host path (reducer::kernel_tests:
# every float16/bfloat16 value, float32 values at every rounding boundary),
# which on the simulated driver compares the host path with the driver's
# independent C emulation of each kernel.
o=$(TC_SIM_DELAY_US=2000 ${CARGO:-cargo} test --release --lib --quiet -- cuda::tests staging::tests reducer::kernel_tests 2>&1); rc=$?
line=$(echo "$o" | grep -E '^test result:' | tail -n 1)
p=$(echo "$line" | sed -n 's/.* \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p')
f=$(echo "$line" | sed -n 's/.* \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p')
echo "sim-gpu-test: cargo test --lib cuda:: staging:: reducer::kernel_tests on the simulated driver: ${p:-?} passed, ${f:-?} failed (exit $rc)"
if [ "$rc" != 0 ] || [ -z "$p" ]; then echo "$o" | tail -n 30; status=1; f=${f:-1}; fi
pass=$((pass + ${p:-0})) fail=$((fail + ${f:-0}))

echo "sim-gpu-test: ================================================================"
left=$(find "$TC_SIM_NCCL_DIR" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
[ "$left" = 0 ] || echo "sim-gpu-test: note: $left simulated NCCL job director(ies) left behind (removed now)"
rm -rf "$TC_SIM_NCCL_DIR"
echo "sim-gpu-test: SIMULATION total: $pass passed, $fail failed, $skipped run(s) skipped"
echo "sim-gpu-test: (simulated driver and NCCL; not GPU verification: run make gpu-test on a GPU)"
[ "$status" = 0 ] && [ "$fail" = 0 ]
