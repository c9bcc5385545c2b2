#!/bin/sh
# tools/train refuses bad flags (exit code 2, the message and the usage) and bad configs and
# data files (exit code 1, one line naming the JSON path or the file), before it writes a
# checkpoint or a log.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/train_errors"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"

awk 'BEGIN { for (i = 0; i < 3000; i++) printf "line %d: the quick brown fox jumps over the lazy dog.\n", i }' >text.txt
prepare_chars text.txt

# A shard whose header is 1024 zero bytes (no magic), followed by valid tokens.
head -c 1024 /dev/zero >data/nomagic.bin
tail -c +1025 data/train_000000.bin >>data/nomagic.bin

# config NAME VOCAB TRAIN [EXTRA [STEPS]]: writes NAME.json (a valid tiny run with
# model.vocab_size VOCAB and data.train TRAIN; EXTRA is spliced into the top-level object,
# STEPS replaces the trainer's "steps": 3, "checkpoint_dir": "runs/NAME/ckpt").
config() {
  steps=${5:-"\"steps\": 3, \"checkpoint_dir\": \"runs/$1/ckpt\""}
  cat >"$1.json" <<EOF
{
  "train_batch_size": 4,
  ${4:-}
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "model": {"type": "gpt2", "vocab_size": $2, "block_size": 16, "n_layer": 1, "n_head": 2,
            "n_embd": 16},
  "data": {"train": "$3", "val": "data/val_*.bin"},
  "trainer": {"threads": 1, "log_dir": "runs/$1", $steps}
}
EOF
}

# expect NAME CODE WANT: runs train on NAME.json; checks the exit code, that stderr is one
# line (exit code 1) containing WANT, and that no checkpoint and no log were written.
expect() {
  code=0
  "$TRAIN" --config "$1.json" >"$1.out" 2>"$1.err" || code=$?
  [ "$code" -eq "$2" ] || fail "$1: exit code $code, expected $2; stderr: $(cat "$1.err")"
  lines=$(wc -l <"$1.err")
  [ "$lines" -eq 1 ] || fail "$1: expected a one-line message, found $lines lines: $(cat "$1.err")"
  grep -qF -- "$3" "$1.err" || fail "$1: the message does not contain '$3': $(cat "$1.err")"
  [ ! -e "runs/$1" ] || fail "$1: the failed run created runs/$1"
  echo "ok $1: $(cat "$1.err")"
}

# A valid config runs (so that the failures below are the ones intended), and with
# wall_clock_breakdown reports DeepSpeed's fwd, bwd and step times at each print step.
config good "$VOCAB" "data/train_*.bin" '"wall_clock_breakdown": true, "steps_per_print": 1,'
"$TRAIN" --config good.json >good.out 2>&1 || fail "the valid config failed: $(tail -n 3 good.out)"
[ -f runs/good/ckpt/latest ] || fail "the valid run wrote no checkpoint"
[ "$(grep -cE 'time \(ms\) \| fwd: [0-9.]+ \| bwd: [0-9.]+ \| step: [0-9.]+$' good.out)" = 3 ] ||
  fail "expected 3 wall_clock_breakdown lines (one per step): $(cat good.out)"

# Bad flags: exit code 2, the message first, then the usage.
for args in "--config good.json --bogus" "--config" "--config good.json --resume --no-resume" \
  "good.json" ""; do
  code=0
  # shellcheck disable=SC2086 # split on purpose
  "$TRAIN" $args >flags.out 2>flags.err || code=$?
  [ "$code" -eq 2 ] || fail "train $args: exit code $code, expected 2: $(cat flags.err)"
  grep -q '^usage: train --config FILE' flags.err || fail "train $args: no usage on stderr"
done
"$TRAIN" --config good.json --bogus 2>flags.err || true
[ "$(head -n 1 flags.err)" = "train: unknown flag --bogus" ] ||
  fail "unknown flag: first line is '$(head -n 1 flags.err)'"
"$TRAIN" 2>flags.err || true
[ "$(head -n 1 flags.err)" = "train: --config is required" ] ||
  fail "no --config: first line is '$(head -n 1 flags.err)'"
# Communication timeouts outside 1 ms to a week (or not numbers) are usage errors, not an
# int64 overflow or a zero timeout.
for value in inf 1e300 1e-9 nan -1 0; do
  code=0
  "$TRAIN" --config good.json --comm-timeout "$value" >flags.out 2>flags.err || code=$?
  [ "$code" -eq 2 ] || fail "--comm-timeout $value: exit code $code, expected 2: $(cat flags.err)"
  [ "$(head -n 1 flags.err)" = "train: --comm-timeout expected seconds in [0.001, 604800] (1 ms to a week), found $value" ] ||
    fail "--comm-timeout $value: first line is '$(head -n 1 flags.err)'"
done
"$TRAIN" --help >help.out 2>&1 || fail "--help exited with $?"
grep -q '^usage: train' help.out || fail "--help printed no usage"

