// Data-parallel training runs on thread ranks for the trainer tests: a small GPT-2 config
// (AdamW, clipping, warm-up, 2 micro-batches per rank), its outcome (per-step losses and the
// last checkpoint's weights) and their comparison, and a copy of a run as it was at a
// checkpoint, to resume from.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/run_metrics.h"
#include "tests/tools/trainer/thread_trainer.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/trainer.h"

namespace tessera::testing {

// Sequences per step over all ranks.
inline constexpr int64_t kGlobalBatch = 12;

// Stage 3 partitions every parameter above 30 elements (the LayerNorm weights, 25, stay
// whole) and gathers at most 6000 elements at a time (wte is 128 x 25).
inline nlohmann::json zero_section(int stage, int64_t bucket) {
  nlohmann::json z = {{"stage", stage}, {"reduce_bucket_size", bucket}};
  if (stage == 3) {
    z["stage3_param_persistence_threshold"] = 30;
    z["stage3_max_live_parameters"] = 6000;
    z["stage3_prefetch_bucket_size"] = 2000;
  }
  return z;
}

// A run config for `steps` AdamW steps with clipping, in `dir`; the batch is kGlobalBatch
// sequences in 2 micro-batches per rank. No biases: see model_config() in
// tests/parallel/zero_optimizer_test.cc for why the key bias cannot match. `extra` is
// merged in at the top (an "fp16" or "bf16" section).
inline nlohmann::json run_config(const std::filesystem::path& data,
                                 const std::filesystem::path& dir, int stage, int64_t steps,
                                 int64_t bucket,
                                 const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json doc = {
      {"train_batch_size", kGlobalBatch},
      {"gradient_accumulation_steps", 2},
      {"gradient_clipping", 0.5},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.1}}}}},
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}, {"warmup_max_lr", 1e-3}}}}},
      {"zero_optimization", zero_section(stage, bucket)},
      {"model",
       {{"type", "gpt2"},
        {"vocab_size", 29},
        {"block_size", 6},
        {"n_layer", 2},
        {"n_head", 5},
        {"n_embd", 25},
        {"bias", false}}},
      {"data", {{"train", (data / "train_*.bin").string()}, {"sampling", "random"}}},
      {"trainer",
       {{"steps", steps},
        {"threads", 1},
        {"seed", 3},
        {"log_dir", dir.string()},
        {"checkpoint_dir", (dir / "ckpt").string()},
        {"checkpoint_interval", 3},
        {"keep_last", 0}}}};
  doc.merge_patch(extra);
  return doc;
}

struct Outcome {
  std::map<int64_t, double> losses;                   // step -> training loss, from metrics.jsonl
  std::map<std::string, std::vector<float>> weights;  // the last checkpoint's
};

inline Outcome read_outcome(const std::filesystem::path& dir) {
  Outcome o;
  o.losses = read_run_metrics(dir).losses;
  const std::optional<std::string> last = train::CheckpointDir((dir / "ckpt").string(), 0).latest();
  REQUIRE(last.has_value());
  for (const auto& [name, t] : train::load_checkpoint(*last, false).model) {
    o.weights[name] = t.to_vector<float>();
  }
  return o;
}

// Runs the trainer on `world` thread ranks.
inline Outcome train(const nlohmann::json& doc, const std::filesystem::path& dir, int world,
                     train::ResumeMode mode) {
  train_on_threads(doc, dir, world, mode);
  return read_outcome(dir);
}

// Losses within tol of |want|, weights within relative L2 error tol.
inline void check_close(const Outcome& got, const Outcome& want, double tol) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (const auto& [step, loss] : want.losses) {
    INFO("step " << step);
    CHECK(std::abs(got.losses.at(step) - loss) <= tol * std::abs(loss));
  }
  REQUIRE(got.weights.size() == want.weights.size());
  for (const auto& [name, w] : want.weights) {
    INFO(name);
    CHECK(relative_l2_error(got.weights.at(name), w) <= tol);
  }
}

// Makes `dir` a copy of the run in `full` as it was after checkpoint step `step`: the
// checkpoint as its latest, and the metrics up to that step.
inline void copy_run_at(const std::filesystem::path& full, int64_t step,
                        const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  fs::create_directories(dir / "ckpt");
  fs::copy(full / "ckpt" / name, dir / "ckpt" / name, fs::copy_options::recursive);
  write_bytes(dir / "ckpt" / "latest", std::string(name) + "\n");
  std::ifstream in(full / "metrics.jsonl");
  std::ofstream out(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (nlohmann::json::parse(line)["step"].get<int64_t>() <= step) out << line << "\n";
  }
}

}  // namespace tessera::testing
