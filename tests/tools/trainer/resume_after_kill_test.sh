#!/bin/sh
# Note [Exact resume] in tools/trainer/trainer.h, end to end: run A trains uninterrupted;
# run B is killed with SIGKILL between two checkpoints and resumed with --resume. The two
# must end with byte-identical checkpoints (weights, optimizer moments, trainer state) and
# the same metrics (step, loss, lr, grad norm, val loss) for every step.
#
# Dropout is on, batches are sampled at random and gradients are accumulated and clipped,
# so the dropout stream, the data cursor, the schedule and the optimizer state all have to
# come back exactly for the test to pass. A and B run in sibling directories with the same
# config file, so that even state.json (which embeds the config) must match byte for byte.
# With "nvme" as the second argument both run bf16 at ZeRO-3 with the optimizer state,
# masters, gradients and 16-bit parameters in NVMe swap files (Note [ZeRO's offloaded
# state] in parallel/zero/zero_offload.h, Note [Offloaded parameters] in
# parallel/zero/partitioned_params.h), swapped every step: B dies with its swap files in use, and
# the checkpoint, not the swap file, is what it resumes from.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/resume_after_kill"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"
mkdir -p a b

THREADS="${1:-1}" # trainer.threads (the first argument); losses must not depend on timing
OFFLOAD=""
if [ "${2:-}" = nvme ]; then
  OFFLOAD='"bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "sub_group_size": 20000,
                        "offload_optimizer": {"device": "nvme", "nvme_path": "swap"},
                        "offload_param": {"device": "nvme", "nvme_path": "swap"}},'
fi
STEPS=200         # optimizer steps of each run
INTERVAL=10       # checkpoint interval
KILL_AFTER=35     # B is killed once it has logged this step (after the checkpoint at 30)

write_text text.txt 40000
prepare_chars text.txt

cat >run.json <<EOF
{
  "train_batch_size": 8,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "steps_per_print": 10,
  "optimizer": {
    "type": "AdamW",
    "params": {"lr": 3e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.1}
  },
  "scheduler": {
    "type": "WarmupCosineLR",
    "params": {"total_num_steps": $STEPS, "warmup_num_steps": 20, "warmup_type": "linear",
               "cos_min_ratio": 0.1}
  },
  "gradient_clipping": 1.0,
  $OFFLOAD
  "model": {"type": "gpt2", "vocab_size": $VOCAB, "block_size": 64, "n_layer": 2,
            "n_head": 2, "n_embd": 64, "dropout": 0.1},
  "data": {"train": "../data/train_*.bin", "val": "../data/val_*.bin", "sampling": "random"},
  "trainer": {"steps": $STEPS, "eval_interval": 40, "eval_batches": 4, "seed": 4321,
              "threads": $THREADS, "log_dir": "log", "checkpoint_dir": "ckpt",
              "checkpoint_interval": $INTERVAL, "keep_last": 2}
}
EOF
cp run.json a/run.json
cp run.json b/run.json

# The step of the last complete train record in $1 (a metrics.jsonl), or 0.
last_train_step() {
  [ -f "$1" ] || {
    echo 0
    return
  }
  s=$(sed -n 's/.*"kind":"train".*"step":\([0-9]*\),.*/\1/p' "$1" | tail -n 1)
  echo "${s:-0}"
}

start=$(date +%s)

# Run A: uninterrupted.
(cd a && "$TRAIN" --config run.json >train.log 2>&1) || fail "run A failed: $(tail -n 5 a/train.log)"
[ "$(last_train_step a/log/metrics.jsonl)" = "$STEPS" ] || fail "run A did not reach step $STEPS"

# Run B: killed with SIGKILL as soon as it has logged step KILL_AFTER.
(cd b && exec "$TRAIN" --config run.json >train_killed.log 2>&1) &
pid=$!
deadline=$(($(date +%s) + 240))
while :; do
  step=$(last_train_step b/log/metrics.jsonl)
  if [ "$step" -ge "$KILL_AFTER" ]; then
    kill -9 "$pid" 2>/dev/null ||
      fail "run B finished before it could be killed (step $step); make the run longer"
    break
  fi
  kill -0 "$pid" 2>/dev/null || fail "run B exited at step $step: $(tail -n 5 b/train_killed.log)"
  [ "$(date +%s)" -lt "$deadline" ] || fail "run B did not reach step $KILL_AFTER in 240 s"
  sleep 0.05
