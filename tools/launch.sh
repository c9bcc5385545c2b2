#!/bin/sh
# launch: runs a training job and restarts it from its latest checkpoint when it dies, as
# DeepSpeed's elastic agent does, optionally at another world size each time.
#
#   tools/launch.sh --restarts 5 --worlds 4,3,2 -- --config configs/my_elastic.json
#   tools/launch.sh --launch 'tools/cluster/cluster.sh mpirun ts0 {np} --' --worlds 3,2 \
#     --before-restart 'sh fence_bad_nodes.sh' -- --config cfg.json
#
# Note [Restarts]
# Attempt i runs `LAUNCH TRAIN ARGS...` with {np} in LAUNCH replaced by the i-th size of
# --worlds (the last one once the list runs out; default LAUNCH: "mpirun
# --allow-run-as-root --oversubscribe -np {np}", TRAIN: bazel-bin/tools/train). The trainer
# resumes from the newest committed checkpoint by itself (Note [Resume fallback] in
# tools/trainer/checkpoint.h), so every attempt after the first continues where the last
# checkpoint left it: at the same world size bit for bit, at another one with the batch
# the config gives that size (an "elasticity" section keeps it the same: Note [Elastic
# batch] in parallel/elasticity.h). Before each attempt `train --check-config --world N`
# checks the config for that size, so a config error ends the launch at once instead of
# being retried. --before-restart CMD runs (through sh) before each restart, for what an
# operator does between attempts: fence or replace a node, heal a link; a failure of it
# ends the launch. An attempt that exits 0 ends the launch; one that fails is retried until
# --restarts are spent, and the launch exits with the last attempt's code. Exit code 2
# (usage) and 3 (no device) are not retried either. TERM or INT to the launcher goes on to
# the running attempt and ends the launch.
set -eu

die() {
  echo "launch: $*" >&2
  exit 2
}

restarts=3
worlds=1
before_restart=
launch='mpirun --allow-run-as-root --oversubscribe -np {np}'
train="${TESSERA_TRAIN:-bazel-bin/tools/train}"
while [ $# -gt 0 ]; do
  case "$1" in
  --restarts) restarts=${2:?}; shift 2 ;;
  --worlds) worlds=${2:?}; shift 2 ;;
  --launch) launch=${2:?}; shift 2 ;;
  --train) train=${2:?}; shift 2 ;;
  --before-restart) before_restart=${2:?}; shift 2 ;;
  --) shift; break ;;
  *) die "unknown flag \"$1\"; expected --restarts N, --worlds A,B,..., --launch CMD, --train PATH, --before-restart CMD, then -- and the trainer's flags" ;;
  esac
done
case "$restarts" in '' | *[!0-9]*) die "--restarts: expected an integer >= 0, found \"$restarts\"" ;; esac
case "$worlds" in '' | *[!0-9,]* | ,* | *,,* | *,) die "--worlds: expected sizes such as 4,3,2, found \"$worlds\"" ;; esac
case "$launch" in *'{np}'*) ;; *) die "--launch: expected {np} where the world size goes, found \"$launch\"" ;; esac
[ -x "$train" ] || die "no trainer at $train (bazel build //tools:train, or --train PATH)"
[ $# -gt 0 ] || die "expected the trainer's flags after --"

# The config file among the trainer's flags, for --check-config.
config=
prev=
for a in "$@"; do
  [ "$prev" = --config ] && config=$a
  case "$a" in --config=*) config=${a#--config=} ;; esac
  prev=$a
done
[ -n "$config" ] || die "expected --config FILE among the trainer's flags"

attempt=0
while :; do
  # The attempt-th world size, or the last.
  np=$(echo "$worlds" | awk -F, -v i=$((attempt + 1)) '{print (i <= NF) ? $i : $NF}')
  [ "$np" -ge 1 ] || die "--worlds: expected sizes >= 1, found $np"
  "$train" --check-config --config "$config" --world "$np" >/dev/null ||
    { echo "launch: the config does not fit $np ranks; not launching" >&2; exit 1; }
  echo "launch: attempt $((attempt + 1)) of $((restarts + 1)) on $np ranks" >&2
  command=$(printf '%s\n' "$launch" | sed "s/{np}/$np/g")
  code=0
  # The launch command is split into words (not globbed) on purpose; the attempt runs in the
  # background so that a TERM or INT to the launcher reaches it.
  set -f
  # shellcheck disable=SC2086
  $command "$train" "$@" &
  child=$!
  set +f
  trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM INT
  wait "$child" || code=$?
  trap - TERM INT
  [ "$code" -ne 0 ] || exit 0
  if [ "$code" -eq 2 ] || [ "$code" -eq 3 ]; then
    echo "launch: exit code $code (usage or no device); not restarting" >&2
    exit "$code"
  fi
  if [ "$attempt" -ge "$restarts" ]; then
    echo "launch: exit code $code; no restarts left" >&2
    exit "$code"
  fi
  echo "launch: exit code $code; restarting from the latest checkpoint" >&2
  if [ -n "$before_restart" ]; then
    sh -c "$before_restart" || { echo "launch: --before-restart failed; not restarting" >&2; exit 1; }
  fi
  attempt=$((attempt + 1))
done
