#!/usr/bin/env bash
# Instructions per blocking 4-byte send and receive through the gloo
# backend's shared-memory point-to-point, counted by callgrind on both of
# 2 ranks (tc-osu --cost: the sends all fit the ring and the receives find
# every message there, so no call waits and the counts do not depend on
# timing), for builds side by side:
#   scripts/p2p-cost.sh [DIR ...]      (default: target/release)
# Each DIR holds tc-run and tc-osu of one build (tc-osu links the library
# statically; libtorchcomm-gloo.so is loaded from DIR). Also counts the
# system calls per send and receive (strace -f -c, where strace exists):
# each one is a kernel entry that a one-way latency pays.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "SKIPPED: valgrind is not installed" >&2; exit 0; }
[ $# -gt 0 ] || set -- target/release
N=${TC_P2P_COST_CALLS:-2000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-24s %14s %14s %16s\n' "build" "Ir per send" "Ir per recv" "syscalls per op"
for dir in "$@"; do
  d=$(cd "$dir" && pwd)
  name=$(basename "$(dirname "$dir/x")")
  rm -f "$out"/cg.*
  TORCHCOMM_GLOO_LIBRARY=$d/libtorchcomm-gloo.so "$d/tc-run" -n 2 -- valgrind -q --tool=callgrind \
    --callgrind-out-file="$out/cg.%q{RANK}" "$d/tc-osu" --cost "$N" >/dev/null
  ir() { # RANKFILE FUNCTION
    callgrind_annotate --inclusive=yes "$1" | awk -v f="$2" -v n="$N" \
      '$0 ~ "tc_osu::" f "[ \\[]|tc_osu::" f "$" {gsub(",", "", $1); if ($1 > t) t = $1}
       END {if (t) printf "%.0f", t / n; else print "-"}'
  }
  sys="-"
  if command -v strace >/dev/null; then
    # Two runs, N and 2N calls: the difference is N sends + N receives.
    count() {
      TORCHCOMM_GLOO_LIBRARY=$d/libtorchcomm-gloo.so "$d/tc-run" -n 2 -- sh -c \
        'exec strace -f -c -o "$0.$RANK" "$1" --cost "$2"' "$out/st.$1" "$d/tc-osu" "$1" >/dev/null 2>&1 || true
      cat "$out"/st."$1".* 2>/dev/null | awk '$NF == "total" {t += $(NF-1)} END {print t + 0}'
    }
    a=$(count "$N")
    b=$(count $((2 * N)))
    sys=$(awk -v a="$a" -v b="$b" -v n="$N" 'BEGIN {printf "%.2f", (b - a) / (2 * n)}')
  fi
  printf '%-24s %14s %14s %16s\n' "$name" "$(ir "$out/cg.0" cost_sends)" "$(ir "$out/cg.1" cost_receives)" "$sys"
done
echo "($N calls of each; 2 ranks, one host; all threads of each rank; syscalls: all threads of both ranks)"
