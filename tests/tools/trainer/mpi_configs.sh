# Sourced by the trainer's mpirun tests (train_mpi_test.sh, tests/tools/cluster/
# cluster_test.sh): writers of their small run configs, with paths relative to the working
# directory, where mpirun's ranks start. VOCAB must be set (tool_env.sh's prepare_chars).

# config NAME STAGE STEPS [BATCH_KEYS [MORE_KEYS]]: writes NAME.json, logging to NAME/log
# and NAME/ckpt. $ZERO_KEYS, when set, is spliced into zero_optimization.
# No biases: the key bias is pure rounding noise under Adam (tests/parallel/zero_optimizer_test.cc).
config() {
  batch=${4:-'"train_batch_size": 8, "gradient_accumulation_steps": 2'}
  # Stage 3: parameters above 30 elements partitioned, at most 6000 gathered (wte: 3200).
  stage3=
  [ "$2" != 3 ] || stage3=', "stage3_param_persistence_threshold": 30, "stage3_max_live_parameters": 6000'
  cat >"$1.json" <<JSON
{
  $batch,${5:+
  $5,}
  "steps_per_print": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": $2, "reduce_bucket_size": 3000$stage3${ZERO_KEYS:-}},
  "model": {"type": "gpt2", "vocab_size": $VOCAB, "block_size": 16, "n_layer": 2, "n_head": 5,
            "n_embd": 25, "bias": false},
  "data": {"train": "data/train_*.bin", "sampling": "random"},
  "trainer": {"steps": $3, "seed": 11, "threads": 1, "log_dir": "$1/log",
              "checkpoint_dir": "$1/ckpt", "checkpoint_interval": 3, "keep_last": 0}
}
JSON
}

# config3d NAME PIPE TP ZERO [SPLIT]: the 3D layout (PIPE, data, TP) with ZeRO stage ZERO, 4
# heads of 6 channels (both slices divide), micro-batches cut into SPLIT pieces
# (tensor_parallel.batch_split, default 1); writes NAME.json, logging to NAME/log and NAME/ckpt.
config3d() {
  cat >"$1.json" <<JSON
{
  "train_batch_size": 8, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": $4},
  "pipeline": {"stages": $2},
  "tensor_parallel": {"tp_size": $3, "batch_split": ${5:-1}},
  "model": {"type": "gpt2", "vocab_size": $VOCAB, "block_size": 16, "n_layer": 2, "n_head": 4,
            "n_embd": 24, "bias": false},
  "data": {"train": "data/train_*.bin", "sampling": "random"},
  "trainer": {"steps": 6, "seed": 11, "threads": 1, "log_dir": "$1/log",
              "checkpoint_dir": "$1/ckpt", "checkpoint_interval": 3, "keep_last": 0}
}
JSON
}
