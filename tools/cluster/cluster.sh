#!/bin/sh
# A cluster of N "hosts" on one machine: Linux network namespaces joined by veth pairs to a
# bridge in a namespace of its own, each host with its own address, for running tools/train
# (or any MPI job) under mpirun across hosts over TCP, as on a real cluster. Needs root and
# iproute2's `ip` and `tc`.
#
#   tools/cluster/cluster.sh up ts0 3                 # hosts ts0-h0..ts0-h2, 10.77.0.1..3
#   tools/cluster/cluster.sh shape ts0 1 rate 1gbit     # or: netem delay 1ms loss 1%
#   tools/cluster/cluster.sh mpirun ts0 3 -- bazel-bin/tools/train --config c.json
#   tools/cluster/cluster.sh bytes ts0                # per host: bytes sent, received, packets sent
#   tools/cluster/cluster.sh cut ts0 2                # host 2's link down (heal: up again)
#   tools/cluster/cluster.sh reset ts0                # kill what runs on the hosts, heal all
#   tools/cluster/cluster.sh down ts0                 # removes everything `up` made
#
# Note [Namespace cluster]
# `up PREFIX N` makes the namespaces PREFIX-sw (a bridge, br0) and PREFIX-h0 .. PREFIX-h<N-1>,
# each host with one interface eth0 at 10.77.0.<i+1>/24 (and lo), whose veth peer
# PREFIX-h<i>p is a port of the bridge. The addresses exist only inside these namespaces:
# nothing is routed to or from any other network, and the machine's own interfaces are
# untouched. `mpirun` runs Open MPI's mpirun inside host 0 with a hostfile naming the hosts
# (one slot each, round-robin) and netns_agent.sh as its launch agent (plm_rsh_agent: it
# enters the named host's namespace instead of logging in, with a temporary directory of the
# host's own: Note [Start-up hangs]), with shared memory off and TCP
# restricted to 10.77.0.0/24 for both the out-of-band channel and the byte transfer layer,
# so every message between ranks crosses the veth links. `shape` limits what a host's eth0
# sends: `rate R` with a token bucket (tbf; its burst 1 ms of R, at least 256 KB), or a netem
# qdisc with netem's own arguments (delay, loss, rate), where the kernel has sch_netem (not
# every kernel does; tbf is nearly everywhere). `cut` and `heal` take a host's
# bridge port down and up; `reset` kills every process in the hosts (a dead job's
# stragglers: daemons and ranks cut off from mpirun) and heals every link, as an operator
# restoring a cluster between runs would. `down` kills what runs in the namespaces, deletes them (their veths go
# with them) and fails if any namespace or interface with the prefix is left. Prefixes of
# at most 8 characters keep interface names within Linux's 15.
#
# Note [Dead hosts]
# When a host's link dies, the ranks elsewhere stop in the collective timeout (--comm-timeout,
# Note [Roll call] in parallel/comm/mpi_roll_call.h) and call MPI_Abort; mpirun then has to
# give up on the dead host's daemon, which it only does when TCP says the connection is
# gone: idle, after the out-of-band channel's keepalives (oob_tcp_keepalive_time 5 s,
# probes every 2 s, 3 of them: ~11 s here, 300 s + 9 x 20 s by default), and with data in
# flight, after TCP's retransmissions (net.ipv4.tcp_retries2 = 5: ~12 s, where Linux's 15
# takes about 15 minutes). The same settings bound a real cluster's wait for a dead node.
#
# Note [Start-up hangs]
# The hosts share one file system and one host name, so their Open MPI daemons would share
# one session directory (TMPDIR/ompi.<host name>.<uid>/...), where one daemon's clean-up
# raced another's start-up: the loser exited at once ("A call to mkdir was unable to create
# the desired directory") and mpirun waited for it forever, silently, in about one launch in
# eight. netns_agent.sh gives each host a temporary directory of its own; `down` removes
# them.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
AGENT="$HERE/netns_agent.sh"

die() {
  echo "cluster: $*" >&2
  exit 1
}

need_tools() {
  [ "$(id -u)" = 0 ] || die "expected root (network namespaces), found uid $(id -u)"
  command -v ip >/dev/null || die "expected iproute2's ip on PATH, found none"
}

check_prefix() {
  case "$1" in
  '' | *[!a-z0-9]*) die "prefix \"$1\": expected lowercase letters and digits" ;;
  esac
  [ "${#1}" -le 8 ] || die "prefix \"$1\": expected at most 8 characters, found ${#1}"
}

# hosts PREFIX: the host namespaces, in order.
hosts() {
  ip netns list | awk -v p="$1-h" 'index($1, p) == 1 {print $1}' | sort -t- -k2.2n
}

up() {
  prefix=$1 n=$2
  case "$n" in '' | *[!0-9]*) die "up: expected a number of hosts, found \"$n\"" ;; esac
  [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up: expected 1 to 200 hosts, found $n"
  ! ip netns list | grep -q "^$prefix-" || die "up: namespaces named $prefix-* exist already"
  ip netns add "$prefix-sw"
  ip -n "$prefix-sw" link add br0 type bridge
  ip -n "$prefix-sw" link set br0 up
  i=0
  while [ "$i" -lt "$n" ]; do
    host="$prefix-h$i"
    ip netns add "$host"
    # Made inside the two namespaces: the machine's own namespace never holds either end.
    ip link add eth0 netns "$host" type veth peer name "${prefix}h${i}p" netns "$prefix-sw"
    ip -n "$host" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$host" link set eth0 up
    ip -n "$host" link set lo up
    # A dead peer ends a TCP connection with unacknowledged data in about 12 s instead of
    # Linux's 15 minutes (Note [Dead hosts]).
    ip netns exec "$host" sysctl -q -w net.ipv4.tcp_retries2=5
    ip -n "$prefix-sw" link set "${prefix}h${i}p" master br0
    ip -n "$prefix-sw" link set "${prefix}h${i}p" up
    i=$((i + 1))
  done
}

