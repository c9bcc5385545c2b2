// The trainer on data-parallel thread ranks, end to end: per-step losses and final weights
// against the single-process run with the same global batch (ZeRO stages 0-3, world 1-4),
// and resume from a 2-rank ZeRO-2 or ZeRO-3 checkpoint at 2 ranks (bitwise) and at 1 and 3
// ranks.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <map>
#include <string>

#include "parallel/comm/thread_comm.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/random_shard.h"
#include "tests/tools/trainer/run_metrics.h"
#include "tests/tools/trainer/thread_trainer.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int64_t kGlobalBatch = 12;

// Stage 3 partitions every parameter above 30 elements (the LayerNorm weights, 25, stay
// whole) and gathers at most 6000 elements at a time (wte is 128 x 25).
Json zero_section(int stage, int64_t bucket) {
  Json z = {{"stage", stage}, {"reduce_bucket_size", bucket}};
  if (stage == 3) {
    z["stage3_param_persistence_threshold"] = 30;
    z["stage3_max_live_parameters"] = 6000;
    z["stage3_prefetch_bucket_size"] = 2000;
  }
  return z;
}

// A run config for `steps` AdamW steps with clipping, in `dir`; the batch is kGlobalBatch
// sequences in 2 micro-batches per rank. No biases: see model_config() in
// tests/parallel/zero_optimizer_test.cc for why the key bias cannot match.
Json run_config(const fs::path& data, const fs::path& dir, int stage, int64_t steps,
                int64_t bucket) {
  return {{"train_batch_size", kGlobalBatch},
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
}

struct Outcome {
  std::map<int64_t, double> losses;                   // step -> training loss, from metrics.jsonl
  std::map<std::string, std::vector<float>> weights;  // the last checkpoint's
};

Outcome read_outcome(const fs::path& dir) {
  Outcome o;
  o.losses = testing::read_run_metrics(dir).losses;
  const std::optional<std::string> last = CheckpointDir((dir / "ckpt").string(), 0).latest();
  REQUIRE(last.has_value());
  for (const auto& [name, t] : load_checkpoint(*last, false).model) {
    o.weights[name] = t.to_vector<float>();
  }
  return o;
}

// Runs the trainer on `world` thread ranks.
Outcome train(const Json& doc, const fs::path& dir, int world, ResumeMode mode) {
  testing::train_on_threads(doc, dir, world, mode);
  return read_outcome(dir);
}

void check_close(const Outcome& got, const Outcome& want, double tol) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (const auto& [step, loss] : want.losses) {
    INFO("step " << step);
    CHECK(std::abs(got.losses.at(step) - loss) <= tol * std::abs(loss));
  }
  REQUIRE(got.weights.size() == want.weights.size());
  for (const auto& [name, w] : want.weights) {
    INFO(name);
    CHECK(testing::relative_l2_error(got.weights.at(name), w) <= tol);
  }
}

TEST_CASE("data-parallel training equals one process with the same global batch",
          "[trainer][zero]") {
  const fs::path root = testing::fresh_dir("trainer_parallel_equivalence");
  testing::write_random_shard(root / "data", 41);
  const Outcome want = train(run_config(root / "data", root / "single", 0, 6, 500'000'000),
                             root / "single", 1, ResumeMode::never);
  REQUIRE(want.losses.size() == 6);
  for (int stage = 0; stage <= 3; ++stage) {
    for (int world : {2, 3}) {
      DYNAMIC_SECTION("stage " << stage << ", world " << world) {
        const fs::path dir = root / ("s" + std::to_string(stage) + "w" + std::to_string(world));
        check_close(
            train(run_config(root / "data", dir, stage, 6, 1000), dir, world, ResumeMode::never),
            want, 1e-6);
      }
    }
  }
}

TEST_CASE("a 2-rank ZeRO-2 or ZeRO-3 checkpoint resumes at 2 ranks bitwise and at 1 and 3 ranks",
          "[trainer][zero]") {
  const fs::path root = testing::fresh_dir("trainer_parallel_resume");
  testing::write_random_shard(root / "data", 41);
  for (int saved : {2, 3}) {
    // The uninterrupted run: 6 steps, checkpoints at 3 and 6.
    const fs::path full = root / ("full" + std::to_string(saved));
    const Outcome want =
        train(run_config(root / "data", full, saved, 6, 1000), full, 2, ResumeMode::never);
    const fs::path step3 = full / "ckpt" / "step_00000003";
    REQUIRE(fs::exists(step3 / "zero_pp_rank_1_mp_rank_00_optim_states.safetensors"));
    // Stage 3 keeps the weights in the shards only.
    CHECK(fs::exists(step3 / "model.safetensors") == (saved == 2));
    for (int world : {2, 1, 3}) {
      // The same stage at 2 ranks; stage 1 (from 2) or 0 and 3 (from 3) elsewhere.
      const int stage = world == 2 ? saved : saved == 2 ? 1 : world == 1 ? 0 : 3;
      DYNAMIC_SECTION("stage " << saved << " resumed at " << world << " ranks, stage " << stage) {
        // A copy of the run as it was after step 3, continued to step 6.
        const fs::path dir = root / ("resume" + std::to_string(saved) + std::to_string(world));
        fs::create_directories(dir / "ckpt");
        fs::copy(step3, dir / "ckpt" / "step_00000003", fs::copy_options::recursive);
        testing::write_bytes(dir / "ckpt" / "latest", "step_00000003\n");
        // The metrics up to step 3 as the interrupted run left them.
        {
          std::ifstream in(full / "metrics.jsonl");
          std::ofstream out(dir / "metrics.jsonl");
          for (std::string line; std::getline(in, line);) {
            if (Json::parse(line)["step"].get<int64_t>() <= 3) out << line << "\n";
          }
        }
        const Outcome got =
            train(run_config(root / "data", dir, stage, 6, 1000), dir, world, ResumeMode::required);
        if (world == 2) {
          CHECK(got.losses == want.losses);
          CHECK(got.weights == want.weights);
        } else {
          check_close(got, want, 1e-6);
        }
      }
    }
  }
}

TEST_CASE("ranks that see different checkpoints refuse to resume", "[trainer][zero]") {
  const fs::path root = testing::fresh_dir("trainer_parallel_disagree");
  testing::write_random_shard(root / "data", 41);
  const fs::path dir = root / "run";
  train(run_config(root / "data", dir, 1, 3, 1000), dir, 2, ResumeMode::never);
  // Rank 1 reads another checkpoint directory that has none.
  std::vector<std::string> errors(2);
  parallel::run_thread_ranks(2, [&](parallel::Communicator& comm) {
    Json doc = run_config(root / "data", dir, 1, 6, 1000);
    if (comm.rank() == 1) doc["trainer"]["checkpoint_dir"] = (root / "empty").string();
    try {
      RunConfig cfg = parse_run_config(doc, "test", dir.string(), 2);
      apply_run_environment(cfg, comm);
      Trainer trainer(std::move(cfg), ResumeMode::automatic, comm);
    } catch (const Error& e) {
      errors[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Matches(".*rank 0 found checkpoint step 3 in .*, but the ranks' "
                                       "latest steps range from -1 to 3 \\(-1: none\\); expected "
                                       "every rank to see the same checkpoint"));
  CHECK_THAT(errors[1], Catch::Contains("rank 1 found no checkpoint"));
}

}  // namespace
}  // namespace tessera::train
