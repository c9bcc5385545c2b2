#!/bin/sh
# network_bench: the README's model trained data-parallel across 4 hosts of the namespace
# cluster (tools/cluster/cluster.sh, Note [Namespace cluster]) behind links of a given rate,
# with AdamW and the three 1-bit optimizers: tokens/s once the 1-bit ones compress (after
# their warm-up), the speed-up over AdamW at the same rate, and rank 0's gradient bytes per
# step as its communicator counted them. Needs root; run after `bazel build //tools:train`
# and `bash tools/setup.sh` (the Tiny Shakespeare shards), from the repository root:
#
#   sudo sh tools/bench/network_bench.sh                       # 100mbit 1gbit 10gbit
#   sudo RATES="1gbit" STEPS=80 sh tools/bench/network_bench.sh
#
# Each host's eth0 sends at most RATE (a token bucket, cluster.sh's `shape rate`), so a ring step between hosts runs at
# the link's rate; the hosts' CPU is this machine's, shared. DeepSpeed's figures, for
# comparison (its tutorials, BERT-Large on bandwidth-limited clusters): 1-bit Adam up to 5x
# less communication and up to 3.4x faster; 0/1 Adam up to 26x less communication; 1-bit
# LAMB up to 4.6x less communication.
set -eu

ROOT=$(pwd)
TRAIN="$ROOT/bazel-bin/tools/train"
CLUSTER="$ROOT/tools/cluster/cluster.sh"
DATA="$ROOT/.data/shakespeare_char"
RATES=${RATES:-"100mbit 1gbit 10gbit"}
HOSTS=4
WARM=${WARM:-20}    # full-precision steps of the 1-bit optimizers (freeze_step)
STEPS=${STEPS:-60}  # steps in all; the timed ones start 5 after WARM
WORK=$(mktemp -d "${TMPDIR:-/tmp}/network_bench.XXXXXX")
PREFIX="nb$(($$ % 1000000))"

[ -x "$TRAIN" ] || { echo "network_bench: expected $TRAIN; run bazel build //tools:train" >&2; exit 1; }
ls "$DATA"/train_*.bin >/dev/null 2>&1 ||
  { echo "network_bench: expected the shards in $DATA; run bash tools/setup.sh" >&2; exit 1; }
[ "$STEPS" -gt $((WARM + 10)) ] || { echo "network_bench: expected STEPS > WARM + 10" >&2; exit 1; }
trap '"$CLUSTER" down "$PREFIX"; rm -rf "$WORK"' EXIT
"$CLUSTER" up "$PREFIX" "$HOSTS"

# config NAME TYPE PARAMS: the README's model (configs/shakespeare_char.json), 12 sequences
# per rank, no evaluation, sample or checkpoint.
config() {
  cat >"$WORK/$1.json" <<JSON
{
  "train_batch_size": $((12 * HOSTS)), "gradient_accumulation_steps": 1,
  "optimizer": {"type": "$2", "params": {"lr": 1e-3, "weight_decay": 0.0$3}},
  "gradient_clipping": 1.0,
  "model": {"type": "gpt2", "vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4,
            "n_embd": 128, "dropout": 0.0, "bias": true},
  "data": {"train": "$DATA/train_*.bin", "sampling": "random"},
  "trainer": {"steps": $STEPS, "seed": 1337, "threads": 1, "log_dir": "$WORK/$1",
              "checkpoint_dir": "$WORK/$1/ckpt", "checkpoint_interval": -1,
              "sample": {"tokens": 0}}
}
JSON
}

# measure NAME: "tokens/s bytes-per-step" over the steps after WARM + 5.
measure() {
  awk -v first=$((WARM + 5)) -v tokens=$((12 * HOSTS * 64)) -F'[,:}]' '
    /"kind":"train"/ {
      for (i = 1; i < NF; i++) {
        if ($i ~ /"step"$/) step = $(i + 1)
        if ($i ~ /"elapsed_s"$/) t = $(i + 1)
        if ($i ~ /"comm_bytes"$/) b = $(i + 1)
      }
      if (step == first) t0 = t
      if (step > first) { n++; bytes += b; t1 = t }
    }
    END { printf "%.0f %.0f", n * tokens / (t1 - t0), bytes / n }' "$WORK/$1/metrics.jsonl"
}

printf "%-8s %-12s %10s %8s %16s\n" rate optimizer tokens/s speed-up "grad bytes/step"
for rate in $RATES; do
  i=0
  while [ "$i" -lt "$HOSTS" ]; do
    "$CLUSTER" shape "$PREFIX" "$i" rate "$rate"
    i=$((i + 1))
  done
  base=
  for opt in AdamW OneBitAdam ZeroOneAdam OneBitLamb; do
    case $opt in
    AdamW) extra= ;;
    ZeroOneAdam) extra=", \"var_freeze_step\": $WARM" ;;
    *) extra=", \"freeze_step\": $WARM" ;;
    esac
    name="${rate}_$opt"
    config "$name" "$opt" "$extra"
    "$CLUSTER" mpirun "$PREFIX" "$HOSTS" -- "$TRAIN" --config "$WORK/$name.json" \
      --comm-timeout 600 >"$WORK/$name.log" 2>&1 ||
      { echo "network_bench: $name failed: $(tail -n 5 "$WORK/$name.log")" >&2; exit 1; }
    set -- $(measure "$name")
    [ -n "$base" ] || base=$1
    printf "%-8s %-12s %10s %7.2fx %16s\n" "$rate" "$opt" "$1" \
      "$(awk -v a="$1" -v b="$base" 'BEGIN {print a / b}')" "$2"
  done
done
