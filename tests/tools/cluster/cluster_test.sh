#!/bin/sh
# tools/train across the hosts of tools/cluster/cluster.sh (Note [Namespace cluster]): three
# network-namespace hosts that talk over veth links by TCP only.
#   - ZeRO stages 1, 2 and 3 across 3 hosts give the single-process losses and weights
#     within 1e-6, as on one host (tests/tools/trainer/train_mpi_test.sh);
#   - the bytes the hosts' interfaces sent during the stage-2 run, against the bytes the
#     communicators counted (Note [Bytes sent] in parallel/comm/communicator.h): at least
#     those, at most 1.6 times (TCP/IP headers, MPI's protocol, Open MPI's own algorithms
#     and its out-of-band channel; the measured ratio is printed);
#   - a host whose link is cut mid-run ends the job: the ranks left stop within the
#     collective timeout, an error names the operation and the rank that did not answer,
#     the exit code is non-zero, and the last committed checkpoint loads;
#   - nothing of the cluster is left afterwards (cluster.sh down checks).
# Needs root, ip and tc: skipped, saying so, without them.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
CLUSTER="$RUNFILES/tools/cluster/cluster.sh"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "skipped: the namespace cluster needs root, ip and tc (uid $(id -u))"
  exit 0
fi
WORK="${TEST_TMPDIR:-$(mktemp -d)}/cluster"
. "$RUNFILES/tests/tools/trainer/tool_env.sh"
COMPARE="$RUNFILES/tests/tools/trainer/compare_runs"
ZERO_TO_FP32="$RUNFILES/tools/zero_to_fp32"
export TMPDIR="$WORK" OMP_NUM_THREADS=1

PREFIX="tc$(($$ % 1000000))"
trap '"$CLUSTER" down "$PREFIX"' EXIT
"$CLUSTER" up "$PREFIX" 3

write_text text.txt 20000
prepare_chars text.txt

# config NAME STAGE STEPS: writes NAME.json, logging to NAME/log and NAME/ckpt (the model
# and batch of train_mpi_test.sh, 12 sequences a step).
config() {
  stage3=
  [ "$2" != 3 ] || stage3=', "stage3_param_persistence_threshold": 30, "stage3_max_live_parameters": 6000'
  cat >"$1.json" <<JSON
{
  "train_batch_size": 12, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": $2, "reduce_bucket_size": 3000$stage3},
  "model": {"type": "gpt2", "vocab_size": $VOCAB, "block_size": 16, "n_layer": 2, "n_head": 5,
            "n_embd": 25, "bias": false},
  "data": {"train": "$WORK/data/train_*.bin", "sampling": "random"},
  "trainer": {"steps": $3, "seed": 11, "threads": 1, "log_dir": "$WORK/$1/log",
              "checkpoint_dir": "$WORK/$1/ckpt", "checkpoint_interval": 3, "keep_last": 0}
}
JSON
}

# sent_bytes: the bytes all hosts' interfaces have sent.
sent_bytes() {
  "$CLUSTER" bytes "$PREFIX" | awk '{s += $2} END {print s}'
}

config single 0 6
"$TRAIN" --config single.json >single.log 2>&1 || fail "the single-process run failed: $(tail -n 5 single.log)"
for stage in 1 2 3; do
  name="s${stage}_hosts3"
  config "$name" "$stage" 6
  before=$(sent_bytes)
  timeout 240 "$CLUSTER" mpirun "$PREFIX" 3 -- "$TRAIN" --config "$WORK/$name.json" --comm-timeout 60 \
    >"$name.log" 2>&1 || fail "$name failed: $(tail -n 5 "$name.log")"
  [ "$stage" != 2 ] || wire=$(($(sent_bytes) - before))
  "$COMPARE" single "$name" 1e-6 || fail "$name differs from the single-process run"
done
echo "ok: ZeRO stages 1-3 across 3 hosts equal one process"

# The communicators' count: rank 0's bytes per op (every rank of these symmetric
# collectives sends as much), times 3.
counted=$(sed -n 's/.*\] *\(all_reduce\|reduce_scatter\|all_gather\|broadcast\): [0-9]* calls, \([0-9.]*\) MB sent.*/\2/p' \
  s2_hosts3.log | awk '{s += $1} END {printf "%.0f", s * 1e6 * 3}')
[ "$counted" -gt 0 ] || fail "no communication summary in s2_hosts3.log: $(grep -i 'sent' s2_hosts3.log | head -n 3)"
ratio=$(awk -v w="$wire" -v c="$counted" 'BEGIN {printf "%.3f", w / c}')
echo "stage 2 across 3 hosts: $wire bytes on the wire, $counted counted by the communicators: ratio $ratio"
awk -v r="$ratio" 'BEGIN {exit !(r >= 1.0 && r <= 1.6)}' ||
  fail "wire bytes / counted bytes = $ratio; expected 1.0 to 1.6"
echo "ok: the wire carried $ratio times the bytes the communicators counted"

# A cut link: host 2's bridge port goes down at step 3 of a long run.
config cut 1 100000
timeout 120 "$CLUSTER" mpirun "$PREFIX" 3 -- "$TRAIN" --config "$WORK/cut.json" --comm-timeout 5 \
  >cut.log 2>&1 &
job=$!
deadline=$(($(date +%s) + 60))
until grep -q '"step":3,' cut/log/metrics.jsonl 2>/dev/null; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "cut: the run did not reach step 3 in 60 s: $(tail -n 5 cut.log)"
  sleep 0.1
done
start=$(date +%s)
"$CLUSTER" cut "$PREFIX" 2
code=0
wait "$job" || code=$?
took=$(($(date +%s) - start))
[ "$code" -ne 0 ] && [ "$code" -ne 124 ] || fail "cut: expected the job to fail, found exit code $code after $took s"
[ "$took" -lt 60 ] || fail "cut: the job took $took s to end after the link was cut"
grep -Eq '\[train\] step [0-9]+: \[comm world, rank [01] of 3\] [a-z_]+ #[0-9]+: timed out after 5000 ms: rank\(s\) 2 did not answer a roll call' cut.log ||
  fail "cut: no error naming rank 2: $(grep -i error cut.log | head -n 3)"
"$ZERO_TO_FP32" --checkpoint cut/ckpt --out cut.safetensors >cut.fp32.log 2>&1 ||
  fail "cut: the last committed checkpoint does not load: $(cat cut.fp32.log)"
echo "ok: a cut link ends the job in $took s, naming rank 2; the last checkpoint loads"
