// A training run's JSON config: DeepSpeed's engine keys plus Tessera's `model`, `data` and
// `trainer` sections (configs/README.md documents every key).
//
//   {
//     "train_batch_size": 12, "gradient_accumulation_steps": 1, "steps_per_print": 10,
//     "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.99]}},
//     "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2000, ...}},
//     "gradient_clipping": 1.0,
//     "model": {"type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64,
//               "vocab_size": 65, "checkpoint_activations": false, "init_from": "x.safetensors"},
//     "sparse_attention": {"mode": "fixed", "block": 16, "attention": "unidirectional"},
//     "data": {"train": ".data/shakespeare_char/train_*.bin", "val": "...val_*.bin",
//              "tokenizer": ".data/shakespeare_char/tokenizer.json", "sampling": "random"},
//     "trainer": {"steps": 2000, "eval_interval": 250, "eval_batches": 20, "seed": 1337,
//                 "log_dir": ".runs/x", "checkpoint_dir": ".runs/x/checkpoints",
//                 "checkpoint_interval": 500, "keep_last": 3, "threads": 0,
//                 "sample": {"tokens": 500, "prompt": "\n", "temperature": 0.8, "top_k": 200}}
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "models/model_spec.h"
#include "parallel/engine_config.h"
#include "tools/trainer/flops_profiler.h"
#include "tools/trainer/monitor.h"

namespace tessera::train {

struct DataConfig {
  std::string train;      // glob of training shards
  std::string val;        // glob of validation shards; empty: no evaluation
  std::string tokenizer;  // tokenizer.json; default: beside the first training shard
  bool random = true;     // "sampling": "random" (nanoGPT) or "sequential" (llm.c)
  int64_t seq_len = 0;    // T; default block_size
};

struct SampleConfig {
  int64_t tokens = 0;  // 0: no sample at the end
  std::string prompt = "\n";
  double temperature = 1.0;
  int64_t top_k = 0;   // 0: off
  double top_p = 1.0;  // 1: off
};

struct TrainerConfig {
  int64_t steps = 0;  // optimizer steps; or derived from epochs
  std::optional<double> epochs;
  int64_t eval_interval = 0;  // 0: only at the end
  int64_t eval_batches = 20;
  uint64_t seed = 1337;
  std::string log_dir;         // metrics.jsonl, metrics.csv
  std::string checkpoint_dir;  // empty: no checkpoints
  // Steps between checkpoints; 0: only at the end; -1: never.
  int64_t checkpoint_interval = 0;
  int64_t keep_last = 3;          // 0: keep every checkpoint
  int64_t threads = 0;            // 0: all cores
  Device device = Device::cpu();  // where the model trains: "cpu", "cuda" or "cuda:N"
  bool no_decay_1d = true;        // no weight decay on biases and norm weights
  std::vector<std::string> no_decay_names;
  SampleConfig sample;
};

struct RunConfig {
  std::string source;   // the config file
  nlohmann::json json;  // the document as read (saved with checkpoints)
  parallel::EngineConfig engine;
  // The model section, with the top-level DeepSpeed sparse_attention section the model
  // attends through (Note [Model kinds] in models/model_spec.h).
  std::shared_ptr<const ModelSpec> model;
  bool checkpoint_activations = false;
  std::string init_from;  // weights to start from (.safetensors Hugging Face, or llm.c .bin)
  DataConfig data;
  TrainerConfig trainer;
  MonitorConfig monitors;  // DeepSpeed's tensorboard, csv_monitor, wandb and comet sections
  FlopsProfilerConfig flops_profiler;  // DeepSpeed's flops_profiler section
  std::vector<std::string> warnings;
  // The "auto" values (and absent keys) filled from Tessera's sections, one line each
  // (Note ["auto" values] in tools/trainer/auto_values.h).
  std::vector<std::string> auto_filled;
};

// Parses and validates the whole document; every error is one line with its JSON path.
// `default_run_dir` fills log_dir/checkpoint_dir when absent (".runs/<config stem>"). The
// batch triple is resolved over the data-parallel ranks of `world_size` (world / (pipeline
// stages x tp_size)).
RunConfig parse_run_config(const nlohmann::json& doc, const std::string& source,
                           const std::string& default_run_dir, int64_t world_size = 1);
// Reads `path` strictly (duplicate keys are errors) and parses it.
RunConfig load_run_config(const std::string& path, int64_t world_size = 1);

}  // namespace tessera::train
