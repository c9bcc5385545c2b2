// The trainer on CUDA ("trainer": {"device": "cuda"}), end to end on one rank: an f32 run
// follows the same run on the CPU (training and validation losses), a bf16 run trains, and
// an fp16 run (dynamic loss scale, dropout) resumes from a checkpoint bit for bit, as Note
// [Exact resume] in tools/trainer/trainer.h promises: the device's reductions have a fixed
// order, so the GPU path is deterministic too.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "parallel/comm/nccl_comm.h"
#include "parallel/comm/thread_comm.h"
#include "tests/gpu/cycle_shards.h"
#include "tests/test_files.h"
#include "tests/tools/trainer/run_metrics.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/run_config.h"
#include "tools/trainer/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int64_t kVocab = testing::kCycleVocab;

// A run of `steps` AdamW steps (8 sequences of 16 in 2 micro-batches, clipping, a linear
// warm-up) on `device`, evaluating every 2 steps and checkpointing every 4, in `dir`.
// `extra` adds or replaces top-level sections (fp16, bf16). Odd model sizes: 3 heads of 8,
// vocab 29 padded to 128. No biases: the loss does not depend on the key bias, whose
// gradient is rounding noise that Adam turns into full-size steps (see model_config() in
// tests/parallel/zero_optimizer_test.cc).
Json run_config(const fs::path& data, const fs::path& dir, const std::string& device, int64_t steps,
                double dropout, const Json& extra = Json::object()) {
  Json doc = {{"train_batch_size", 8},
              {"train_micro_batch_size_per_gpu", 4},
              {"gradient_clipping", 1.0},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.1}}}}},
              {"scheduler",
               {{"type", "WarmupLR"},
                {"params",
                 {{"warmup_min_lr", 1e-3},
                  {"warmup_max_lr", 1e-2},
                  {"warmup_num_steps", 4},
                  {"warmup_type", "linear"}}}}},
              {"model",
               {{"type", "gpt2"},
                {"vocab_size", kVocab},
                {"block_size", 16},
                {"n_layer", 2},
                {"n_head", 3},
                {"n_embd", 24},
                {"dropout", dropout},
                {"bias", false}}},
              {"data",
               {{"train", (data / "train_*.bin").string()},
                {"val", (data / "val_*.bin").string()},
                {"sampling", "random"}}},
              {"trainer",
               {{"steps", steps},
                {"eval_interval", 2},
                {"eval_batches", 2},
                {"seed", 5},
                {"threads", 2},
                {"device", device},
                {"log_dir", dir.string()},
                {"checkpoint_dir", (dir / "ckpt").string()},
                {"checkpoint_interval", 4},
                {"keep_last", 0}}}};
  for (const auto& [key, value] : extra.items()) doc[key] = value;
  return doc;
}

struct Outcome {
  std::map<int64_t, double> losses;         // step -> training loss (metrics.jsonl)
  std::map<int64_t, double> val_losses;     // step -> validation loss
  std::map<std::string, Tensor> weights;    // the last checkpoint's (f32 masters when 16-bit)
  std::map<std::string, Tensor> optimizer;  // its whole optimizer state (ZeRO stage 0)
  Json state;                               // its state.json
};

Outcome read_outcome(const fs::path& dir) {
  Outcome o;
  const testing::RunMetrics m = testing::read_run_metrics(dir);
  o.losses = m.losses;
  o.val_losses = m.val_losses;
  const std::optional<std::string> last = CheckpointDir((dir / "ckpt").string(), 0).latest();
  REQUIRE(last.has_value());
  const CheckpointContents c = load_checkpoint(*last);
  for (const auto& [name, t] : c.model) o.weights[name] = t;
  for (const auto& [name, t] : c.optimizer) o.optimizer[name] = t;
  o.state = c.state;
  return o;
}

// One trainer on a group of one rank.
Outcome train(const Json& doc, const fs::path& dir, ResumeMode mode) {
  const auto single = parallel::make_thread_group(1);
  RunConfig cfg = parse_run_config(doc, "test", dir.string());
  apply_run_environment(cfg, *single[0]);
  Trainer trainer(std::move(cfg), mode, *single[0]);
  trainer.run();
  return read_outcome(dir);
}

// Equal tensors: same dtype, shape and values (bit for bit for floats that are not NaN).
void check_same(const std::map<std::string, Tensor>& got,
                const std::map<std::string, Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    const Tensor& g = got.at(name);
    CHECK(g.dtype() == t.dtype());
    REQUIRE(g.shape() == t.shape());
    CHECK(g.to_vector<double>() == t.to_vector<double>());
  }
}

