#!/bin/sh
# The MPI backend (parallel/comm/mpi_comm.h) across real processes: mpi_comm_ranks' test
# cases under mpirun at 2 and 3 ranks, then its fault modes, where rank 1 leaves while rank 0
# waits in barrier #1 with a 2 s timeout. A fault must end the job with a non-zero exit code
# in seconds, not hang. When rank 1 leaves by finalizing MPI (skip), rank 0's error naming
# the group, the op and its sequence number must be printed. When rank 1 exits without
# finalizing (exit), mpirun kills the whole job as soon as it notices, usually before rank
# 0's timeout, so there the message is printed when it appears but not required. A rank
# that creates its world late (late) makes the others' mpi_world fail the same way.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
RANKS="$RUNFILES/tests/parallel/mpi_comm_ranks"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/mpi_comm"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

[ -x "$RANKS" ] || fail "no mpi_comm_ranks binary at $RANKS"
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"

. "$RUNFILES/tests/mpi_env.sh"

# mpi SECONDS NP ARGS...: runs mpi_comm_ranks on NP ranks, killed after SECONDS.
mpi() {
  limit=$1
  np=$2
  shift 2
  mpi_run "$limit" "$np" "$RANKS" "$@"
}

for np in 2 3; do
  code=0
  mpi 240 "$np" --use-colour no >"cases_$np.log" 2>&1 || code=$?
  cat "cases_$np.log"
  [ "$code" -ne 124 ] || fail "the test cases at $np ranks did not finish in 240 s"
  [ "$code" -eq 0 ] || fail "the test cases failed at $np ranks (exit code $code)"
  echo "ok: the test cases pass at $np ranks"
done

# A rank that reaches mpi_world late (3 s) makes the others' world creation (timeout 1 s)
# fail rather than hang.
start=$(date +%s)
code=0
mpi 60 2 --fault=late >fault_late.log 2>&1 || code=$?
took=$(($(date +%s) - start))
cat fault_late.log
[ "$code" -ne 124 ] || fail "--fault=late: the job hung (killed after 60 s)"
[ "$code" -ne 0 ] || fail "--fault=late: expected a non-zero exit code, found 0"
[ "$took" -lt 30 ] || fail "--fault=late: expected the job to end within 30 s, took $took s"
grep -qF "[comm world] timed out after 1000 ms" fault_late.log ||
  fail "--fault=late: expected rank 0 to print '[comm world] timed out after 1000 ms'"
echo "ok: --fault=late: exit code $code after $took s, rank 0 reported the timeout"

WANT="[comm world, rank 0 of 2] barrier #1: timed out after 2000 ms"
for mode in skip exit; do
  start=$(date +%s)
  code=0
  mpi 60 2 "--fault=$mode" >"fault_$mode.log" 2>&1 || code=$?
  took=$(($(date +%s) - start))
  cat "fault_$mode.log"
  [ "$code" -ne 124 ] || fail "--fault=$mode: the job hung (killed after 60 s)"
  [ "$code" -ne 0 ] || fail "--fault=$mode: expected a non-zero exit code, found 0"
  [ "$took" -lt 30 ] || fail "--fault=$mode: expected the job to end within 30 s, took $took s"
  if grep -qF "$WANT" "fault_$mode.log"; then
    echo "ok: --fault=$mode: exit code $code after $took s, rank 0 reported the timeout"
  elif [ "$mode" = skip ]; then
    fail "--fault=skip: expected rank 0 to print '$WANT'"
  else
    echo "ok: --fault=$mode: exit code $code after $took s, mpirun ended the job first"
  fi
done
