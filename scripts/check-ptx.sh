#!/usr/bin/env bash
# Usage: scripts/check-ptx.sh
# Validates the library's hand-written PTX (src/cuda/kernels.ptx) with
# NVIDIA's ptxas (from PyPI, see scripts/ptxas-venv.sh): it must assemble
# for its own .target and for the GPUs the library runs on (sm_70 .. sm_120),
# and define exactly the kernels src/cuda/kernels.rs looks up. This proves
# the PTX is well formed and accepted by NVIDIA's assembler, not that it
# computes the right values (the simulated driver's emulation and a GPU run
# of reducer::kernel_tests do that).
# Prints "check-ptx: N passed, M failed" or one line starting with
# "check-ptx: SKIPPED" with the reason (exit 0) when ptxas cannot be had.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ptx="$root/src/cuda/kernels.ptx"
if ! ptxas=$(bash "$root/scripts/ptxas-venv.sh" 2>/tmp/check-ptx.$$); then
  echo "check-ptx: $(grep -m1 SKIPPED /tmp/check-ptx.$$ || echo 'SKIPPED: ptxas unavailable')"
  rm -f /tmp/check-ptx.$$
  exit 0
fi
rm -f /tmp/check-ptx.$$
echo "check-ptx: $("$ptxas" --version | grep -m1 release)"
pass=0 fail=0
target=$(sed -n 's/^\.target \(sm_[0-9]*\).*/\1/p' "$ptx")
for arch in $target sm_70 sm_80 sm_90 sm_100 sm_120; do
  if out=$("$ptxas" -arch="$arch" -v -o /dev/null "$ptx" 2>&1); then
    pass=$((pass + 1))
  else
    echo "check-ptx: ptxas -arch=$arch failed:"; echo "$out" | head -n 20; fail=$((fail + 1))
  fi
done
# The kernels the PTX defines (as ptxas compiles them) and those kernels.rs names.
defined=$("$ptxas" -arch="$target" -v -o /dev/null "$ptx" 2>&1 | sed -n "s/.*Compiling entry function '\([^']*\)'.*/\1/p" | sort)
wanted=$(grep -o 'c"tc_[a-z0-9_]*"' "$root/src/cuda/kernels.rs" | sed 's/^c"//; s/"$//' | sort)
if [ -n "$defined" ] && [ "$defined" = "$wanted" ]; then
  pass=$((pass + 1))
else
  echo "check-ptx: the PTX defines [$(echo $defined)], kernels.rs looks up [$(echo $wanted)]"; fail=$((fail + 1))
fi
# No local memory (a spill would hint at a mistake in these tiny kernels).
if "$ptxas" -arch=sm_90 -v -o /dev/null "$ptx" 2>&1 | grep -q "[1-9][0-9]* bytes stack frame"; then
  echo "check-ptx: a kernel uses a stack frame"; fail=$((fail + 1))
else
  pass=$((pass + 1))
fi
echo "check-ptx: $pass passed, $fail failed"
[ "$fail" = 0 ]
