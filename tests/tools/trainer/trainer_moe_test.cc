// The trainer with a GPT-MoE model (Note [GPT-MoE] in models/gpt2/moe_config.h): it learns
// Tiny Shakespeare; data parallelism with ZeRO stages 1-3 follows stage 0 (every expert runs
// on every rank each step, so stage 3 gathers alike everywhere); a run with random token
// selection and second-expert sampling resumes bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <string>

#include "tests/test_files.h"
#include "tests/testing.h"
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

// `steps` steps on `world` thread ranks at ZeRO `stage`, 2 micro-batches per rank.
Json parallel_run(const fs::path& data, const fs::path& dir, int stage, int64_t steps) {
  Json z = {{"stage", stage}};
  if (stage == 3) z["stage3_param_persistence_threshold"] = 40;
  return {{"train_batch_size", 8},
          {"gradient_accumulation_steps", 2},
          {"gradient_clipping", 1.0},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.1}}}}},
          {"zero_optimization", z},
          {"model", moe_model(29, 8, 2)},
          {"data", {{"train", (data / "train_*.bin").string()}}},
          {"trainer",
           {{"steps", steps},
            {"threads", 1},
            {"seed", 3},
            {"log_dir", dir.string()},
            {"checkpoint_dir", (dir / "ckpt").string()},
            {"checkpoint_interval", 4},
            {"keep_last", 0}}}};
}

TEST_CASE("data-parallel GPT-MoE with ZeRO stages 1-3 follows stage 0", "[trainer][moe][zero]") {
  const fs::path root = testing::fresh_dir("trainer_moe_zero");
  testing::write_random_shard(root / "data", 29);
  const fs::path base = root / "stage0";
  testing::train_on_threads(parallel_run(root / "data", base, 0, 6), base, 2, ResumeMode::never);
  const testing::RunMetrics want = testing::read_run_metrics(base);
  REQUIRE(want.losses.size() == 6);
  for (int stage : {1, 2, 3}) {
    DYNAMIC_SECTION("stage " << stage) {
      const fs::path dir = root / ("stage" + std::to_string(stage));
      testing::train_on_threads(parallel_run(root / "data", dir, stage, 6), dir, 2,
                                ResumeMode::never);
      const testing::RunMetrics got = testing::read_run_metrics(dir);
      for (const auto& [step, loss] : want.losses) {
        INFO("step " << step);
        CHECK(got.losses.at(step) == Approx(loss).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("a GPT-MoE run with random routing resumes bit for bit", "[trainer][moe]") {
  const fs::path root = testing::fresh_dir("trainer_moe_resume");
  testing::write_random_shard(root / "data", 29);
  auto run = [&](const fs::path& dir) {
    Json doc = parallel_run(root / "data", dir, 2, 8);
    doc["model"]["moe"]["k"] = 1;  // random token selection (use_rts, on by default) ...
    doc["model"]["moe"]["capacity_factor"] = 0.5;  // ... decides which tokens drop
    doc["model"]["moe"]["noisy_gate_policy"] = "RSample";
    return doc;
  };
  const fs::path full = root / "full";
  testing::train_on_threads(run(full), full, 2, ResumeMode::never);
  const fs::path dir = root / "resumed";
  fs::create_directories(dir / "ckpt");
  fs::copy(full / "ckpt" / "step_00000004", dir / "ckpt" / "step_00000004",
           fs::copy_options::recursive);
  testing::write_bytes(dir / "ckpt" / "latest", "step_00000004\n");
  testing::train_on_threads(run(dir), dir, 2, ResumeMode::required);
  const testing::RunMetrics want = testing::read_run_metrics(full);
  const testing::RunMetrics got = testing::read_run_metrics(dir);
  REQUIRE(got.losses.size() == 4);  // steps 5-8
  for (const auto& [step, loss] : got.losses) CHECK(loss == want.losses.at(step));
}

}  // namespace
}  // namespace tessera::train
