# Hosts made of network namespaces, for the tests and benchmarks that run
# across hosts (sourced by scripts/test-hier-hosts.sh, test-ucx-hosts.sh,
# bench-multihost.sh). Needs root and ip (iproute2).
#
# netns_hosts SWITCH PREFIX COUNT ADDR_PREFIX: COUNT hosts, namespaces
# PREFIX0.., host h at ADDR_PREFIX<h+1>/24 on its link named $netns_iface
# (the same name on every host, as eth0 would be); the links meet on a
# bridge in namespace SWITCH, so nothing outside is touched. Returns 1 with
# the reason in $netns_why when it cannot. Everything it made is removed by
# netns_cleanup, which it sets as the EXIT trap.
netns_iface=tcn0
netns_made=()
netns_why=""

netns_cleanup() {
  local ns
  for ns in "${netns_made[@]}"; do ip netns del "$ns" 2>/dev/null; done
}

netns_hosts() {
  local sw="$1" prefix="$2" count="$3" addr="$4" h ns
  # Names in the root namespace for the moment before each end moves.
  local host_end sw_end
  trap netns_cleanup EXIT
  ip netns add "$sw" 2>/dev/null || { netns_why="cannot create network namespaces here"; return 1; }
  netns_made+=("$sw")
  ip -n "$sw" link add br0 type bridge 2>/dev/null || { netns_why="cannot create a bridge here"; return 1; }
  ip -n "$sw" link set br0 up && ip -n "$sw" link set lo up
  for h in $(seq 0 $((count - 1))); do
    ns="$prefix$h"
    host_end="tcv$$_$h" sw_end="tcs$$_$h"
    ip netns add "$ns" || { netns_why="cannot create network namespaces here"; return 1; }
    netns_made+=("$ns")
    ip link add "$host_end" type veth peer name "$sw_end" || { netns_why="cannot create a veth pair here"; return 1; }
    ip link set "$host_end" netns "$ns" && ip link set "$sw_end" netns "$sw"
    ip -n "$ns" link set "$host_end" name "$netns_iface"
    ip -n "$sw" link set "$sw_end" master br0 && ip -n "$sw" link set "$sw_end" up
    ip -n "$ns" addr add "$addr$((h + 1))/24" dev "$netns_iface"
    ip -n "$ns" link set lo up && ip -n "$ns" link set "$netns_iface" up
  done
}
