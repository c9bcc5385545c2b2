#!/bin/bash
# Runs a command under a memory limit, in a cgroup v1 memory group of its own that is
# removed afterwards, and reports the group's peak usage and how often it hit the limit.
# Root only. For offload runs whose model states exceed the memory they are allowed.
#
#   bash tools/memory_limit.sh LIMIT_MIB COMMAND [ARGS...]
#
# Prints "memory_limit: peak N MiB of LIMIT MiB, limit hit K times" on stderr after the
# command and exits with the command's status (137 when the kernel killed it for memory).
set -u

usage() {
  echo "usage: bash tools/memory_limit.sh LIMIT_MIB COMMAND [ARGS...]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
case "$1" in
  '' | *[!0-9]*) echo "memory_limit: expected a limit in MiB (a whole number), found '$1'" >&2; exit 2 ;;
esac
limit_mib=$1
shift
root=/sys/fs/cgroup/memory
[ -w "$root" ] || { echo "memory_limit: expected a writable cgroup v1 memory hierarchy at $root (run as root)" >&2; exit 2; }

group="$root/tessera_memory_limit_$$"
mkdir "$group" || { echo "memory_limit: cannot create $group" >&2; exit 2; }
cleanup() {
  # Processes left in the group (a killed command's children) go to the parent first.
  if [ -f "$group/cgroup.procs" ]; then
    while read -r pid; do echo "$pid" >"$root/cgroup.procs" 2>/dev/null; done <"$group/cgroup.procs"
  fi
  rmdir "$group" 2>/dev/null
}
trap cleanup EXIT

bytes=$((limit_mib * 1024 * 1024))
echo "$bytes" >"$group/memory.limit_in_bytes" || { echo "memory_limit: cannot set the limit of $group" >&2; exit 2; }
# No swap either, where the kernel accounts it: the limit is on memory, not on memory + swap.
[ -f "$group/memory.memsw.limit_in_bytes" ] && echo "$bytes" >"$group/memory.memsw.limit_in_bytes" 2>/dev/null

# The command runs in a subshell that joins the group first, so this script stays outside.
# A TERM, INT or HUP sent to this script stops it with TERM (a background command ignores
# INT), and the group is still reported and removed when it has ended.
( echo $BASHPID >"$group/cgroup.procs" && exec "$@" ) &
child=$!
signalled=0
trap 'signalled=1; kill -TERM $child 2>/dev/null' TERM INT HUP
while :; do
  signalled=0
  status=0
  wait $child || status=$?
  # A signal cuts the wait short; the next wait returns the command's own status.
  [ "$signalled" = 1 ] || break
done
peak=$(( $(cat "$group/memory.max_usage_in_bytes") / 1024 / 1024 ))
hits=$(cat "$group/memory.failcnt")
if [ -f "$group/memory.memsw.failcnt" ]; then
  memsw=$(cat "$group/memory.memsw.failcnt")
  [ "$memsw" -le "$hits" ] || hits=$memsw
fi
echo "memory_limit: peak $peak MiB of $limit_mib MiB, limit hit $hits times" >&2
exit $status
