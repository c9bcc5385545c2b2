// The training loop's arithmetic: gradient accumulation equals the larger batch, and
// activation checkpointing (with dropout) changes nothing but memory; checkpoint_interval
// -1 saves no checkpoint.
#include "tools/trainer/trainer.h"

#include <map>
#include <string>

#include "core/philox.h"
#include "parallel/comm/thread_comm.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tools/data/shard.h"
#include "tools/trainer/checkpoint.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// A shard of 4096 random tokens below 20 in `dir`.
void write_random_shard(const fs::path& dir) {
  std::vector<uint16_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint16_t>(philox4x32(i, 0, 99)[0] % 20);
  }
  data::write_shard((dir / "train_000000.bin").string(), tokens);
}

// 3 SGD steps in `dir` with `micro` x `accumulation` sequences per step. SGD, unlike Adam,
// is not invariant to the gradient's scale, so a wrong accumulation factor shows.
Json run_doc(const fs::path& dir, int64_t micro, int64_t accumulation, double dropout,
             bool checkpoint_activations) {
  return Json{{"train_batch_size", micro * accumulation},
              {"train_micro_batch_size_per_gpu", micro},
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.5}, {"momentum", 0.9}}}}},
              {"model",
               {{"type", "gpt2"},
                {"vocab_size", 20},
                {"block_size", 8},
                {"n_layer", 2},
                {"n_head", 2},
                {"n_embd", 16},
                {"dropout", dropout},
                {"checkpoint_activations", checkpoint_activations}}},
              {"data",
               {{"train", (dir.parent_path() / "data" / "train_*.bin").string()},
                {"sampling", "sequential"}}},
              {"trainer",
               {{"steps", 3},
                {"threads", 1},
                {"log_dir", dir.string()},
                {"checkpoint_dir", (dir / "ckpt").string()}}}};
}

void run(const Json& doc, const fs::path& dir) {
  const auto single = parallel::make_thread_group(1);
  RunConfig cfg = parse_run_config(doc, "test", dir.string());
  apply_run_environment(cfg, *single[0]);
  Trainer trainer(std::move(cfg), ResumeMode::never, *single[0]);
  trainer.run();
}

// Trains run_doc() in `dir` and returns the final parameters.
std::map<std::string, Tensor> train(const fs::path& dir, int64_t micro, int64_t accumulation,
                                    double dropout, bool checkpoint_activations) {
  run(run_doc(dir, micro, accumulation, dropout, checkpoint_activations), dir);
  const std::optional<std::string> last = CheckpointDir((dir / "ckpt").string(), 0).latest();
  REQUIRE(last.has_value());
  std::map<std::string, Tensor> params;
  for (const auto& [name, t] : load_checkpoint(*last, false).model) params[name] = t;
  return params;
}

TEST_CASE("2 micro-batches of 2 accumulate to the step of one batch of 4", "[trainer]") {
  const fs::path root = testing::fresh_dir("accumulation");
  fs::create_directories(root / "data");
  write_random_shard(root / "data");
  const auto one = train(root / "one", 4, 1, 0.0, false);
  const auto two = train(root / "two", 2, 2, 0.0, false);
  REQUIRE(one.size() == two.size());
  for (const auto& [name, t] : one) {
    INFO(name);
    // Same rows, same mean loss; only the summation order differs.
    testing::require_close(two.at(name), t.to_vector<double>(), 1e-5);
  }
}

TEST_CASE("activation checkpointing with dropout reproduces the stored-activation run",
          "[trainer]") {
  const fs::path root = testing::fresh_dir("recompute");
  fs::create_directories(root / "data");
  write_random_shard(root / "data");
  const auto stored = train(root / "stored", 2, 2, 0.1, false);
  const auto recomputed = train(root / "recomputed", 2, 2, 0.1, true);
  for (const auto& [name, t] : stored) {
    INFO(name);
    // The recomputation replays the same kernels on the same dropout masks: bit for bit.
    CHECK(recomputed.at(name).to_vector<double>() == t.to_vector<double>());
  }
}

TEST_CASE("checkpoint_interval -1 saves no checkpoint", "[trainer]") {
  const fs::path root = testing::fresh_dir("no_checkpoint");
  fs::create_directories(root / "data");
  write_random_shard(root / "data");
  Json doc = run_doc(root / "run", 2, 1, 0.0, false);
  doc["trainer"]["checkpoint_interval"] = -1;
  run(doc, root / "run");
  CHECK_FALSE(CheckpointDir((root / "run" / "ckpt").string(), 0).latest().has_value());
  doc["trainer"]["checkpoint_interval"] = -2;
  CHECK_THROWS_WITH(parse_run_config(doc, "test", (root / "run").string()),
                    Catch::Contains("checkpoint_interval"));
}

}  // namespace
}  // namespace tessera::train
