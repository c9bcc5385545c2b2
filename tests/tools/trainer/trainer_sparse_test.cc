// The trainer with block-sparse attention and with the BERT masked-LM model: a GPT whose
// layout is dense trains as the dense GPT; BERT learns Tiny Shakespeare's characters
// dense and sparse; a BERT run (masking included) resumes bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
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

// `model` trained for `steps` on Tiny Shakespeare, evaluated at the end.
Json shakespeare_run(const Json& model, int64_t steps, const fs::path& dir) {
  return {{"train_batch_size", 16},
          {"gradient_clipping", 1.0},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}, {"betas", {0.9, 0.99}}}}}},
          {"model", model},
          {"data", testing::shakespeare_data_section()},
          {"trainer",
           {{"steps", steps},
            {"eval_batches", 16},
            {"threads", 2},
            {"seed", 5},
            {"log_dir", dir.string()}}}};
}

const Json kGpt = {{"type", "gpt2"}, {"vocab_size", 65}, {"block_size", 64},
                   {"n_layer", 2},   {"n_head", 4},      {"n_embd", 64}};
const Json kBert = {{"type", "bert"}, {"vocab_size", 65}, {"block_size", 64}, {"n_layer", 2},
                    {"n_head", 4},    {"n_embd", 64},     {"dropout", 0.0}};

TEST_CASE("a GPT with the dense layout trains as the dense GPT; a sparse one learns",
          "[trainer][sparse]") {
  const fs::path root = testing::fresh_dir("trainer_sparse_gpt");
  Json dense = shakespeare_run(kGpt, 30, root / "dense");
  Json dense_layout = shakespeare_run(kGpt, 30, root / "dense_layout");
  dense_layout["sparse_attention"] = {{"mode", "dense"}, {"block", 16}};
  Json fixed = shakespeare_run(kGpt, 30, root / "fixed");
  fixed["sparse_attention"] = {
      {"mode", "fixed"}, {"block", 8}, {"num_local_blocks", 2}, {"attention", "unidirectional"}};
  testing::train_on_threads(dense, root / "dense", 1, ResumeMode::never);
  testing::train_on_threads(dense_layout, root / "dense_layout", 1, ResumeMode::never);
  testing::train_on_threads(fixed, root / "fixed", 1, ResumeMode::never);
  const testing::RunMetrics a = testing::read_run_metrics(root / "dense");
  const testing::RunMetrics b = testing::read_run_metrics(root / "dense_layout");
  const testing::RunMetrics c = testing::read_run_metrics(root / "fixed");
  REQUIRE(a.losses.size() == 30);
  for (const auto& [step, loss] : a.losses) {
    INFO("step " << step);
    CHECK(std::abs(b.losses.at(step) - loss) < 1e-4 * loss);
  }
  // The fixed layout hides most of the context: a different model, and it learns.
  CHECK(c.losses.at(30) != a.losses.at(30));
  CHECK(c.val_losses.rbegin()->second < 0.85 * std::log(65.0));
}

TEST_CASE("BERT learns Tiny Shakespeare by masked LM, dense and block-sparse",
          "[trainer][sparse][bert]") {
  const fs::path root = testing::fresh_dir("trainer_bert");
  constexpr int64_t kSteps = 600;
  Json dense = shakespeare_run(kBert, kSteps, root / "dense");
  Json sparse = shakespeare_run(kBert, kSteps, root / "sparse");
  sparse["sparse_attention"] = {{"mode", "bslongformer"},
                                {"block", 8},
                                {"num_sliding_window_blocks", 3},
                                {"global_block_indices", {0}}};
  testing::train_on_threads(dense, root / "dense", 1, ResumeMode::never);
  testing::train_on_threads(sparse, root / "sparse", 1, ResumeMode::never);
  const double d = testing::read_run_metrics(root / "dense").val_losses.rbegin()->second;
  const double s = testing::read_run_metrics(root / "sparse").val_losses.rbegin()->second;
  WARN("BERT masked-LM val loss after " << kSteps << " steps: dense " << d << ", bslongformer "
                                        << s);
  // Uniform over 65 characters is 4.17. A masked character's own input is [MASK], so the
  // model must learn to look at its neighbours; the local window of the sparse layout
  // gives it that prior and it gets there first (dense: 3.15, bslongformer: 2.85).
  CHECK(d < 3.3);
  CHECK(s < 3.0);
  CHECK(s < d);
}

TEST_CASE("a BERT run resumes bit for bit, masks included", "[trainer][bert]") {
  const fs::path root = testing::fresh_dir("trainer_bert_resume");
  testing::write_random_shard(root / "data", 43);
  auto run = [&](const fs::path& dir) {
    return Json{{"train_batch_size", 8},
                {"gradient_accumulation_steps", 2},
                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
                {"sparse_attention", {{"mode", "bigbird"}, {"block", 2}, {"num_random_blocks", 1}}},
                {"model",
                 {{"type", "bert"},
                  {"vocab_size", 29},
                  {"block_size", 6},
                  {"n_layer", 2},
                  {"n_head", 2},
                  {"n_embd", 16},
                  {"dropout", 0.1}}},
                {"data", {{"train", (root / "data" / "train_*.bin").string()}}},
                {"trainer",
                 {{"steps", 8},
                  {"threads", 1},
                  {"seed", 3},
                  {"log_dir", dir.string()},
                  {"checkpoint_dir", (dir / "ckpt").string()},
                  {"checkpoint_interval", 4},
                  {"keep_last", 0}}}};
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
  // The masking changes from step to step: the losses are not one repeated batch's.
  CHECK(want.losses.at(5) != want.losses.at(6));
}

}  // namespace
}  // namespace tessera::train