done
status=0
wait "$pid" || status=$?
[ "$status" -eq 137 ] || fail "run B was not killed by SIGKILL (exit status $status)"
killed_at=$(last_train_step b/log/metrics.jsonl)
[ "$killed_at" -lt "$STEPS" ] ||
  fail "run B was killed after its last step ($killed_at of $STEPS): the test proves nothing"
latest=$(cat b/ckpt/latest)
echo "run B killed after step $killed_at; latest checkpoint $latest"
case "$latest" in
  step_000000[3-9]0 | step_00000[1-9][0-9]0) ;;
  *) fail "after the kill, ckpt/latest is \"$latest\"; expected a checkpoint at step 30 or later" ;;
esac

# Resume B to the end; (c) its log says where it resumed: the checkpoint `latest` named.
(cd b && "$TRAIN" --config run.json --resume >train_resumed.log 2>&1) ||
  fail "resumed run B failed: $(tail -n 5 b/train_resumed.log)"
resumed=$(sed -n 's/.*resumed from .* at step \([0-9]*\)$/\1/p' b/train_resumed.log)
[ -n "$resumed" ] || fail "the resumed run's log does not say \"resumed from\": $(head -n 5 b/train_resumed.log)"
[ "ckpt/$latest" = "$(sed -n 's/.*resumed from \(.*\) at step [0-9]*$/\1/p' b/train_resumed.log)" ] ||
  fail "run B resumed from another checkpoint than ckpt/$latest"
if [ "$resumed" -lt 30 ] || [ "$resumed" -gt "$killed_at" ]; then
  fail "run B resumed at step $resumed; expected a step in [30, $killed_at]"
fi
echo "run B resumed at step $resumed"

# (a) The final checkpoints are byte-identical, and so is the one before it: the same
# files (at ZeRO-3 the weights are in the optimizer shards), each the same bytes.
for step in $STEPS $((STEPS - INTERVAL)); do
  dir=$(printf 'ckpt/step_%08d' "$step")
  for f in state.json manifest.json; do
    [ -f "a/$dir/$f" ] || fail "a/$dir/$f is missing"
  done
  [ "$(ls "a/$dir")" = "$(ls "b/$dir")" ] ||
    fail "$dir holds other files in the resumed run: $(ls "b/$dir" | tr '\n' ' ')"
  for f in $(ls "a/$dir"); do
    cmp "a/$dir/$f" "b/$dir/$f" || fail "$dir/$f differs between the uninterrupted and the resumed run"
  done
done
[ "$(cat a/ckpt/latest)" = "$(printf 'step_%08d' "$STEPS")" ] || fail "a/ckpt/latest is $(cat a/ckpt/latest)"
[ "$(cat b/ckpt/latest)" = "$(printf 'step_%08d' "$STEPS")" ] || fail "b/ckpt/latest is $(cat b/ckpt/latest)"

# (b) The same records for every step, once each, timings aside.
deterministic() {
  sed -e 's/"elapsed_s":[^,}]*,\{0,1\}//' -e 's/"mfu":[^,}]*,\{0,1\}//' \
    -e 's/"tokens_per_s":[^,}]*,\{0,1\}//' "$1"
}
deterministic a/log/metrics.jsonl >a.records
deterministic b/log/metrics.jsonl >b.records
train_records=$(grep -c '"kind":"train"' a.records)
[ "$train_records" -eq "$STEPS" ] || fail "run A logged $train_records train records; expected $STEPS"
grep -q '"kind":"eval"' a.records || fail "run A logged no eval records"
sed -n 's/.*"kind":"train".*"step":\([0-9]*\),.*/\1/p' a.records >a.steps
seq 1 "$STEPS" | cmp -s - a.steps || fail "run A's train records are not steps 1..$STEPS in order"
if ! cmp -s a.records b.records; then
  diff a.records b.records | head -n 6 >&2
  fail "the metrics of the resumed run differ from the uninterrupted run's"
fi
# The CSV's deterministic columns (kind, step, loss, val_loss, lr, grad_norm) agree too.
cut -d, -f1-6 a/log/metrics.csv >a.csv
cut -d, -f1-6 b/log/metrics.csv >b.csv
cmp -s a.csv b.csv || fail "metrics.csv of the resumed run differs from the uninterrupted run's"

# Usually the killed run had logged steps past its last checkpoint, which the resumed run
# computed again and metrics.jsonl holds once.
[ "$killed_at" -gt "$resumed" ] || echo "note: the kill landed right after the checkpoint at $resumed"

echo "PASS: resumed at step $resumed after a SIGKILL at step $killed_at; $STEPS steps on" \
  "$THREADS threads bitwise equal in $(($(date +%s) - start)) s"