TEST_CASE("an f32 run on CUDA follows the same run on the CPU", "[gpu][trainer]") {
  REQUIRE(cuda::device_count() > 0);
  const fs::path root = testing::fresh_dir("trainer_gpu_f32");
  testing::write_cycle_shards(root / "data");
  const Outcome want = train(run_config(root / "data", root / "cpu", "cpu", 8, 0.0), root / "cpu",
                             ResumeMode::never);
  const Outcome got = train(run_config(root / "data", root / "cuda", "cuda", 8, 0.0), root / "cuda",
                            ResumeMode::never);
  REQUIRE(want.losses.size() == 8);
  REQUIRE(want.val_losses.size() == 4);
  // The reference learns; otherwise agreement within 1e-2 would say little.
  REQUIRE(want.losses.at(8) < 0.9 * want.losses.at(1));
  // TF32 GEMMs on the device (~1e-3 relative per product) against f32 on the CPU.
  constexpr double kTol = 1e-2;
  REQUIRE(got.losses.size() == want.losses.size());
  for (const auto& [step, loss] : want.losses) {
    INFO("step " << step << ": cpu " << loss << ", cuda " << got.losses.at(step));
    CHECK(std::abs(got.losses.at(step) - loss) <= kTol * loss);
  }
  REQUIRE(got.val_losses.size() == want.val_losses.size());
  for (const auto& [step, loss] : want.val_losses) {
    INFO("validation at step " << step << ": cpu " << loss << ", cuda " << got.val_losses.at(step));
    CHECK(std::abs(got.val_losses.at(step) - loss) <= kTol * loss);
  }
}

TEST_CASE("ZeRO-3 runs on CUDA follow the same runs on the CPU", "[gpu][trainer][zero]") {
  REQUIRE(cuda::device_count() > 0);
  const fs::path root = testing::fresh_dir("trainer_gpu_zero3");
  testing::write_cycle_shards(root / "data");
  // Parameters up to 100 elements stay whole (the norms); the others are gathered around
  // their module calls. The model is built partitioned (Note [Partitioned construction]).
  const Json zero3 = {{"stage", 3}, {"stage3_param_persistence_threshold", 100}};
  for (const char* precision : {"fp32", "bf16"}) {
    DYNAMIC_SECTION(precision) {
      Json extra = {{"zero_optimization", zero3}};
      if (std::string(precision) == "bf16") extra["bf16"] = {{"enabled", true}};
      const fs::path cpu = root / (std::string(precision) + "_cpu");
      const fs::path gpu = root / (std::string(precision) + "_cuda");
      const Outcome want =
          train(run_config(root / "data", cpu, "cpu", 8, 0.0, extra), cpu, ResumeMode::never);
      const Outcome got =
          train(run_config(root / "data", gpu, "cuda", 8, 0.0, extra), gpu, ResumeMode::never);
      REQUIRE(want.losses.at(8) < 0.9 * want.losses.at(1));
      // TF32 or bf16 GEMMs on the device against the CPU's f32 or bf16 ones.
      const double tol = std::string(precision) == "bf16" ? 5e-2 : 1e-2;
      REQUIRE(got.losses.size() == want.losses.size());
      for (const auto& [step, loss] : want.losses) {
        INFO("step " << step << ": cpu " << loss << ", cuda " << got.losses.at(step));
        CHECK(std::abs(got.losses.at(step) - loss) <= tol * loss);
      }
      REQUIRE(got.weights.size() == want.weights.size());
    }
  }
}

TEST_CASE("a bf16 run on CUDA trains, with f32 masters in its checkpoint", "[gpu][trainer]") {
  REQUIRE(cuda::device_count() > 0);
  const fs::path root = testing::fresh_dir("trainer_gpu_bf16");
  testing::write_cycle_shards(root / "data");
  const Outcome o = train(
      run_config(root / "data", root / "run", "cuda", 8, 0.0, {{"bf16", {{"enabled", true}}}}),
      root / "run", ResumeMode::never);
  REQUIRE(o.losses.size() == 8);
  for (const auto& [step, loss] : o.losses) {
    INFO("step " << step);
    CHECK(std::isfinite(loss));
  }
  CHECK(o.losses.at(8) < o.losses.at(1));
  REQUIRE(o.val_losses.count(8) == 1);
  CHECK(std::isfinite(o.val_losses.at(8)));
  CHECK(o.val_losses.at(8) < o.losses.at(1));
  REQUIRE_FALSE(o.weights.empty());
  for (const auto& [name, t] : o.weights) {
    INFO(name);
    CHECK(t.dtype() == DType::f32);
  }
}

