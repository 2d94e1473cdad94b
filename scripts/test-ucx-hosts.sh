#!/usr/bin/env bash
# UCX as the host transport across hosts made of network namespaces, as
# scripts/test-hier-hosts.sh makes them: each host a namespace with its own
# address (10.78.0.<h+1>) on a bridge (in a namespace of its own, so nothing
# outside is touched) and its own hostname (a UTS namespace per host). Runs
# tools/examples/ucx_hosts.rs once per rank with TORCHCOMM_HOST_TRANSPORT=ucx and
# UCX_TLS=tcp,self (UCX must not reach across "hosts" through shared
# memory, which network namespaces do not separate), in four layouts: 2x1,
# 4x1, 2x2 (ranks 0,1 | 2,3: the hierarchy, UCX between its leaders) and 3
# hosts of 2, 2 and 1 ranks, interleaved (ranks 0,3 | 1,4 | 2). Each checks,
# on a flat and a hierarchical UCX comm, every operation x dtype x reduce
# op (integers bit for bit against the Gloo path, floats against a
# reference) and that the data crossed the hosts' links; then a rank killed
# mid-all_reduce must fail every survivor within 5 s (timeout 20 s), named,
# on 4x1 and 3 hosts; then windows over UCX on 2x2 and 3 hosts (every
# pair's puts, signals and gets, byte by byte, across the links); then UCX
# hidden from the loader must give the Gloo path with an INFO line saying so;
# then, where the kernel offers Soft-RoCE (rdma_rxe), 2x1 over RC verbs (else
# a SKIPPED line with the reason).
# Needs root (ip netns) and libucp.so.0; otherwise prints a SKIPPED line and
# exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
skip() { echo "test-ucx-hosts: SKIPPED (UCX between hosts over network namespaces): $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "not root (ip netns needs it)"
command -v ip >/dev/null || skip "the ip command (iproute2) is missing"
command -v unshare >/dev/null || skip "unshare (util-linux) is missing"
ldconfig -p 2>/dev/null | grep -q 'libucp\.so\.0 ' || skip "libucp.so.0 is not installed (make deps installs libucx0)"
[ "${TC_BUILT:-}" = 1 ] || scripts/build.sh || { echo "test-ucx-hosts: FAILED to build"; exit 1; }
prog="$root/target/release/examples/ucx_hosts"
source scripts/netns.sh
hostns="tcu$$-"
netns_hosts "tcusw$$" "$hostns" 4 10.78.0. || skip "$netns_why"
out="$root/build/ucx-hosts"
mkdir -p "$out"
rc=0 skipped=0

# run_layout NAME MODE "ranks of host 0" "ranks of host 1" ...: rank 0 must
# be on host 0 (it hosts the store at 10.78.0.1). Extra environment for
# every rank: $TC_EXTRA (VAR=value words).
run_layout() {
  local name="$1" mode="$2"; shift 2
  # TC_UCX_HOSTS_ONLY (a regular expression): only the runs it names.
  [[ "$name" =~ ${TC_UCX_HOSTS_ONLY:-.} ]] || { skipped=1; return; }
  local size=0 h=0 port=$((28900 + RANDOM % 1000)) pids=() t0=$SECONDS
  for ranks in "$@"; do size=$((size + $(echo "$ranks" | wc -w))); done
  rm -f "$out/$name".*.log
  for ranks in "$@"; do
    ip netns exec "$hostns$h" unshare --uts sh -c '
      hostname "$1"; shift
      h="$1" iface="$2" size="$3" port="$4" prog="$5" log="$6" mode="$7" extra="$8"; shift 8
      fail=0; pids=""
      for r in "$@"; do
        env RANK="$r" WORLD_SIZE="$size" MASTER_ADDR=10.78.0.1 MASTER_PORT="$port" \
          TC_HOST="$h" TC_IFACE="$iface" TC_UCX_MODE="$mode" GLOO_SOCKET_IFNAME="$iface" \
          TORCHCOMM_HOST_TRANSPORT=ucx UCX_TLS=tcp,self UCX_NET_DEVICES="$iface" \
          TORCHCOMM_DEBUG=INFO $extra sh -c '"'"'"$0" >"$1" 2>&1; rc=$?; echo "exit status $rc" >>"$1"; exit $rc'"'"' "$prog" "$log.$r.log" &
        pids="$pids $!"
      done
      for p in $pids; do wait "$p" || fail=1; done
      exit $fail' sh "tcuhost$h" "$h" "$netns_iface" "$size" "$port" "$prog" "$out/$name" "$mode" "${TC_EXTRA:-}" $ranks &
    pids+=($!)
    h=$((h + 1))
  done
  local bad=0
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  echo "--- $name ($mode): $# hosts, $size ranks, $((SECONDS - t0)) s"
  grep -h "^rank 0:" "$out/$name.0.log" | sed 's/^/    /' || true
  grep -h "between hosts\|FAULT" "$out/$name".*.log | sed 's/^[^[]*\[torchcomm\] INFO //; s/^rank [0-9]*: //' |
    sed 's/ after [0-9.]* s:/ after (time):/' | sort | uniq -c | sed 's/^/    /' || true
  if [ "$mode" = fault ]; then
    # The victim dies by SIGKILL: its own line says "Killed" or nothing;
    # every other rank must have exited 0 with its FAULT line (the exit
    # status of the victim's host is not 0 then).
    local victim=$((size - 1)) r
    bad=0
    for r in $(seq 0 $((victim - 1))); do
      grep -q "^exit status 0" "$out/$name.$r.log" || bad=1
      grep -h "FAULT seen" "$out/$name.$r.log" | sed 's/^/    /'
    done
    grep -q "^exit status 0" "$out/$name.$victim.log" && { echo "    rank $victim was not killed"; bad=1; }
  fi
  if [ "$bad" != 0 ]; then
    echo "test-ucx-hosts: FAILED ($name, $mode); logs in $out:"
    grep -h "panicked\|CHECK FAIL\|error\|exit status" "$out/$name".*.log | head -20
    rc=1
  fi
}

# expect NAME PATTERN WHAT: every log of run NAME has a line matching PATTERN.
expect() {
  local f
  [[ "$1" =~ ${TC_UCX_HOSTS_ONLY:-.} ]] || return 0
  for f in "$out/$1".*.log; do
    grep -q "$2" "$f" || { echo "test-ucx-hosts: FAILED ($1): $(basename "$f") lacks $3"; rc=1; }
  done
}

run_layout two-by-one ops "0" "1"
run_layout four-by-one ops "0" "1" "2" "3"
run_layout two-by-two ops "0 1" "2 3"
run_layout three-uneven ops "0 3" "1 4" "2"
# UCX carried the flat comm and, on the leaders, the hierarchy's leaders'
# step (each leader logs its sub-comm's transport).
for l in two-by-one four-by-one two-by-two three-uneven; do
  expect "$l" "'ucxflat' rank .*UCX 1\..* between hosts" "the INFO line of UCX on the flat comm"
done
[ -n "${TC_UCX_HOSTS_ONLY:-}" ] ||
  for f in "$out"/two-by-two.0.log "$out"/two-by-two.2.log "$out"/three-uneven.[012].log; do
  grep -q "'ucx/hier/leaders' rank .*UCX 1\..* between hosts" "$f" ||
    { echo "test-ucx-hosts: FAILED: $(basename "$f") (a leader) lacks the INFO line of UCX among the leaders"; rc=1; }
done
run_layout killed-four-by-one fault "0" "1" "2" "3"
run_layout killed-three-uneven fault "0 3" "1 4" "2"
# The same on the hierarchical comm: a member dies (its leader fails the
# local step and withdraws from the leaders' UCX step, the other leaders
# tell their members), then a leader alone on its host (the other leaders
# see it over UCX and tell their members).
TC_EXTRA="TC_UCX_FAULT_HIER=1" run_layout killed-hier-member fault "0 1" "2 3"
TC_EXTRA="TC_UCX_FAULT_HIER=1" run_layout killed-hier-leader fault "0 2" "1 3" "4"
# Windows over UCX: every pair puts, signals and gets across the hosts.
run_layout window-two-by-two window "0 1" "2 3"
run_layout window-three-uneven window "0 3" "1 4" "2"
for l in window-two-by-two window-three-uneven; do
  expect "$l" "(UCP remote memory access)" "the INFO line of a window over UCX"
  expect "$l" "WINDOW every pair right" "the window's checks"
done
TC_EXTRA="TORCHCOMM_UCX_LIBRARY=libucp-hidden-by-test.so.0" run_layout hidden hidden "0" "1"
expect hidden "the host transport ucx was asked for but UCX is unavailable.*using Gloo between hosts" \
  "the INFO line of the fallback to Gloo"
# The verbs path where the kernel offers Soft-RoCE: an rxe device on each
# host's link, UCX over RC verbs between the hosts (never run here: the
# development machine's kernel has no rdma_rxe).
verbs_why=""
if ! command -v rdma >/dev/null; then
  verbs_why="the rdma command (iproute2) is missing"
elif [ ! -d /sys/module/rdma_rxe ] && ! modprobe rdma_rxe 2>/dev/null; then
  verbs_why="this kernel ($(uname -r)) offers no Soft-RoCE: rdma_rxe is neither loaded nor loadable"
else
  for h in 0 1; do
    ip netns exec "$hostns$h" rdma link add "tcrxe$$h$h" type rxe netdev "$netns_iface" 2>/dev/null ||
      { verbs_why="rdma link add (an rxe device on host $h's link) failed"; break; }
  done
fi
if [ -n "$verbs_why" ]; then
  echo "test-ucx-hosts: verbs over Soft-RoCE: SKIPPED: $verbs_why"
else
  TC_EXTRA="UCX_TLS=rc_verbs,ud_verbs,self UCX_NET_DEVICES=all" run_layout verbs-two-by-one ops "0" "1"
  expect verbs-two-by-one "'ucxflat' rank .*UCX 1\..* between hosts" "the INFO line of UCX on the flat comm"
fi
if [ "$rc" = 0 ] && [ "$skipped" = 1 ]; then
  echo "test-ucx-hosts: the runs matching TC_UCX_HOSTS_ONLY='$TC_UCX_HOSTS_ONLY': all right"
elif [ "$rc" = 0 ]; then
  echo "test-ucx-hosts: UCX between hosts over network namespaces (2x1, 4x1, 2x2, 3 hosts of 2/2/1; flat and hierarchical; a killed rank; windows; UCX hidden): all right"
fi
exit $rc
