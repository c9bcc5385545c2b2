#!/bin/sh
# Open MPI's launch agent for tools/cluster/cluster.sh (plm_rsh_agent, used in place of
# ssh): mpirun calls it as `netns_agent.sh HOST COMMAND...`; HOST is a host namespace's
# name (Note [Namespace cluster] in cluster.sh), and the command runs inside it, with a
# temporary directory of the host's own: the hosts share one file system and one host name,
# so their daemons would otherwise share Open MPI's session directory, where one daemon's
# clean-up races another's start-up and the daemon that loses exits at once (Note
# [Start-up hangs] in cluster.sh).
set -eu
host=$1
shift
dir="${TMPDIR:-/tmp}/$host"
mkdir -p "$dir"
exec ip netns exec "$host" env TMPDIR="$dir" sh -c "$*"