TEST_CASE("an fp16 run on CUDA resumes from its checkpoint bit for bit", "[gpu][trainer]") {
  REQUIRE(cuda::device_count() > 0);
  const fs::path root = testing::fresh_dir("trainer_gpu_fp16_resume");
  testing::write_cycle_shards(root / "data");
  // A loss scale window of 1 doubles the scale after every good step, so the run meets
  // overflows and skipped steps on the way: the scaler's state is part of what resumes.
  // Dropout draws masks on the device from the checkpointed stream.
  const Json fp16 = {{"fp16",
                      {{"enabled", true},
                       {"initial_scale_power", 16},
                       {"loss_scale_window", 1},
                       {"hysteresis", 1}}}};
  const fs::path full = root / "full";
  const Outcome want =
      train(run_config(root / "data", full, "cuda", 8, 0.1, fp16), full, ResumeMode::never);
  REQUIRE(want.losses.size() == 8);
  for (const auto& [step, loss] : want.losses) {
    INFO("step " << step);
    REQUIRE(std::isfinite(loss));
  }
  REQUIRE(want.state.contains("loss_scaler"));
  INFO("loss scaler after 8 steps: " << want.state.at("loss_scaler").dump());

  // A copy of the run as it stood after its step 4 checkpoint, continued to step 8.
  const fs::path step4 = full / "ckpt" / "step_00000004";
  REQUIRE(fs::exists(step4));
  const fs::path resumed = root / "resumed";
  fs::create_directories(resumed / "ckpt");
  fs::copy(step4, resumed / "ckpt" / "step_00000004", fs::copy_options::recursive);
  testing::write_bytes(resumed / "ckpt" / "latest", "step_00000004\n");
  {
    std::ifstream in(full / "metrics.jsonl");
    std::ofstream out(resumed / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (Json::parse(line)["step"].get<int64_t>() <= 4) out << line << "\n";
    }
  }
  const Outcome got = train(run_config(root / "data", resumed, "cuda", 8, 0.1, fp16), resumed,
                            ResumeMode::required);

  CHECK(got.losses == want.losses);
  CHECK(got.val_losses == want.val_losses);
  check_same(got.weights, want.weights);
  check_same(got.optimizer, want.optimizer);
  CHECK(got.state.at("step") == want.state.at("step"));
  CHECK(got.state.at("loss_scaler") == want.state.at("loss_scaler"));
  CHECK(got.state.at("loader") == want.state.at("loader"));
  CHECK(got.state.at("scheduler_last_batch_iteration") ==
        want.state.at("scheduler_last_batch_iteration"));
}

// What tools/train does under mpirun with a CUDA device, on thread ranks: rank r trains on
// cuda:r, its gradients move over NCCL, its own values over the CPU group.
TEST_CASE("two ranks on two GPUs over NCCL follow the one-GPU run", "[gpu][trainer][nccl]") {
  if (cuda::device_count() < 2) {
    WARN("skipped: needs two CUDA devices, found " << cuda::device_count());
    return;
  }
  const fs::path root = testing::fresh_dir("trainer_gpu_nccl");
  testing::write_cycle_shards(root / "data");
  const Outcome want = train(run_config(root / "data", root / "one", "cuda", 8, 0.0), root / "one",
                             ResumeMode::never);
  const fs::path two = root / "two";
  for (int stage : {0, 2}) {
    DYNAMIC_SECTION("ZeRO stage " << stage) {
      fs::remove_all(two);
      Json doc = run_config(root / "data", two, "cuda", 8, 0.0);
      doc["zero_optimization"] = {{"stage", stage}};
      parallel::run_thread_ranks(2, [&](parallel::Communicator& cpu) {
        std::unique_ptr<parallel::Communicator> gpus = parallel::nccl_group(cpu, cpu.rank(), {});
        RunConfig cfg = parse_run_config(doc, "test", two.string(), 2);
        cfg.trainer.device = Device::cuda(cpu.rank());
        apply_run_environment(cfg, cpu, gpus.get());
        Trainer trainer(std::move(cfg), ResumeMode::never, cpu, gpus.get());
        trainer.run();
      });
      const Outcome got = read_outcome(two);
      // The same global batch split over two GPUs: sums in another order, TF32 products.
      constexpr double kTol = 1e-2;
      REQUIRE(got.losses.size() == want.losses.size());
      for (const auto& [step, loss] : want.losses) {
        INFO("step " << step << ": one GPU " << loss << ", two " << got.losses.at(step));
        CHECK(std::abs(got.losses.at(step) - loss) <= kTol * loss);
      }
      REQUIRE(got.weights.size() == want.weights.size());
      for (const auto& [name, t] : want.weights) {
        INFO(name);
        const std::vector<double> g = got.weights.at(name).to_vector<double>();
        const std::vector<double> w = t.to_vector<double>();
        double diff = 0, norm = 0;
        for (size_t i = 0; i < w.size(); ++i)
          diff += (g[i] - w[i]) * (g[i] - w[i]), norm += w[i] * w[i];
        CHECK(std::sqrt(diff) <= kTol * std::sqrt(norm));
      }
    }
  }
}

}  // namespace
}  // namespace tessera::train
