// The trainer with the 1-bit optimizers on data-parallel thread ranks: convergence on
// Tiny Shakespeare (char level) at 4 ranks against Adam and LAMB at the same step count;
// a checkpoint taken between 0/1 Adam's syncs (and in 1-bit Adam's and 1-bit LAMB's
// compressed stage) resumed bit for bit at the same world size and afresh, with a
// warning, at another; the comm path and bytes logged per step.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/random_shard.h"
#include "tests/tools/trainer/run_metrics.h"
#include "tests/tools/trainer/shakespeare_data.h"
#include "tests/tools/trainer/thread_trainer.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The 1-bit optimizer `type` with stage switches early enough for a short run (0/1 Adam
// keeps DeepSpeed's var_update_scaler of 16: with 4, most early steps are 1-bit gradient
// steps and this short run ends 15% behind).
Json optimizer_section(const std::string& type, double lr, int64_t freeze) {
  Json params = {{"lr", lr}, {"weight_decay", 0.01}, {"betas", {0.9, 0.99}}};
  if (type == "OneBitAdam" || type == "OneBitLamb") params["freeze_step"] = freeze;
  if (type == "ZeroOneAdam") {
    params["var_freeze_step"] = freeze;
    params["local_step_scaler"] = freeze / 2;
    params["local_step_clipper"] = 4;
  }
  if (type == "OneBitLamb" || type == "Lamb") params["max_coeff"] = 0.5;
  return {{"type", type}, {"params", params}};
}

// Per training step: the comm path the trainer logged ("" without a 1-bit optimizer) and
// the bytes rank 0 sent.
std::map<int64_t, std::pair<std::string, int64_t>> comm_log(const fs::path& dir) {
  std::map<int64_t, std::pair<std::string, int64_t>> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json rec = Json::parse(line);
    if (rec["kind"] != "train") continue;
    out[rec["step"].get<int64_t>()] = {rec.value("comm", ""), rec["comm_bytes"].get<int64_t>()};
  }
  return out;
}

TEST_CASE("at 4 ranks on Tiny Shakespeare the 1-bit optimizers reach Adam's and LAMB's loss",
          "[trainer][onebit]") {
  const fs::path root = testing::fresh_dir("trainer_onebit_convergence");
  constexpr int64_t kSteps = 300;
  auto config = [&](const Json& optimizer, const fs::path& dir) {
    return Json{{"train_batch_size", 16},
                {"train_micro_batch_size_per_gpu", 4},
                {"gradient_clipping", 1.0},
                {"optimizer", optimizer},
                {"model",
                 {{"type", "gpt2"},
                  {"vocab_size", 65},
                  {"block_size", 32},
                  {"n_layer", 2},
                  {"n_head", 4},
                  {"n_embd", 64}}},
                {"data", testing::shakespeare_data_section()},
                {"trainer",
                 {{"steps", kSteps},
                  {"eval_interval", 0},
                  {"eval_batches", 16},
                  {"threads", 1},
                  {"seed", 5},
                  {"log_dir", dir.string()}}}};
  };
  std::map<std::string, double> val;
  std::map<std::string, std::map<int64_t, std::pair<std::string, int64_t>>> logs;
  for (const std::string type : {"AdamW", "OneBitAdam", "ZeroOneAdam", "Lamb", "OneBitLamb"}) {
    const double lr = type.find("Lamb") != std::string::npos ? 2e-2 : 2e-3;
    const fs::path dir = root / type;
    testing::train_on_threads(config(optimizer_section(type, lr, kSteps / 5), dir), dir, 4,
                              ResumeMode::never);
    val[type] = testing::read_run_metrics(dir).val_losses.rbegin()->second;
    logs[type] = comm_log(dir);
  }
  // Each step's communication is logged; compressed steps send a fraction of the bytes.
  const int64_t full = logs["AdamW"].at(kSteps).second;
  CHECK(logs["AdamW"].at(kSteps).first.empty());
  CHECK(logs["OneBitAdam"].at(1).first == "init");
  CHECK(logs["OneBitAdam"].at(2).first == "full_precision");
  CHECK(logs["OneBitAdam"].at(kSteps).first == "compressed");
  CHECK(logs["OneBitAdam"].at(kSteps).second * 5 < full);
  CHECK(logs["OneBitLamb"].at(kSteps).second * 5 < full);
  int64_t zero_one_bytes = 0, adam_bytes = 0;
  for (int64_t step = 1; step <= kSteps; ++step) {
    zero_one_bytes += logs["ZeroOneAdam"].at(step).second;
    adam_bytes += logs["AdamW"].at(step).second;
  }
  CHECK(zero_one_bytes * 4 < adam_bytes);
  for (const auto& [type, loss] : val) WARN(type << ": val loss " << loss);
  CHECK(val["AdamW"] < 2.6);  // it learned: uniform over 65 characters is 4.17
  CHECK(val["OneBitAdam"] <= 1.02 * val["AdamW"]);
  CHECK(val["ZeroOneAdam"] <= 1.02 * val["AdamW"]);
  CHECK(val["OneBitLamb"] <= 1.02 * val["Lamb"]);
}

