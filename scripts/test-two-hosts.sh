#!/usr/bin/env bash
# Two hosts made of network namespaces joined by a veth pair (10.77.0.1 and
# 10.77.0.2, nothing else reachable): torchrun --nnodes 2 with the c10d
# rendezvous on host A starts 2 ranks on each host running
# examples/python/train.py (the torchcomm package; gloo over the veth link,
# GLOO_SOCKET_IFNAME). Needs root (ip netns) and torch from
# scripts/torch-venv.sh; otherwise prints a SKIPPED line and exits 0.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
skip() { echo "test-two-hosts: SKIPPED (torchrun --nnodes 2 over network namespaces): $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "not root (ip netns needs it)"
command -v ip >/dev/null || skip "the ip command (iproute2) is missing"
py="$(bash scripts/torch-venv.sh 2>/tmp/torchcomm-venv.$$)" || skip "$(grep -m1 SKIPPED /tmp/torchcomm-venv.$$)"
rm -f /tmp/torchcomm-venv.$$
torchrun="$(dirname "$py")/torchrun"
id=$$
a="tcA$id" b="tcB$id"
cleanup() { ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null; }
trap cleanup EXIT
ip netns add "$a" && ip netns add "$b" || skip "cannot create network namespaces here"
ip link add "va$id" type veth peer name "vb$id" || skip "cannot create a veth pair here"
ip link set "va$id" netns "$a" && ip link set "vb$id" netns "$b"
ip -n "$a" addr add 10.77.0.1/24 dev "va$id" && ip -n "$b" addr add 10.77.0.2/24 dev "vb$id"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va$id" up && ip -n "$b" link set "vb$id" up
set -e
export TORCHCOMM_LIBRARY="$root/target/release/libtorchcomm.so" PYTHONPATH="$root/python"
port=29777
# Each host also gets its own hostname (UTS namespace) and an /etc/hosts
# naming both (a private bind mount), as real hosts have: torchrun hands the
# workers the master agent's hostname. is_host: the rendezvous endpoint is an
# address, which torch cannot match to a host by itself here.
hosts="$root/build/two-hosts/hosts"
mkdir -p "$(dirname "$hosts")"
printf '127.0.0.1 localhost\n10.77.0.1 tchost-a\n10.77.0.2 tchost-b\n' >"$hosts"
run_host() { # namespace, hostname, interface, is_host, output file
  ip netns exec "$1" unshare --uts --mount sh -c \
    'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' "$hosts" "$2" \
    env GLOO_SOCKET_IFNAME="$3" TORCHCOMM_TIMEOUT_SECONDS=180 "$torchrun" --nnodes 2 \
    --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 10.77.0.1:$port --rdzv-id "tc$id" \
    --rdzv-conf "is_host=$4" examples/python/train.py >"$5" 2>&1
}
out="$root/build/two-hosts"
mkdir -p "$out"
run_host "$a" tchost-a "va$id" 1 "$out/host-a.log" & pa=$!
run_host "$b" tchost-b "vb$id" 0 "$out/host-b.log" & pb=$!
rc=0
wait "$pa" || rc=1
wait "$pb" || rc=1
grep -h "^rank" "$out"/host-*.log | sort || true
# Two ranks of one host share torchrun's output, so their lines may run
# together: count each rank's verdict where it appears, not lines.
ok=$(grep -ho "rank [0-3]/4: loss [0-9.]*, weights equal on every rank: True, match one-process training: True" \
  "$out"/host-*.log | cut -d: -f1 | sort -u | wc -l)
if [ "$rc" != 0 ] || [ "$ok" != 4 ]; then
  echo "test-two-hosts: FAILED (exit $rc, $ok of 4 ranks right); logs:"; cat "$out"/host-*.log; exit 1
fi
echo "test-two-hosts: torchrun --nnodes 2 (c10d rendezvous) over two network namespaces, 4 ranks: all right"
