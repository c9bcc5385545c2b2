// A valid run config (the shape of configs/shakespeare_char.json) and its edits, parsed or
// failing, for the run-config tests.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/json.h"
#include "models/gpt2/spec.h"
#include "tests/testing.h"
#include "tools/trainer/run_config.h"

namespace tessera::testing {

// The shape of configs/shakespeare_char.json.
inline nlohmann::json base_config() {
  return parse_json(R"({
    "train_batch_size": 12,
    "train_micro_batch_size_per_gpu": 12,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 100,
    "optimizer": {
      "type": "AdamW",
      "params": {"lr": 1e-3, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.1}
    },
    "scheduler": {
      "type": "WarmupCosineLR",
      "params": {"total_num_steps": 2000, "warmup_num_steps": 100, "warmup_type": "linear",
                 "warmup_min_ratio": 0.0, "cos_min_ratio": 0.1}
    },
    "gradient_clipping": 1.0,
    "model": {"type": "gpt2", "vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4,
              "n_embd": 128, "dropout": 0.0, "bias": true},
    "data": {"train": ".data/shakespeare_char/train_*.bin",
             "val": ".data/shakespeare_char/val_*.bin", "sampling": "random"},
    "trainer": {"steps": 2000, "eval_interval": 250, "eval_batches": 20, "seed": 1337,
                "log_dir": ".runs/shakespeare_char",
                "checkpoint_dir": ".runs/shakespeare_char/checkpoints",
                "checkpoint_interval": 500, "keep_last": 2,
                "sample": {"tokens": 500, "prompt": "\n", "temperature": 0.8, "top_k": 200}}
  })",
                    "base_config");
}

inline train::RunConfig parse(const nlohmann::json& doc, int64_t world = 1) {
  return train::parse_run_config(doc, "run.json", ".runs/run", world);
}

// The config after `edit`, parsed.
inline train::RunConfig parse_edited(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json doc = base_config();
  edit(doc);
  return parse(doc);
}

// The GPT config of a gpt2 run.
inline const GptConfig& gpt(const train::RunConfig& c) {
  return dynamic_cast<const GptSpec&>(*c.model).config();
}

// The error message of parsing the config after `edit` for `world` ranks.
inline std::string error_after(const std::function<void(nlohmann::json&)>& edit,
                               int64_t world = 1) {
  nlohmann::json doc = base_config();
  edit(doc);
  return error_of([&] { parse(doc, world); });
}

}  // namespace tessera::testing
