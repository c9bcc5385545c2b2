#!/bin/sh
# Note [Exact resume] in tools/trainer/trainer.h for every parallel layout, with dropout on:
# under mpirun, run A trains uninterrupted; run B's ranks are all killed with SIGKILL
# between two checkpoints (a crashed job), and B is resumed with --resume. For each layout,
# the last two checkpoints must be byte-identical (every file: model and optimizer parts,
# per-rank state, state.json, manifest.json) and the metrics equal for every step.
#
# Layouts, as (pipe, data, model) with the ZeRO stage: data parallel at ZeRO-1, 2 and 3,
# a pipeline, tensor slicing, and the three pairs of them. Each stage of a pipeline and
# each slice draws its own dropout masks, so a stream restored from one rank's state alone
# would differ on the others.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/resume_after_kill_mpi"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"
. "$RUNFILES/tests/mpi_env.sh"

STEPS=60      # optimizer steps of each run
INTERVAL=10   # checkpoint interval
KILL_AFTER=15 # B is killed once it has logged this step (after the checkpoint at 10)

write_text text.txt 20000
prepare_chars text.txt

# config FILE PIPE TP ZERO: 4 heads of 24 channels (both slices divide), 4 layers (2 per
# stage), dropout 0.1; paths relative to the run directory, so A's and B's configs and
# state.json files are the same bytes.
config() {
  stage3=
  [ "$4" != 3 ] || stage3=', "stage3_param_persistence_threshold": 30'
  cat >"$1" <<JSON
{
  "train_batch_size": 8, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": $4$stage3},
  "pipeline": {"stages": $2},
  "tensor_parallel": {"tp_size": $3},
  "model": {"type": "gpt2", "vocab_size": $VOCAB, "block_size": 16, "n_layer": 4, "n_head": 4,
            "n_embd": 24, "dropout": 0.1},
  "data": {"train": "../../data/train_*.bin", "sampling": "random"},
  "trainer": {"steps": $STEPS, "seed": 17, "threads": 1, "log_dir": "log",
              "checkpoint_dir": "ckpt", "checkpoint_interval": $INTERVAL, "keep_last": 2}
}
JSON
}

# The step of the last complete train record in $1 (a metrics.jsonl), or 0.
last_train_step() {
  s=$(sed -n 's/.*"kind":"train".*"step":\([0-9]*\),.*/\1/p' "$1" 2>/dev/null | tail -n 1)
  echo "${s:-0}"
}

# deterministic FILE FIRST: the metrics without timings, and without the bytes sent in
# step FIRST, a process's first: ZeRO-3 records its module trace then and gathers without
# prefetching or retaining (Note [ZeRO-3 parameters] in parallel/zero/partitioned_params.h),
# so a resumed run sends more in its first step. The values are the same.
deterministic() {
  sed -e 's/"elapsed_s":[^,}]*,\{0,1\}//' -e 's/"mfu":[^,}]*,\{0,1\}//' \
    -e 's/"tokens_per_s":[^,}]*,\{0,1\}//' -e "/\"step\":$2,/s/\"comm_bytes\":[0-9]*,//" "$1"
}

# layout NAME NP PIPE TP ZERO: A uninterrupted, B killed and resumed, compared.
layout() {
  name=$1
  np=$2
  mkdir -p "$name/a" "$name/b"
  config "$name/a/$name.json" "$3" "$4" "$5"
  cp "$name/a/$name.json" "$name/b/$name.json"

  (cd "$name/a" && mpi_run 300 "$np" "$TRAIN" --config "$name.json" --comm-timeout 60 \
    >train.log 2>&1) || fail "$name: run A failed: $(tail -n 5 "$name/a/train.log")"

  # B: every rank is killed with SIGKILL once rank 0 has logged step KILL_AFTER.
  (cd "$name/b" && exec timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$np" \
    "$TRAIN" --config "$name.json" --comm-timeout 60 >train_killed.log 2>&1) &
  job=$!
  deadline=$(($(date +%s) + 240))
  while :; do
    step=$(last_train_step "$name/b/log/metrics.jsonl")
    if [ "$step" -ge "$KILL_AFTER" ]; then
      pkill -9 -f -- "--config $name.json" ||
        fail "$name: run B finished before it could be killed (step $step); make the run longer"
      break
    fi
    kill -0 "$job" 2>/dev/null || fail "$name: run B exited at step $step: $(tail -n 5 "$name/b/train_killed.log")"
    [ "$(date +%s)" -lt "$deadline" ] || fail "$name: run B did not reach step $KILL_AFTER in 240 s"
    sleep 0.02
  done
  code=0
  wait "$job" || code=$?
  [ "$code" -ne 0 ] || fail "$name: the killed run B exited with 0"
  killed_at=$(last_train_step "$name/b/log/metrics.jsonl")
  [ "$killed_at" -lt "$STEPS" ] || fail "$name: run B was killed after its last step"

  (cd "$name/b" && mpi_run 300 "$np" "$TRAIN" --config "$name.json" --resume --comm-timeout 60 \
    >train_resumed.log 2>&1) || fail "$name: resumed run B failed: $(tail -n 5 "$name/b/train_resumed.log")"
  resumed=$(sed -n 's/.*resumed from .* at step \([0-9]*\)$/\1/p' "$name/b/train_resumed.log")
  [ -n "$resumed" ] && [ "$resumed" -ge "$INTERVAL" ] ||
    fail "$name: run B did not resume from a checkpoint at step $INTERVAL or later: $(head -n 5 "$name/b/train_resumed.log")"

  for step in $STEPS $((STEPS - INTERVAL)); do
    dir=$(printf 'ckpt/step_%08d' "$step")
    files=$(cd "$name/a/$dir" && ls)
    [ "$files" = "$(cd "$name/b/$dir" && ls)" ] || fail "$name: $dir holds other files in A and B"
    for f in $files; do
      cmp -s "$name/a/$dir/$f" "$name/b/$dir/$f" ||
        fail "$name: $dir/$f differs between the uninterrupted and the resumed run"
    done
  done
  deterministic "$name/a/log/metrics.jsonl" $((resumed + 1)) >"$name/a.records"
  deterministic "$name/b/log/metrics.jsonl" $((resumed + 1)) >"$name/b.records"
  if ! cmp -s "$name/a.records" "$name/b.records"; then
    diff "$name/a.records" "$name/b.records" | head -n 6 >&2
    fail "$name: the metrics of the resumed run differ from the uninterrupted run's"
  fi
  echo "ok: $name (np $np) killed after step $killed_at, resumed at $resumed, bitwise equal"
}

start=$(date +%s)
layout data_z1 2 1 1 1
layout data_z2 2 1 1 2
layout data_z3 2 1 1 3
layout pipe 2 2 1 0
layout model 2 1 2 0
layout pipe_model 4 2 2 0
layout pipe_data 4 2 1 1
layout data_model 4 1 2 2
echo "PASS: 8 layouts resumed bit for bit after a SIGKILL in $(($(date +%s) - start)) s"
