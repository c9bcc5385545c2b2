# Sourced by the namespace-cluster tests (cluster_test.sh, chaos_test.sh) with RUNFILES,
# NAME (their working directory's name) and HOSTS set: skips the test, saying why, without
# root, ip and tc; otherwise enters a fresh working directory (tool_env.sh), sets CLUSTER,
# COMPARE and PREFIX, makes a cluster of HOSTS hosts (tools/cluster/cluster.sh) that is
# removed on exit, and writes the char-level data (VOCAB; mpi_configs.sh's configs).
CLUSTER="$RUNFILES/tools/cluster/cluster.sh"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "skipped: the namespace cluster needs root, ip and tc (uid $(id -u))"
  exit 0
fi
WORK="${TEST_TMPDIR:-$(mktemp -d)}/$NAME"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"
. "$RUNFILES/tests/tools/trainer/mpi_configs.sh"
COMPARE="$RUNFILES/tests/tools/trainer/compare_runs"
export TMPDIR="$WORK" OMP_NUM_THREADS=1

PREFIX="tc$(($$ % 1000000))"
trap '"$CLUSTER" down "$PREFIX"' EXIT
"$CLUSTER" up "$PREFIX" "$HOSTS"

write_text text.txt 20000
prepare_chars text.txt
