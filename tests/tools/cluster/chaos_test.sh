#!/bin/sh
# Chaos on the namespace cluster (tools/cluster/cluster.sh): a 3-host ZeRO-1 run under
# tools/launch.sh (Note [Restarts]) while this script, 5 times at random moments, kills a
# random rank with SIGKILL or cuts a random host's link; before each restart the launcher
# resets the cluster (stragglers killed, links healed). The run ends with the final
# weights and every step's loss of an uninterrupted 3-host run, bit for bit. The random
# seed is printed, and CHAOS_SEED replays it. Needs root, ip and tc: skipped without them.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
NAME=chaos HOSTS=3
. "$RUNFILES/tests/tools/cluster/cluster_env.sh"
LAUNCH="$RUNFILES/tools/launch.sh"
batch12='"train_batch_size": 12, "gradient_accumulation_steps": 2'
STEPS=60

config whole 1 "$STEPS" "$batch12"
on_cluster 3 whole --comm-timeout 60 || fail "whole failed: $(tail -n 5 whole.log)"

# The highest training step logged so far (0 before any).
logged_step() {
  s=$(sed -n 's/.*"kind":"train".*"step":\([0-9]*\),.*/\1/p' chaos/log/metrics.jsonl 2>/dev/null | sort -n | tail -n 1)
  echo "${s:-0}"
}
# draw N: DRAW becomes a number in [0, N), the next of the seeded stream (no subshell, so
# that the count advances).
draws=0
draw() {
  draws=$((draws + 1))
  DRAW=$(awk -v seed="$SEED" -v k="$draws" -v n="$1" 'BEGIN {srand(seed); for (i = 0; i < k; i++) r = rand(); print int(r * n)}')
}

SEED=${CHAOS_SEED:-$(date +%s)}
echo "chaos seed $SEED (CHAOS_SEED=$SEED replays it)"
config chaos 1 "$STEPS" "$batch12"
"$LAUNCH" --train "$TRAIN" --restarts 8 --worlds 3 \
  --launch "timeout 300 $CLUSTER mpirun $PREFIX {np} --" \
  --before-restart "$CLUSTER reset $PREFIX" -- --config chaos.json --comm-timeout 5 \
  >chaos.log 2>&1 &
launch=$!
BACKGROUND=$launch
events=0
last=0
while [ "$events" -lt 5 ]; do
  # New progress first: 2 to 5 steps past the last event's step (a resume goes back to its
  # checkpoint and trains them again).
  draw 4
  target=$((last + 2 + DRAW))
  deadline=$(($(date +%s) + 120))
  until [ "$(logged_step)" -ge "$target" ]; do
    kill -0 "$launch" 2>/dev/null || fail "the launch ended before event $((events + 1)): $(tail -n 5 chaos.log)"
    [ "$(date +%s)" -lt "$deadline" ] || fail "no step $target in 120 s: $(tail -n 5 chaos.log)"
    sleep 0.02
  done
  deaths=$(grep -c 'launch: exit code' chaos.log || true)
  draw 2
  if [ "$DRAW" = 0 ]; then
    draw 3
    # The DRAW-th rank process, or the first where fewer are up.
    ranks=$(ps -eo pid=,args= | awk '$2 ~ /train$/ && index($0, "--config chaos.json") {print $1}')
    victim=$(echo "$ranks" | awk -v k="$DRAW" 'NR == k + 1')
    [ -n "$victim" ] || victim=$(echo "$ranks" | head -n 1)
    [ -n "$victim" ] || fail "event $((events + 1)): no rank process found"
    kill -KILL "$victim" 2>/dev/null || true
    what="killed pid $victim"
  else
    draw 2
    host=$((1 + DRAW))
    "$CLUSTER" cut "$PREFIX" "$host"
    what="cut host $host"
  fi
  events=$((events + 1))
  last=$(logged_step)
  echo "event $events at step $last: $what"
  # The attempt dies (the launcher then resets the cluster and restarts it).
  deadline=$(($(date +%s) + 120))
  until [ "$(grep -c 'launch: exit code' chaos.log || true)" -gt "$deaths" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "event $events: the job did not end in 120 s: $(tail -n 5 chaos.log)"
    sleep 0.1
  done
done
code=0
wait "$launch" || code=$?
[ "$code" = 0 ] || fail "the launch failed with $code: $(grep launch: chaos.log)"
attempts=$(grep -c 'launch: attempt' chaos.log)
[ "$attempts" = 6 ] || fail "expected 6 attempts (5 restarts), found $attempts: $(grep launch: chaos.log)"
"$COMPARE" whole chaos 0 || fail "the chaos run's weights or losses differ from the uninterrupted run's"
echo "ok: 5 kills and cuts, 5 restarts, and the uninterrupted run's bits"
