#!/bin/sh
# tools/launch.sh (Note [Restarts]): a 2-rank run of 60 steps whose rank is killed with SIGKILL
# at step 5 is restarted from its latest checkpoint and ends bit for bit as the uninterrupted run;
# an elastic run killed the same way is restarted on 1 rank with the same global batch and
# ends bit for bit as a 1-rank run resumed from the same checkpoint; a config that does not
# fit the world size is not launched, and an exhausted launch exits with the job's code.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/launch"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"
. "$RUNFILES/tests/mpi_env.sh"
. "$RUNFILES/tests/tools/trainer/mpi_configs.sh"
COMPARE="$RUNFILES/tests/tools/trainer/compare_runs"
LAUNCH="$RUNFILES/tools/launch.sh"
MPIRUN='timeout 240 mpirun --allow-run-as-root --oversubscribe --tag-output -np {np}'

write_text text.txt 20000
prepare_chars text.txt

# launched NAME WORLDS: NAME.json under the launcher (2 restarts, sizes WORLDS) in the
# background, one of its ranks killed once step 5 is logged; waits for the launch.
launched() {
  "$LAUNCH" --train "$TRAIN" --restarts 2 --worlds "$2" --launch "$MPIRUN" -- \
    --config "$1.json" --comm-timeout 60 >"$1.log" 2>&1 &
  launch=$!
  deadline=$(($(date +%s) + 60))
  until grep -q '"step":5,' "$1/log/metrics.jsonl" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$1: no step 5 in 60 s: $(tail -n 5 "$1.log")"
    sleep 0.05
  done
  victim=$(ps -eo pid=,args= | awk -v c="--config $1.json" 'index($0, c) && $2 ~ /train$/ {print $1}' | tail -n 1)
  [ -n "$victim" ] || fail "$1: no rank process found"
  kill -KILL "$victim" 2>/dev/null || true
  code=0
  wait "$launch" || code=$?
  [ "$code" = 0 ] || fail "$1: the launch failed with $code: $(tail -n 5 "$1.log")"
  grep -q 'launch: attempt 2 of 3 on' "$1.log" || fail "$1: no second attempt: $(grep launch: "$1.log")"
}

config whole 1 60
mpi_run 240 2 "$TRAIN" --config whole.json >whole.log 2>&1 || fail "whole failed: $(tail -n 5 whole.log)"
config killed 1 60
launched killed 2
"$COMPARE" whole killed 0 || fail "the restarted run differs from the uninterrupted one"
echo "ok: a killed rank's job restarts from its checkpoint and ends bit for bit as the whole run"

# Elastic: 8 sequences a step at 2 ranks (micro-batch 4) and at 1 (4 x 2 accumulation).
elastic='"elasticity": {"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [2, 4], "version": 0.1}'
config elastic 1 60 "$elastic"
launched elastic 2,1
grep -q 'launch: attempt 2 of 3 on 1 ranks' elastic.log || fail "elastic: the restart was not on 1 rank"
step=$(sed -n 's/.*resumed from .*step_\([0-9]*\) at step.*/\1/p' elastic.log | tail -n 1)
[ -n "$step" ] || fail "elastic: the restart did not resume: $(grep -i resum elastic.log)"
grep -q 'steps of 128 tokens; 1 data-parallel rank(s)' elastic.log ||
  fail "elastic: the 1-rank restart did not keep the batch of 8"
# The same checkpoint resumed on 1 rank without the launcher.
config alone 1 60 "$elastic"
mkdir -p alone/ckpt alone/log
cp -r "elastic/ckpt/step_$step" alone/ckpt/
echo "step_$step" >alone/ckpt/latest
awk -v s="$step" 'match($0, /"step":[0-9]+,/) {
  n = substr($0, RSTART + 7, RLENGTH - 8) + 0; if (n <= s + 0) print }' elastic/log/metrics.jsonl >alone/log/metrics.jsonl
"$TRAIN" --config alone.json >alone.log 2>&1 || fail "alone failed: $(tail -n 5 alone.log)"
"$COMPARE" alone elastic 0 || fail "the elastic restart on 1 rank differs from a 1-rank resume"
echo "ok: an elastic job restarts on 1 rank with its batch, as a 1-rank resume of its checkpoint"

# A config that does not fit: not launched. A job that always fails: its code, no more.
config misfit 1 12 '"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3'
code=0
"$LAUNCH" --train "$TRAIN" --worlds 2 --launch "$MPIRUN" -- --config misfit.json >misfit.log 2>&1 || code=$?
[ "$code" = 1 ] && grep -q 'does not fit 2 ranks; not launching' misfit.log ||
  fail "misfit: expected exit 1 without a launch, found $code: $(cat misfit.log)"
config doomed 1 12
code=0
"$LAUNCH" --train "$TRAIN" --restarts 1 --worlds 2 --launch 'false {np}' -- --config doomed.json \
  >doomed.log 2>&1 || code=$?
[ "$code" = 1 ] && grep -q 'attempt 2 of 2' doomed.log && grep -q 'no restarts left' doomed.log ||
  fail "doomed: expected 2 attempts and exit 1, found $code: $(cat doomed.log)"
code=0
"$LAUNCH" --train "$TRAIN" --restarts 3 --worlds 2 --launch "$MPIRUN" -- --config doomed.json \
  --comm-timeout 1x >usage.log 2>&1 || code=$?
[ "$code" = 2 ] && grep -q 'not restarting' usage.log ||
  fail "usage: expected exit 2 without a restart, found $code: $(cat usage.log)"
echo "ok: a misfit config is not launched; a failing job ends the launch with its code"