// 12 steps of `optimizer` on 2 micro-batches per step, checkpoints every 3 steps.
Json small_run(const fs::path& data, const fs::path& dir, const Json& optimizer) {
  return {{"train_batch_size", 8},
          {"gradient_accumulation_steps", 2},
          {"gradient_clipping", 0.5},
          {"optimizer", optimizer},
          {"model",
           {{"type", "gpt2"},
            {"vocab_size", 29},
            {"block_size", 6},
            {"n_layer", 2},
            {"n_head", 5},
            {"n_embd", 25}}},
          {"data", {{"train", (data / "train_*.bin").string()}, {"sampling", "random"}}},
          {"trainer",
           {{"steps", 12},
            {"threads", 1},
            {"seed", 3},
            {"log_dir", dir.string()},
            {"checkpoint_dir", (dir / "ckpt").string()},
            {"checkpoint_interval", 3},
            {"keep_last", 0}}}};
}

std::map<std::string, std::vector<float>> last_weights(const fs::path& dir) {
  std::map<std::string, std::vector<float>> out;
  const std::optional<std::string> last = CheckpointDir((dir / "ckpt").string(), 0).latest();
  REQUIRE(last.has_value());
  for (const auto& [name, t] : load_checkpoint(*last, false).model) {
    out[name] = t.to_vector<float>();
  }
  return out;
}

TEST_CASE("a 1-bit checkpoint resumes bit for bit at the same world size, afresh at another",
          "[trainer][onebit]") {
  const fs::path root = testing::fresh_dir("trainer_onebit_resume");
  testing::write_random_shard(root / "data", 43);
  // Step 9 is in the compressed stage, and for 0/1 Adam (variance frozen after step 5,
  // syncs at 6, 7, 8, 10, 12) between two syncs.
  Json zero_one = optimizer_section("ZeroOneAdam", 1e-3, 4);
  zero_one["params"]["var_update_scaler"] = 1;
  zero_one["params"]["local_step_scaler"] = 2;
  for (const Json& optimizer : {optimizer_section("OneBitAdam", 2e-3, 4), zero_one,
                                optimizer_section("OneBitLamb", 2e-2, 4)}) {
    const std::string type = optimizer["type"];
    DYNAMIC_SECTION(type) {
      const fs::path full = root / (type + "_full");
      testing::train_on_threads(small_run(root / "data", full, optimizer), full, 2,
                                ResumeMode::never);
      const fs::path step9 = full / "ckpt" / "step_00000009";
      REQUIRE(fs::exists(step9 / rank_state_name(0)));
      REQUIRE(fs::exists(step9 / rank_state_name(1)));
      const testing::RunMetrics want = testing::read_run_metrics(full);
      for (const int world : {2, 1}) {
        const fs::path dir = root / (type + "_resumed_at_" + std::to_string(world));
        fs::create_directories(dir / "ckpt");
        fs::copy(step9, dir / "ckpt" / "step_00000009", fs::copy_options::recursive);
        testing::write_bytes(dir / "ckpt" / "latest", "step_00000009\n");
        testing::train_on_threads(small_run(root / "data", dir, optimizer), dir, world,
                                  ResumeMode::required);
        const testing::RunMetrics got = testing::read_run_metrics(dir);
        REQUIRE(got.losses.size() == 3);  // steps 10-12
        if (world == 2) {
          for (const auto& [step, loss] : got.losses) CHECK(loss == want.losses.at(step));
          CHECK(last_weights(dir) == last_weights(full));
        } else {
          // One rank reads both ranks' batches: the same data, the error feedback reset.
          for (const auto& [step, loss] : got.losses) {
            CHECK(std::abs(loss - want.losses.at(step)) < 0.05 * want.losses.at(step));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera::train
