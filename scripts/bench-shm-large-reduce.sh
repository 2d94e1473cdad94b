#!/usr/bin/env bash
# Work per large all_reduce on the shared-memory path, two builds side by
# side: callgrind's instructions of rank 0 per 2 MiB float32 all_reduce (the
# reducer's piece size), sum and avg, 2 ranks. Everything rank 0 executes is
# counted (the copies and the scratch zeroing in libc too) except the
# shared-memory syncs, which spin for as long as the peer takes. Each count
# is the difference of a long and a short run, divided by the extra calls,
# so start-up and set-up cancel out; measured REPEATS times, builds
# interleaved, shown as median [min, max].
#
#   scripts/bench-shm-large-reduce.sh BEFORE_DIR AFTER_DIR [REPEATS]
#
# Each DIR holds tc-run, tc-perf and the libraries of one build.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_DIR AFTER_DIR [REPEATS]" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
repeats=${3:-3}
command -v valgrind >/dev/null || { echo "SKIPPED: valgrind is not installed"; exit 0; }

ops="sum avg"
py=$("$root/scripts/torch-venv.sh") && ops="$ops premul" || echo "premul_sum row left out: no python with numpy" >&2

# instructions DIR REDOP CALLS: rank 0's instructions, less the syncs.
instructions() {
  local out
  out=$(mktemp -d)
  if [ "$2" = premul ]; then
    TORCHCOMM_TIMEOUT=600 "$py" "$root/bench/shm_premul_calls.py" "$1/libtorchcomm.so" "$3" "$out" >/dev/null 2>&1
  else
    TORCHCOMM_TIMEOUT=600 "$1/tc-run" -n 2 -- valgrind -q --tool=callgrind \
      --callgrind-out-file="$out/cg.%q{RANK}.%p" "$1/tc-perf" -B gloo -b 2M -e 2M -n "$3" -w 2 \
      -o all_reduce -d float32 -r "$2" -c 0 >/dev/null 2>&1
  fi
  callgrind_annotate --inclusive=no --threshold=100 "$out"/cg.0.* 2>/dev/null | python3 -c '
import re, sys
total = 0
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \(.*?\)\s+\S+?:(.*)\[(\S+)\]\s*$", line)
    if m and not re.search(r"IntraHost::(sync|wait_all)", m.group(2)):
        total += int(m.group(1).replace(",", ""))
print(total)'
  rm -rf "$out"
}
short=${TC_CG_SHORT:-4}
long=${TC_CG_LONG:-24}
counts=$(mktemp)
trap 'rm -f "$counts"' EXIT
for ((i = 0; i < repeats; i++)); do
  for op in $ops; do
    for which in before after; do
      dir=$before
      [ "$which" = after ] && dir=$after
      a=$(instructions "$dir" "$op" "$short")
      b=$(instructions "$dir" "$op" "$long")
      echo "$which $op $(((b - a) / (long - short)))" | tee -a "$counts" >&2
    done
  done
done
python3 - "$counts" "$short" "$long" "$repeats" <<'PY'
import statistics, sys
per = {}
for line in open(sys.argv[1]):
    which, op, ir = line.split()
    per.setdefault((op, which), []).append(int(ir))
short, long, repeats = sys.argv[2:5]
print("callgrind: instructions of rank 0 per 2 MiB float32 all_reduce, 2 ranks, shared memory (syncs left out),")
print(f"(run of {long} calls - run of {short}) / {int(long) - int(short)}; {repeats} measurements each: median [min, max]")
print()
print("| op | before | after | after / before (medians) |")
print("|---|---|---|---|")
for op in ("sum", "avg", "premul"):
    if (op, "before") not in per:
        continue
    b, a = per[(op, "before")], per[(op, "after")]
    fmt = lambda v: f"{statistics.median(v):,} [{min(v):,}, {max(v):,}]"
    print(f"| {op} | {fmt(b)} | {fmt(a)} | {statistics.median(a) / statistics.median(b):.3f} |")
PY
