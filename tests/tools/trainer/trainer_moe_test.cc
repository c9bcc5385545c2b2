// The trainer with a GPT-MoE model (Note [GPT-MoE] in models/gpt2/moe_config.h): it learns
// Tiny Shakespeare; data parallelism with ZeRO stages 1-3 follows stage 0 (every expert runs
// on every rank each step, so stage 3 gathers alike everywhere); a run with random token
// selection and RSample's Gumbel noise resumes bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <string>

#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"
#include "tests/tools/trainer/run_metrics.h"
#include "tests/tools/trainer/shakespeare_data.h"
#include "tests/tools/trainer/thread_trainer.h"
#include "tools/trainer/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

Json moe_model(int64_t vocab, int64_t block, int k) {
  return {
      {"type", "gpt2"},      {"vocab_size", vocab},
      {"block_size", block}, {"n_layer", 2},
      {"n_head", 2},         {"n_embd", 32},
      {"bias", false},       {"moe", {{"num_experts", 4}, {"k", k}, {"capacity_factor", 1.25}}}};
}

TEST_CASE("a GPT-MoE learns Tiny Shakespeare", "[trainer][moe]") {
  const fs::path dir = testing::fresh_dir("trainer_moe_learns");
  const Json run = {
      {"train_batch_size", 16},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"betas", {0.9, 0.99}}}}}},
      {"model", moe_model(65, 32, 2)},
      {"data", testing::shakespeare_data_section()},
      {"trainer",
       {{"steps", 150},
        {"eval_batches", 8},
        {"threads", 2},
        {"seed", 5},
        {"log_dir", dir.string()}}}};
  testing::train_on_threads(run, dir, 1, ResumeMode::never);
  const testing::RunMetrics m = testing::read_run_metrics(dir);
  CHECK(m.val_losses.rbegin()->second < 0.7 * std::log(65.0));
  // Each step's record carries the MoE block's load: 16 x 32 tokens, top-2.
  std::ifstream metrics(dir / "metrics.jsonl");
  std::string line;
  int64_t records = 0;
  while (std::getline(metrics, line)) {
    const Json rec = Json::parse(line);
    if (rec["kind"] != "train") continue;
    ++records;
    REQUIRE(rec["moe"].size() == 1);
    const Json& load = rec["moe"][0];
    CHECK(load["block"] == 1);
    int64_t tokens = 0;
    for (const Json& t : load["tokens"]) tokens += t.get<int64_t>();
    CHECK(tokens == 16 * 32 * 2);
    CHECK(load["capacity"] == 320);  // ceil(512 / 4 x 1.25 x 2)
    CHECK(load["aux_loss"].get<double>() > 0);
  }
  CHECK(records == 150);
}

// The data-parallel test model (tests/tools/trainer/data_parallel_runs.h) with 4 experts,
// top-2, in its second block, plus `gate` (more gate keys).
Json moe_run(const fs::path& data, const fs::path& dir, int stage, int64_t steps,
             const Json& gate = Json::object()) {
  Json moe = {{"num_experts", 4}, {"k", 2}, {"capacity_factor", 1.25}};
  moe.merge_patch(gate);
  return testing::run_config(data, dir, stage, steps, 400, {{"model", {{"moe", moe}}}});
}

TEST_CASE("data-parallel GPT-MoE with ZeRO stages 1-3 follows stage 0", "[trainer][moe][zero]") {
  const fs::path root = testing::fresh_dir("trainer_moe_zero");
  testing::write_random_shard(root / "data", 29);
  const testing::Outcome want = testing::train(moe_run(root / "data", root / "stage0", 0, 6),
                                               root / "stage0", 2, ResumeMode::never);
  REQUIRE(want.losses.size() == 6);
  for (int stage : {1, 2, 3}) {
    DYNAMIC_SECTION("stage " << stage) {
      const fs::path dir = root / ("stage" + std::to_string(stage));
      testing::check_close(
          testing::train(moe_run(root / "data", dir, stage, 6), dir, 2, ResumeMode::never), want,
          1e-5);
    }
  }
}

TEST_CASE("a GPT-MoE pipeline equals one process, its first stage's aux losses included",
          "[trainer][moe][3d]") {
  const fs::path root = testing::fresh_dir("trainer_moe_pipeline");
  testing::write_random_shard(root / "data", 29);
  // Both blocks MoE (one per stage), and a coefficient large enough to matter.
  const Json gate = {{"moe_every", 1}, {"aux_loss_coef", 0.5}};
  const testing::Outcome want = testing::train(moe_run(root / "data", root / "single", 1, 6, gate),
                                               root / "single", 1, ResumeMode::never);
  for (const bool fp16 : {false, true}) {
    DYNAMIC_SECTION((fp16 ? "fp16" : "fp32")) {
      const fs::path dir = root / (fp16 ? "pipe_fp16" : "pipe");
      Json doc = moe_run(root / "data", dir, 1, 6, gate);
      doc["pipeline"] = {{"stages", 2}, {"partition_method", "uniform"}};
      Json single_doc = moe_run(root / "data", root / "single_fp16", 1, 6, gate);
      if (fp16) {
        doc["fp16"] = single_doc["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
      }
      const testing::Outcome reference =
          fp16 ? testing::train(single_doc, root / "single_fp16", 1, ResumeMode::never) : want;
      testing::check_close(testing::train(doc, dir, 2, ResumeMode::never), reference,
                           fp16 ? 5e-3 : 1e-5);
    }
  }
}

TEST_CASE("a GPT-MoE run with random routing resumes bit for bit", "[trainer][moe]") {
  const fs::path root = testing::fresh_dir("trainer_moe_resume");
  testing::write_random_shard(root / "data", 29);
  // Top-1 with random token selection (use_rts, on by default) deciding which tokens drop,
  // and RSample's Gumbel noise choosing the experts.
  const Json gate = {{"k", 1}, {"capacity_factor", 0.5}, {"noisy_gate_policy", "RSample"}};
  const testing::Outcome want = testing::train(moe_run(root / "data", root / "full", 2, 6, gate),
                                               root / "full", 2, ResumeMode::never);
  const fs::path dir = root / "resumed";
  testing::copy_run_at(root / "full", 3, dir);
  const testing::Outcome got =
      testing::train(moe_run(root / "data", dir, 2, 6, gate), dir, 2, ResumeMode::required);
  testing::check_close(got, want, 0.0);
}

}  // namespace
}  // namespace tessera::train
