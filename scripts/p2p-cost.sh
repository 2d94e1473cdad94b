#!/usr/bin/env bash
# Work per blocking 4-byte send and receive through the gloo backend's
# shared-memory point-to-point, counted by callgrind on both of 2 ranks
# (tc-osu --cost: the sends all fit the ring and the receives find every
# message there, so no call waits and the counts do not depend on timing),
# for builds side by side:
#   scripts/p2p-cost.sh [DIR ...]      (default: target/release)
# Each DIR holds tc-run, tc-osu (which links the library statically) and
# libtorchcomm-gloo.so of one build. Columns: instructions and system calls
# per call of the calling thread, less clock_gettime (a system call under
# valgrind only: natively it stays in user space). A futex wake there is a
# kernel entry on the latency path, and wakes a thread that takes a core.
# Then the same for non-blocking sends and receives in windows of 64 (tc-osu
# --cost-async, as the bandwidth test makes them), where part of the work
# may be the progress thread's: the calling thread's instructions in
# cost_isends / cost_ireceives plus, on the rank's other threads, those of
# the host executor's progress loop (taking a job, HostQueue::next, and
# running it, Shared::execute or Shared::run where execute is inlined),
# divided by N.
# Where mpicc and mpirun exist, an Open MPI row follows each table
# (bench/mpi_p2p_cost.c, btl self,vader, the same calls counted the same
# way on the calling thread; Open MPI has no progress thread here).
#
# With --ucx first, the same blocking sends and receives between hosts'
# transport instead: UCX over TCP loopback (tc-osu --host 1, shared memory
# off, UCX_TLS=tcp,self), and Open MPI through UCX (pml ucx) in its row.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "SKIPPED: valgrind is not installed" >&2; exit 0; }
ucx=0
if [ "${1:-}" = --ucx ]; then
  ucx=1
  shift
fi
[ $# -gt 0 ] || set -- target/release
osu_mode=()
[ $ucx = 1 ] && osu_mode=(--host 1) && export TORCHCOMM_GLOO_SHM=0 UCX_TLS=tcp,self
N=${TC_P2P_COST_CALLS:-2000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-24s %12s %12s %18s %18s\n' "build" "Ir per send" "Ir per recv" "syscalls per send" "syscalls per recv"
per_call() { # CALLGRIND_FILE FUNCTION -> "IR SYSCALLS" per call
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null | python3 -c '
import re, sys
n, fn = int(sys.argv[1]), sys.argv[2]
ir = calls = clock = 0
num = lambda s: 0 if s == "." else int(s.replace(",", ""))
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+|\.)(?: \([^)]*\))?\s+([\d,]+|\.)(?: \([^)]*\))?\s+\S+", line)
    if not m or "=>" in line:
        continue
    # One entry per source file of inlined code: the largest is
    # the inclusive cost of the function.
    if re.search(r":tc_osu::" + fn + r"( |$)", line) and num(m.group(1)) > ir:
        ir, calls = num(m.group(1)), num(m.group(2))
    elif ":clock_gettime" in line:
        clock = max(clock, num(m.group(2)))
print(f"{ir / n:.0f} {max(calls - clock, 0) / n:.2f}")' "$N" "$2"
}
for dir in "$@"; do
  d=$(cd "$dir" && pwd)
  name=$(basename "$(dirname "$dir/x")")
  rm -f "$out"/cg.*
  TORCHCOMM_GLOO_LIBRARY=$d/libtorchcomm-gloo.so "$d/tc-run" -n 2 -- valgrind -q --tool=callgrind \
    --collect-systime=yes --separate-threads=yes '--toggle-collect=tc_osu::cost_*' \
    --callgrind-out-file="$out/cg.%q{RANK}" "$d/tc-osu" "${osu_mode[@]}" --cost "$N" >/dev/null 2>&1
  # Thread 1 of each rank: its main thread, which makes the calls.
  read -r send_ir send_sys < <(per_call "$out/cg.0-01" cost_sends)
  read -r recv_ir recv_sys < <(per_call "$out/cg.1-01" cost_receives)
  printf '%-24s %12s %12s %18s %18s\n' "$name" "$send_ir" "$recv_ir" "$send_sys" "$recv_sys"
