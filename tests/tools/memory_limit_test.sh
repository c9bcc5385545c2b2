#!/bin/sh
# tools/memory_limit.sh: a command within its limit runs and reports its peak; one over
# it is killed (137) with the limit reported; one whose script is sent TERM ends with it
# (143), reported; a bad limit is refused; no group is left behind. Skipped (passing) without root or a cgroup v1 memory hierarchy.
set -u

SCRIPT="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-tessera}/tools/memory_limit.sh"
ERR="${TEST_TMPDIR:-/tmp}/memory_limit_err.txt"
fail() { echo "FAIL: $*" >&2; exit 1; }

if [ ! -w /sys/fs/cgroup/memory ]; then
  echo "skipped: needs root and a cgroup v1 memory hierarchy"
  exit 0
fi
before=$(ls /sys/fs/cgroup/memory | grep -c tessera_memory_limit_ || true)

# About 40 MB of string: fits in 128 MiB.
out=$(bash "$SCRIPT" 128 bash -c 'x=$(head -c 40000000 /dev/zero | tr "\0" a); echo ${#x}' 2>"$ERR")
status=$?
[ "$status" = 0 ] || fail "a command within its limit exited with $status: $(cat "$ERR")"
[ "$out" = 40000000 ] || fail "the command's output was '$out'"
grep -q '^memory_limit: peak [0-9]* MiB of 128 MiB, limit hit [0-9]* times$' "$ERR" ||
  fail "no peak report: $(cat "$ERR")"

# About 400 MB: killed at 64 MiB.
bash "$SCRIPT" 64 bash -c 'x=$(head -c 400000000 /dev/zero | tr "\0" a); echo ${#x}' >/dev/null 2>"$ERR"
status=$?
[ "$status" = 137 ] || fail "a command over its limit exited with $status, expected 137: $(cat "$ERR")"
grep -q '^memory_limit: peak [0-9]* MiB of 64 MiB' "$ERR" || fail "no report after the kill: $(cat "$ERR")"

# Stopped from outside: the command gets the TERM, the script reports it and removes the
# group all the same.
bash "$SCRIPT" 64 sleep 60 2>"$ERR" &
script=$!
sleep 1
kill -TERM $script
wait $script
status=$?
[ "$status" = 143 ] || fail "a stopped command's script exited with $status, expected 143: $(cat "$ERR")"
grep -q '^memory_limit: peak [0-9]* MiB of 64 MiB' "$ERR" || fail "no report after TERM: $(cat "$ERR")"

bash "$SCRIPT" lots true 2>"$ERR"
[ $? = 2 ] || fail "a bad limit was accepted"
grep -q "expected a limit in MiB (a whole number), found 'lots'" "$ERR" || fail "$(cat "$ERR")"

after=$(ls /sys/fs/cgroup/memory | grep -c tessera_memory_limit_ || true)
[ "$after" = "$before" ] || fail "groups left behind: $(ls /sys/fs/cgroup/memory | grep tessera_memory_limit_)"
echo "ok: memory_limit.sh runs, reports, kills over the limit and cleans up"
