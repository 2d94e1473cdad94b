#!/usr/bin/env bash
# Two builds side by side on the gloo backend (2 ranks, one host): tc-perf
# all_reduce (float32 sum) at 4 B, 64 KiB and 1 MiB, through shared memory
# and with TORCHCOMM_GLOO_SHM=0 (Gloo over TCP), rounds interleaved (A B,
# then B A, ...): median, min and max of the per-call time. Then, with
# valgrind, callgrind's instructions per all_reduce call at 64 KiB (TC_CG_SIZE) on rank 0
# for both builds (the difference of a long and a short run, so start-up
# and set-up cancel out).
#
#   scripts/bench-before-after.sh BEFORE_DIR AFTER_DIR [ROUNDS] [ITERS]
#
# ROUNDS 0 skips the timing table. TC_CG_SIZE (default 64K, tc-perf's
# size syntax) is the callgrind table's message size. Callgrind counts include the ranks'
# busy-waiting (the shared-memory path spins before it sleeps, Gloo polls),
# which depends on timing: each count is measured TC_CG_REPEATS times
# (default 3), builds interleaved, and shown as median [min, max].
#
# Each DIR holds tc-run, tc-perf, libtorchcomm.so and libtorchcomm-gloo.so of
# one build (e.g. target/release of main built in another folder, and this
# branch's). Prints tables; the raw per-round times go to stderr.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_DIR AFTER_DIR [ROUNDS] [ITERS]" >&2
  exit 2
fi
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
rounds=${3:-7}
iters=${4:-500}
for d in "$before" "$after"; do
  for f in tc-run tc-perf libtorchcomm-gloo.so; do
    [ -e "$d/$f" ] || { echo "$d/$f is missing" >&2; exit 2; }
  done
done

# One tc-perf run of DIR with TORCHCOMM_GLOO_SHM=SHM; prints "SIZE US" for
# 4 B, 64 KiB and 1 MiB (rank 0's out-of-place time).
one_run() {
  TORCHCOMM_GLOO_SHM=$2 "$1/tc-run" -n 2 -- "$1/tc-perf" -B gloo -b 4 -e 1M -f 4 -n "$iters" \
    -w 50 -o all_reduce -d float32 -r sum -c 0 2>&1 |
    awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ && ($2 == 4 || $2 == 65536 || $2 == 1048576) {
           t = ($7 == "N/A") ? $11 : $7; print $2, t }'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
if ((rounds > 0)); then
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then order="before after"; else order="after before"; fi
  for shm in 1 0; do
    for which in $order; do
      dir=$before
      [ "$which" = after ] && dir=$after
      one_run "$dir" "$shm" | while read -r size us; do
        echo "$which $shm $size $us" | tee -a "$results" >&2
      done
    done
  done
done

python3 - "$results" "$rounds" "$iters" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
times = {}
for which, shm, size, us in rows:
    times.setdefault((shm, int(size), which), []).append(float(us))
print(f"all_reduce float32 sum, 2 ranks, gloo; {sys.argv[2]} interleaved rounds of {sys.argv[3]} calls;")
print("per-call time in us: median [min, max]")
print()
print("| path | size | before | after | after / before (medians) |")
print("|---|---|---|---|---|")
for shm in ("1", "0"):
    for size in sorted({s for h, s, _ in times if h == shm}):
        b, a = times.get((shm, size, "before"), []), times.get((shm, size, "after"), [])
        if not b or not a:
            continue
        fmt = lambda v: f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]"
        label = f"{size} B" if size < 1024 else (f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB")
        path = "shared memory" if shm == "1" else "TORCHCOMM_GLOO_SHM=0"
        print(f"| {path} | {label} | {fmt(b)} | {fmt(a)} | {statistics.median(a) / statistics.median(b):.3f} |")
PY
fi

command -v valgrind >/dev/null || { echo "SKIPPED: callgrind table (valgrind is not installed)"; exit 0; }
# Instructions of rank 0 in this library's own Rust code for N calls (the
# exclusive cost of every torchcomm:: function in tc-perf), less the
# shared-memory syncs (IntraHost::sync and wait_all spin before they sleep,
# so their count depends on timing). Gloo, libc and the copies (memcpy) are
# left out: the same code in both builds, and Gloo polls.
instructions() {
  local out
  out=$(mktemp -d)
  TORCHCOMM_GLOO_SHM=$2 TORCHCOMM_TIMEOUT=600 "$1/tc-run" -n 2 -- valgrind -q --tool=callgrind \
    --callgrind-out-file="$out/cg.%q{RANK}.%p" "$1/tc-perf" -B gloo -b "$cg_size" -e "$cg_size" -n "$3" -w 5 \
    -o all_reduce -d float32 -r sum -c 0 >/dev/null 2>&1
  callgrind_annotate --inclusive=no --threshold=100 "$out"/cg.0.* 2>/dev/null | python3 -c '
import re, sys
own = 0
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \(.*?\)\s+\S+?:(.*)\[(\S+)\]\s*$", line)
    if m and m.group(3).endswith("tc-perf") and "torchcomm::" in m.group(2) \
            and not re.search(r"IntraHost::(sync|wait_all)", m.group(2)):
        own += int(m.group(1).replace(",", ""))
print(own)'
  rm -rf "$out"
}
cg_size=${TC_CG_SIZE:-64K}
short=${TC_CG_SHORT:-20}
long=${TC_CG_LONG:-220}
repeats=${TC_CG_REPEATS:-3}
counts=$(mktemp)
for ((i = 0; i < repeats; i++)); do
  for shm in 1 0; do
    for which in before after; do
      dir=$before
      [ "$which" = after ] && dir=$after
      a=$(instructions "$dir" "$shm" "$short")
      b=$(instructions "$dir" "$shm" "$long")
      echo "$which $shm $(( (b - a) / (long - short) ))" | tee -a "$counts" >&2
    done
  done
done
echo
python3 - "$counts" "$short" "$long" "$repeats" "$cg_size" <<'PY'
import statistics, sys
per = {}
for line in open(sys.argv[1]):
    which, shm, ir = line.split()
    per.setdefault((shm, which), []).append(int(ir))
short, long, repeats, size = sys.argv[2:6]
print(f"callgrind: instructions per all_reduce call at {size} on rank 0 in the library's Rust code (shared-memory syncs left out),")
print(f"(run of {long} calls - run of {short}) / {int(long) - int(short)};")
print(f"{repeats} measurements each: median [min, max]")
print()
print("| path | before | after | after / before (medians) |")
print("|---|---|---|---|")
for shm in ("1", "0"):
    b, a = per[(shm, "before")], per[(shm, "after")]
    fmt = lambda v: f"{statistics.median(v):,} [{min(v):,}, {max(v):,}]"
    path = "shared memory" if shm == "1" else "TORCHCOMM_GLOO_SHM=0"
    print(f"| {path} | {fmt(b)} | {fmt(a)} | {statistics.median(a) / statistics.median(b):.3f} |")
PY
rm -f "$counts"