done
echo "($N calls of each; 2 ranks on one host, both under callgrind; sends on rank 0, receives on rank 1)"
if [ $ucx = 1 ]; then
  if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 &&
    mpicc -O2 bench/mpi_p2p_cost.c -o "$out/mpi_p2p_cost" >/dev/null 2>&1; then
    mpi=(mpirun -np 2 --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS=tcp,self)
    [ "$(id -u)" = 0 ] && mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi[@]}" --allow-run-as-root)
    rm -f "$out"/mpi.*
    if "${mpi[@]}" sh -c 'exec valgrind -q --tool=callgrind "--toggle-collect=cost_*" \
      --callgrind-out-file='"$out"'/mpi.$OMPI_COMM_WORLD_RANK "$@"' sh "$out/mpi_p2p_cost" "$N" >/dev/null 2>&1; then
      total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
      printf 'Open MPI (pml ucx, blocking): %d Ir per send, %d Ir per receive (calling thread)\n' \
        $(($(total "$out/mpi.0") / N)) $(($(total "$out/mpi.1") / N))
    else
      echo "Open MPI (pml ucx): run failed"
    fi
  else
    echo "Open MPI: mpicc/mpirun not found (make bench-deps): skipped"
  fi
  exit 0
fi
total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
printf '\n%-24s %24s %24s\n' "build" "Ir per isend (+progress)" "Ir per irecv (+progress)"
# Instructions per call of FUNCTION on thread 1 of callgrind's files
# PREFIX-NN, plus the progress loop's on the other threads.
async_per_call() { # PREFIX FUNCTION
  for f in "$1"-*; do
    echo "== $f"
    callgrind_annotate --inclusive=yes --threshold=100 "$f" 2>/dev/null
  done | python3 -c '
import re, sys
n, fn = int(sys.argv[1]), sys.argv[2]
num = lambda s: 0 if s == "." else int(s.replace(",", ""))
total, thread, best = 0, None, {}
def flush():
    global total
    if thread is None:
        return
    if thread.endswith("-01"):
        total += best.get("main", 0)
    else:
        total += best.get("next", 0) + max(best.get("execute", 0), best.get("run", 0))
for line in sys.stdin:
    if line.startswith("== "):
        flush()
        thread, best = line[3:].strip(), {}
        continue
    m = re.match(r"\s*([\d,]+)(?: \([^)]*\))?\s+\S+", line)
    if not m or "=>" in line:
        continue
    v = num(m.group(1))
    for key, pat in (("main", r":tc_osu::" + fn + r"( |$)"),
                     ("next", r":torchcomm::backends::host_executor::queue::HostQueue::next( |$)"),
                     ("execute", r":torchcomm::backends::host_executor::Shared<B>::execute( |$)"),
                     ("run", r":torchcomm::backends::host_executor::Shared<B>::run( |$)")):
        if re.search(pat, line):
            best[key] = max(best.get(key, 0), v)
flush()
print(f"{total / n:.0f}")' "$N" "$2"
}
for dir in "$@"; do
  d=$(cd "$dir" && pwd)
  name=$(basename "$(dirname "$dir/x")")
  rm -f "$out"/cg.*
  TORCHCOMM_GLOO_LIBRARY=$d/libtorchcomm-gloo.so "$d/tc-run" -n 2 -- valgrind -q --tool=callgrind \
    --separate-threads=yes --callgrind-out-file="$out/cg.%q{RANK}" "$d/tc-osu" --cost-async "$N" >/dev/null 2>&1
  printf '%-24s %24s %24s\n' "$name" "$(async_per_call "$out/cg.0" cost_isends)" "$(async_per_call "$out/cg.1" cost_ireceives)"
done
echo "($N non-blocking calls of each in windows of 64; sends on rank 0, receives on rank 1)"
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 &&
  mpicc -O2 bench/mpi_p2p_cost.c -o "$out/mpi_p2p_cost" >/dev/null 2>&1; then
  mpi=(mpirun --oversubscribe -np 2 --mca btl self,vader)
  [ "$(id -u)" = 0 ] && mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${mpi[@]}" --allow-run-as-root)
  for mode in blocking async; do
    rm -f "$out"/mpi.*
    "${mpi[@]}" sh -c 'exec valgrind -q --tool=callgrind "--toggle-collect=cost_*" \
      --callgrind-out-file='"$out"'/mpi.$OMPI_COMM_WORLD_RANK "$@"' sh "$out/mpi_p2p_cost" "$N" \
      $([ $mode = async ] && echo async) >/dev/null 2>&1 || { echo "Open MPI ($mode): run failed"; continue; }
    s=$(total "$out/mpi.0")
    r=$(total "$out/mpi.1")
    printf 'Open MPI (%s): %d Ir per send, %d Ir per receive (calling thread)\n' "$mode" $((s / N)) $((r / N))
  done
  echo "(Open MPI's sends poll while its shared-memory buffers to the peer are full, until the peer, at the barrier, drains them: their count can include that wait; the lowest of several runs is the work)"
else
  echo "Open MPI: mpicc/mpirun not found (make bench-deps): skipped"
fi