# --check-config validates the config for --world ranks and prints what it resolves to,
# without training or writing anything; a bad config fails as a run would.
config checked "$VOCAB" "data/train_*.bin"
"$TRAIN" --check-config --config checked.json --world 2 >check.out 2>&1 ||
  fail "--check-config: $(cat check.out)"
for want in "checked.json: valid for 2 rank(s)" \
  "ranks: 2 = 1 pipeline stage(s) x 2 data-parallel x 1 tensor-parallel" \
  "batch: train_batch_size 4 = micro-batch 2 x accumulation 1 x 2 data-parallel rank(s)" \
  "precision: f32; ZeRO stage 0" "data: 1 training shard(s), 1 validation shard(s)"; do
  grep -qF -- "$want" check.out || fail "--check-config: no '$want' in: $(cat check.out)"
done
[ ! -e runs/checked ] || fail "--check-config created runs/checked"
code=0
"$TRAIN" --check-config --config checked.json --world 3 >check3.out 2>&1 || code=$?
[ "$code" -eq 1 ] && grep -qF "train_batch_size is not equal to" check3.out ||
  fail "--check-config at 3 ranks: exit code $code: $(cat check3.out)"
code=0
"$TRAIN" --config checked.json --world 2 >flags.out 2>flags.err || code=$?
[ "$code" -eq 2 ] && grep -qF "train: --world is for --check-config" flags.err ||
  fail "--world without --check-config: exit code $code: $(cat flags.err)"
code=0
"$TRAIN" --check-config --config checked.json --resume >flags.out 2>flags.err || code=$?
[ "$code" -eq 2 ] && grep -qF "train: --resume is for a run; --check-config trains nothing" flags.err ||
  fail "--check-config --resume: exit code $code: $(cat flags.err)"
echo "ok check-config"

# --thread-ranks N runs N ranks in this process: the world the batch keys are resolved for.
config threads "$VOCAB" "data/train_*.bin"
"$TRAIN" --config threads.json --thread-ranks 2 >threads.out 2>&1 ||
  fail "--thread-ranks 2: $(tail -n 3 threads.out)"
grep -qF "2 data-parallel rank(s)" threads.out || fail "--thread-ranks 2 ran: $(cat threads.out)"
[ -f runs/threads/ckpt/latest ] || fail "--thread-ranks 2 wrote no checkpoint"
code=0
"$TRAIN" --config threads.json --thread-ranks 3 >flags.out 2>flags.err || code=$?
[ "$code" -eq 1 ] && grep -qF "train_batch_size is not equal to" flags.err ||
  fail "--thread-ranks 3 against a batch of 4: exit code $code: $(cat flags.err)"
for value in 0 1025 x; do
  code=0
  "$TRAIN" --config threads.json --thread-ranks "$value" >flags.out 2>flags.err || code=$?
  [ "$code" -eq 2 ] || fail "--thread-ranks $value: exit code $code, expected 2: $(cat flags.err)"
  head -n 1 flags.err | grep -qF -- "--thread-ranks" ||
    fail "--thread-ranks $value: first line is '$(head -n 1 flags.err)'"
done
echo "ok thread-ranks"

# Resume falls back to the newest committed checkpoint that loads (Note [Resume fallback]).
config fallback "$VOCAB" "data/train_*.bin" "" \
  '"steps": 4, "checkpoint_dir": "runs/fallback/ckpt", "checkpoint_interval": 2'
"$TRAIN" --config fallback.json >fallback1.out 2>&1 || fail "fallback run: $(tail -n 3 fallback1.out)"
[ -d runs/fallback/ckpt/step_00000002 ] && [ -d runs/fallback/ckpt/step_00000004 ] ||
  fail "fallback run: expected checkpoints at steps 2 and 4, found $(ls runs/fallback/ckpt)"
# A missing latest pointer: the newest committed step, with a warning (not step 0).
rm runs/fallback/ckpt/latest
"$TRAIN" --config fallback.json >fallback2.out 2>&1 || fail "no latest: $(tail -n 3 fallback2.out)"
grep -qF "runs/fallback/ckpt/latest is missing; resuming from the newest committed step" \
  fallback2.out || fail "no latest: no warning: $(cat fallback2.out)"
grep -qF "resumed from runs/fallback/ckpt/step_00000004 at step 4" fallback2.out ||
  fail "no latest: did not resume from step 4: $(cat fallback2.out)"
# A damaged newest step: the previous one, with a warning naming the damage.
printf 'x' >>runs/fallback/ckpt/step_00000004/state.json
"$TRAIN" --config fallback.json >fallback3.out 2>&1 || fail "damaged step 4: $(tail -n 3 fallback3.out)"
grep -qF "cannot resume from runs/fallback/ckpt/step_00000004: [checkpoint] runs/fallback/ckpt/step_00000004/state.json: expected" \
  fallback3.out || fail "damaged step 4: no warning: $(cat fallback3.out)"
grep -qF "resumed from runs/fallback/ckpt/step_00000002 at step 2" fallback3.out ||
  fail "damaged step 4: did not resume from step 2: $(cat fallback3.out)"