# kill_all NS: kills every process in namespace NS, again while new ones appear (a launcher
# may start one between two passes), up to 5 passes.
kill_all() {
  n=0
  while [ "$n" -lt 5 ] && [ -n "$(ip netns pids "$1" 2>/dev/null)" ]; do
    for pid in $(ip netns pids "$1" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.1
    n=$((n + 1))
  done
}

down() {
  prefix=$1
  for ns in $(ip netns list | awk -v p="$prefix-" 'index($1, p) == 1 {print $1}'); do
    kill_all "$ns"
    ip netns del "$ns"
  done
  rm -rf "${TMPDIR:-/tmp}/$prefix"-h*  # the hosts' temporary directories (netns_agent.sh)
  left=$(ip netns list | awk -v p="$prefix-" 'index($1, p) == 1 {print $1}')
  [ -z "$left" ] || die "down: namespaces left: $left"
  ! ip -o link | grep -q "${prefix}h[0-9]*[ep][@:]" || die "down: interfaces left: $(ip -o link | grep "${prefix}h")"
}

# host_index PREFIX I: checks that host I exists.
host_index() {
  case "$2" in '' | *[!0-9]*) die "expected a host number, found \"$2\"" ;; esac
  ip netns list | awk '{print $1}' | grep -qx "$1-h$2" ||
    die "no host $1-h$2 (hosts: $(hosts "$1" | tr '\n' ' '))"
}

run_mpi() {
  prefix=$1 np=$2
  shift 2
  [ "${1:-}" = "--" ] && shift
  hostfile=$(mktemp "${TMPDIR:-/tmp}/$prefix.hosts.XXXXXX")
  for h in $(hosts "$prefix"); do echo "$h slots=1"; done >"$hostfile"
  [ -s "$hostfile" ] || { rm -f "$hostfile"; die "mpirun: no hosts named $prefix-h*; run \`up\` first"; }
  code=0
  ip netns exec "$prefix-h0" mpirun --allow-run-as-root --oversubscribe -np "$np" \
    --hostfile "$hostfile" --map-by node --tag-output \
    --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include 10.77.0.0/24 --mca btl tcp,self \
    --mca btl_tcp_if_include 10.77.0.0/24 \
    --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 \
    --mca oob_tcp_keepalive_probes 3 \
    -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$@" || code=$?
  rm -f "$hostfile"
  return "$code"
}

[ $# -ge 2 ] || die "usage: cluster.sh up|down|shape|cut|heal|reset|bytes|mpirun PREFIX [...] (see the header)"
command=$1 prefix=$2
shift 2
need_tools
check_prefix "$prefix"
case "$command" in
up) up "$prefix" "${1:-}" ;;
down) down "$prefix" ;;
shape)
  host_index "$prefix" "${1:-x}"
  i=$1
  shift
  command -v tc >/dev/null || die "shape: expected iproute2's tc on PATH, found none"
  case "${1:-}" in
  rate)
    bits=$(echo "${2:-}" | awk '/^[0-9.]+(bit|kbit|mbit|gbit)$/ {
      n = $0 + 0; u = $0; sub(/^[0-9.]+/, "", u)
      print n * (u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : 1)}')
    [ -n "$bits" ] || die "shape rate: expected a rate such as 100mbit or 1gbit, found \"${2:-}\""
    # At least 256 KB: veth hands tbf segments of up to 64 KB (GSO), which a smaller bucket
    # would drop.
    burst=$(awk -v b="$bits" 'BEGIN {x = b / 8 / 1000; printf "%d", x < 262144 ? 262144 : x}')
    tc -n "$prefix-h$i" qdisc replace dev eth0 root tbf rate "$2" burst "$burst" latency 100ms
    ;;
  netem)
    shift
    tc -n "$prefix-h$i" qdisc replace dev eth0 root netem "$@" ||
      die "shape netem: the kernel refused netem (no sch_netem?); \`rate\` works without it"
    ;;
  *) die "shape: expected \"rate R\" or \"netem ARGS...\", found \"$*\"" ;;
  esac
  ;;
cut | heal)
  host_index "$prefix" "${1:-x}"
  state=down
  [ "$command" = heal ] && state=up
  ip -n "$prefix-sw" link set "${prefix}h${1}p" "$state"
  ;;
bytes)
  for h in $(hosts "$prefix"); do
    stat() { ip netns exec "$h" cat "/sys/class/net/eth0/statistics/$1"; }
    echo "$h $(stat tx_bytes) $(stat rx_bytes) $(stat tx_packets)"
  done
  ;;
reset)
  for h in $(hosts "$prefix"); do
    kill_all "$h"
    ip -n "$prefix-sw" link set "${prefix}${h#"$prefix"-}p" up
  done
  ;;
mpirun) run_mpi "$prefix" "$@" ;;
*) die "unknown command \"$command\"; expected up, down, shape, cut, heal, reset, bytes or mpirun" ;;
esac
