#!/bin/sh
# Open MPI's launch agent for tools/cluster/cluster.sh (plm_rsh_agent, used in place of
# ssh): mpirun calls it as `netns_agent.sh HOST COMMAND...`; HOST is a host namespace's
# name (Note [Namespace cluster] in cluster.sh), and the command runs inside it.
set -eu
host=$1
shift
exec ip netns exec "$host" sh -c "$*"