# Every step damaged: an error, not a silent start from step 0.
for d in runs/fallback/ckpt/step_*; do printf 'x' >>"$d/state.json"; done
code=0
"$TRAIN" --config fallback.json >fallback4.out 2>fallback4.err || code=$?
[ "$code" -eq 1 ] || fail "every step damaged: exit code $code, expected 1: $(cat fallback4.err)"
grep -qF "train: error: [train] no checkpoint in runs/fallback/ckpt loads (the newest: [checkpoint]" \
  fallback4.err || fail "every step damaged: $(cat fallback4.err)"
echo "ok fallback"

# Two trainers on one run directory: the second fails at once, naming the first's pid.
config locked "$VOCAB" "data/train_*.bin"
sed 's/"steps": 3/"steps": 1000000/' locked.json >locked_long.json
"$TRAIN" --config locked_long.json >locked1.out 2>&1 &
first=$!
i=0
while [ ! -s runs/locked/.lock ] && [ $i -lt 600 ]; do
  sleep 0.1
  i=$((i + 1))
done
code=0
"$TRAIN" --config locked.json >locked2.out 2>locked2.err || code=$?
kill "$first" 2>/dev/null || true
wait "$first" 2>/dev/null || true
[ "$code" -eq 1 ] || fail "a second trainer on runs/locked: exit code $code, expected 1: $(cat locked2.err)"
grep -qF "runs/locked is in use by process $first (it holds runs/locked/.lock)" locked2.err ||
  fail "a second trainer on runs/locked: $(cat locked2.err)"
echo "ok locked: $(cat locked2.err)"

# Bad configs.
# A checkpoint directory that cannot be created fails at start-up, before any step.
config unwritable "$VOCAB" "data/train_*.bin" "" '"steps": 3, "checkpoint_dir": "/proc/nope/ckpt"'
expect unwritable 1 \
  'train: error: [train] trainer.checkpoint_dir: expected a directory that can be created, found /proc/nope/ckpt'
config unknown_key "$VOCAB" "data/train_*.bin" '"gradient_acumulation_steps": 1,'
expect unknown_key 1 \
  'train: error: [config] unknown key $.gradient_acumulation_steps; did you mean "gradient_accumulation_steps"?'
config nested_key "$VOCAB" "data/train_*.bin" '"zero_optimization": {"stage": 0, "stag3": 1},'
expect nested_key 1 'unknown key $.zero_optimization.stag3; did you mean "stage"?'
config wrong_type "$VOCAB" "data/train_*.bin" '"gradient_clipping": "1.0",'
expect wrong_type 1 '[config] $.gradient_clipping: expected number, found string "1.0"'
config batch "$VOCAB" "data/train_*.bin" '"train_micro_batch_size_per_gpu": 3,'
expect batch 1 'Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 4 != 3 * 1 * 1'
config comm_dtype "$VOCAB" "data/train_*.bin" '"fp16": {"enabled": true}, "communication_data_type": "int8",'
expect comm_dtype 1 '[config] $.communication_data_type: expected "fp32", "fp16" or "bf16", found "int8"'
printf '{"train_batch_size": 4, "train_batch_size": 8}\n' >duplicate.json
expect duplicate 1 'duplicate.json: duplicate key "train_batch_size" in $'
expect missing_file 1 '[json] cannot open "missing_file.json"'

# Bad data files.
config nomagic "$VOCAB" "data/nomagic.bin"
expect nomagic 1 '[shard] "data/nomagic.bin": header[0] (magic) expected 20240520, found 0'
config no_shards "$VOCAB" "data/nothing_*.bin"
expect no_shards 1 '[loader] expected at least one file matching "data/nothing_*.bin", found none'
head -c 1100 data/train_000000.bin >data/truncated.bin
config truncated "$VOCAB" "data/truncated.bin"
expect truncated 1 '[shard] "data/truncated.bin": file size expected'
# A model vocabulary smaller than the data's: the first token out of range is named by file
# and byte offset.
config vocab $((VOCAB - 4)) "data/train_*.bin"
expect vocab 1 "[shard] \"data/train_000000.bin\": token "
grep -q "(byte offset [0-9]*) expected < vocab size $((VOCAB - 4)), found [0-9]*" vocab.err ||
  fail "vocab: the message does not name the byte offset: $(cat vocab.err)"

# --resume without a checkpoint is an error too, and creates nothing.
config no_ckpt "$VOCAB" "data/train_*.bin"
code=0
"$TRAIN" --config no_ckpt.json --resume >no_ckpt.out 2>no_ckpt.err || code=$?
[ "$code" -eq 1 ] || fail "--resume without a checkpoint: exit code $code, expected 1"
grep -qF -- '[train] --resume: expected a checkpoint in runs/no_ckpt/ckpt, found no "latest" there' \
  no_ckpt.err || fail "--resume without a checkpoint: $(cat no_ckpt.err)"
[ ! -e runs/no_ckpt/ckpt ] || fail "--resume without a checkpoint created runs/no_ckpt/ckpt"

echo PASS
