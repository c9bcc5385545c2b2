# Sourced by the namespace-cluster tests (cluster_test.sh, chaos_test.sh) with RUNFILES,
# NAME (their working directory's name) and HOSTS set: skips the test, saying why, without
# root, ip, tc and the right to make network namespaces; otherwise enters a fresh working
# directory (tool_env.sh), sets CLUSTER, COMPARE and PREFIX, makes a cluster of HOSTS hosts
# (tools/cluster/cluster.sh) that is removed on exit, after the processes whose ids the test
# adds to BACKGROUND are killed, and writes the char-level data (VOCAB; mpi_configs.sh's
# configs).
CLUSTER="$RUNFILES/tools/cluster/cluster.sh"
PREFIX="tc$(($$ % 1000000))"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "skipped: the namespace cluster needs root, ip and tc (uid $(id -u))"
  exit 0
fi
if ! ip netns add "$PREFIX-probe" 2>/dev/null; then
  echo "skipped: this process may not make network namespaces (no CAP_SYS_ADMIN?)"
  exit 0
fi
ip netns del "$PREFIX-probe"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/$NAME"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"
. "$RUNFILES/tests/tools/trainer/mpi_configs.sh"
COMPARE="$RUNFILES/tests/tools/trainer/compare_runs"
export TMPDIR="$WORK" OMP_NUM_THREADS=1

BACKGROUND=
! ip netns list | grep -q "^$PREFIX-" || fail "namespaces named $PREFIX-* exist already"
trap 'for p in $BACKGROUND; do kill -KILL "$p" 2>/dev/null || true; done; "$CLUSTER" down "$PREFIX"' EXIT
"$CLUSTER" up "$PREFIX" "$HOSTS"

write_text text.txt 20000
prepare_chars text.txt

# on_cluster NP NAME ARGS...: tools/train --config NAME.json ARGS on NP hosts, killed after
# 240 s, its output in NAME.log.
on_cluster() {
  oc_np=$1 oc_name=$2
  shift 2
  timeout 240 "$CLUSTER" mpirun "$PREFIX" "$oc_np" -- "$TRAIN" --config "$oc_name.json" "$@" \
    >"$oc_name.log" 2>&1
}
