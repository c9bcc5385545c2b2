#!/bin/sh
# tools/train with a GPT-MoE under mpirun (Note [Expert parameters] in
# parallel/zero/zero_optimizer.h, Note [Expert checkpoints] in parallel/engine/engine.h):
#   - with no token dropped, no auxiliary loss and no noise in the second choice (each
#     token's loss then its own), 3 ranks at ep_size 1 and 4 ranks at ep_size 2 (ZeRO-2)
#     give the single-process losses and weights within 1e-5;
#   - the 4-rank run's checkpoint holds expp_rank_0 and expp_rank_1, and resumes on 2 ranks
#     at ep_size 1 within 1e-5 of the uninterrupted run;
#   - every step's metrics record the all-to-all bytes.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/train_moe_mpi"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"
COMPARE="$RUNFILES/tests/tools/trainer/compare_runs"
. "$RUNFILES/tests/mpi_env.sh"

write_text text.txt 20000
prepare_chars text.txt

# config NAME STAGE EP: writes NAME.json, logging to NAME/log and NAME/ckpt.
config() {
  cat >"$1.json" <<JSON
{
  "train_batch_size": 24, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": $2},
  "model": {"type": "gpt2", "vocab_size": $VOCAB, "block_size": 16, "n_layer": 2, "n_head": 5,
            "n_embd": 25, "bias": false,
            "moe": {"num_experts": 4, "k": 2, "ep_size": $3, "drop_tokens": false,
                    "aux_loss_coef": 0, "top2_2nd_expert_sampling": false}},
  "data": {"train": "data/train_*.bin", "sampling": "random"},
  "trainer": {"steps": 6, "seed": 11, "threads": 1, "log_dir": "$1/log",
              "checkpoint_dir": "$1/ckpt", "checkpoint_interval": 3, "keep_last": 0}
}
JSON
}

config single 0 1
"$TRAIN" --config single.json >single.log 2>&1 || fail "the single-process run failed: $(tail -n 5 single.log)"

# name NP STAGE EP
for run in "np3_ep1 3 1 1" "np4_ep2 4 2 2"; do
  set -- $run
  config "$1" "$3" "$4"
  mpi_run 240 "$2" "$TRAIN" --config "$1.json" --comm-timeout 60 >"$1.log" 2>&1 ||
    fail "$1 failed: $(tail -n 5 "$1.log")"
  "$COMPARE" single "$1" 1e-5 || fail "$1 differs from the single-process run"
done
echo "ok: 3 ranks at ep_size 1 and 4 ranks at ep_size 2 equal one process"

for e in 0 1; do
  for kind in model optim; do
    [ -e "np4_ep2/ckpt/step_00000003/expp_rank_${e}_${kind}_states.safetensors" ] ||
      fail "the ep_size 2 checkpoint has no expp_rank_${e}_${kind}_states.safetensors"
  done
done
[ "$(grep -c '"all_to_all_bytes":[1-9]' np4_ep2/log/metrics.jsonl)" = 6 ] ||
  fail "expected all-to-all bytes in each of the 6 steps' metrics: $(head -n 2 np4_ep2/log/metrics.jsonl)"

name=resume_np2_ep1
config "$name" 1 1
mkdir -p "$name/ckpt" "$name/log"
cp -r np4_ep2/ckpt/step_00000003 "$name/ckpt/"
echo step_00000003 >"$name/ckpt/latest"
grep '"step":[123],' np4_ep2/log/metrics.jsonl >"$name/log/metrics.jsonl"
mpi_run 240 2 "$TRAIN" --config "$name.json" --resume --comm-timeout 60 >"$name.log" 2>&1 ||
  fail "$name failed: $(tail -n 5 "$name.log")"
"$COMPARE" np4_ep2 "$name" 1e-5 || fail "$name does not continue the ep_size 2 run"
echo "ok: the ep_size 2 checkpoint holds each expert-parallel rank's experts and resumes at ep_size 1"
