// Expert parallelism in the trainer (Note [Expert parameters] in
// parallel/zero/zero_optimizer.h, Note [Expert checkpoints] in parallel/engine/engine.h):
// ep_size 2 and 4 on 4 thread ranks follow ep_size 1 on the same ranks (the same
// micro-batches, so the same routing, drops and load-balancing losses) at ZeRO stages 0-3
// and with fp16; without drops or the auxiliary loss a run equals one process; checkpoints
// hold each expert-parallel rank's experts and resume under any other ep_size and world.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include "models/io/safetensors.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"
#include "tests/tools/trainer/thread_trainer.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// The data-parallel test model (tests/tools/trainer/data_parallel_runs.h) with 4 experts,
// top-2, in its second block, split over `ep` ranks, plus `moe` (more MoE keys); 16
// sequences a step in 2 micro-batches per rank.
Json ep_run(const fs::path& data, const fs::path& dir, int stage, int64_t ep,
            const Json& moe = Json::object(), const Json& extra = Json::object()) {
  Json m = {{"num_experts", 4}, {"k", 2}, {"capacity_factor", 1.25}, {"ep_size", ep}};
  m.merge_patch(moe);
  Json doc = testing::run_config(data, dir, stage, 6, 400,
                                 {{"train_batch_size", 16}, {"model", {{"moe", m}}}});
  doc.merge_patch(extra);
  return doc;
}

// No token dropped, no auxiliary loss and no noise in the second choice: each token's
// output and loss are then its own, whatever else shares its micro-batch, so any world size
// gives one process's run.
const Json kPerToken = {
    {"drop_tokens", false}, {"aux_loss_coef", 0.0}, {"top2_2nd_expert_sampling", false}};

TEST_CASE("expert parallelism follows ep_size 1 on the same ranks", "[trainer][moe][expert]") {
  const fs::path root = testing::fresh_dir("trainer_ep_same_ranks");
  testing::write_random_shard(root / "data", 29);
  const testing::Outcome want =
      testing::train(ep_run(root / "data", root / "ep1", 0, 1), root / "ep1", 4, ResumeMode::never);
  REQUIRE(want.losses.size() == 6);
  for (const auto& [ep, stage] :
       {std::pair{2, 0}, {2, 1}, {2, 2}, {2, 3}, {4, 0}, {4, 2}, {4, 3}}) {
    DYNAMIC_SECTION("ep_size " << ep << ", stage " << stage) {
      const fs::path dir = root / ("ep" + std::to_string(ep) + "_s" + std::to_string(stage));
      testing::check_close(
          testing::train(ep_run(root / "data", dir, stage, ep), dir, 4, ResumeMode::never), want,
          1e-5);
      // Rank 0's all-to-all bytes per step (Note [Bytes sent] in
      // parallel/comm/communicator.h): 2 micro-batches x 4 exchanges (dispatch and combine,
      // forward and backward) of the (E x C, n_embd) f32 buffers, (P - 1) / P of each sent.
      std::ifstream metrics(dir / "metrics.jsonl");
      int64_t records = 0;
      for (std::string line; std::getline(metrics, line); ++records) {
        const Json rec = Json::parse(line);
        const int64_t capacity = rec["moe"][0]["capacity"].get<int64_t>();
        CHECK(capacity == 8);  // ceil(12 tokens / 4 experts x 1.25 x top-2)
        CHECK(rec["all_to_all_bytes"].get<int64_t>() ==
              2 * 4 * (ep - 1) * (4 * capacity * 25 * 4) / ep);
      }
      CHECK(records == 6);
    }
  }
  // Both parts' reductions (and at stage 1 their gathers after the step, at stage 3 their
  // gathers) on worker threads of their own.
  for (const int stage : {1, 3}) {
    DYNAMIC_SECTION("ep_size 2, stage " << stage << ", overlap_comm") {
      const fs::path dir = root / ("ep2_s" + std::to_string(stage) + "_overlap");
      const Json overlap = {{"zero_optimization", {{"overlap_comm", true}}}};
      testing::check_close(
          testing::train(ep_run(root / "data", dir, stage, 2, Json::object(), overlap), dir, 4,
                         ResumeMode::never),
          want, 1e-5);
    }
  }
}

TEST_CASE("expert parallelism with fp16 follows ep_size 1 with fp16", "[trainer][moe][expert]") {
  const fs::path root = testing::fresh_dir("trainer_ep_fp16");
  testing::write_random_shard(root / "data", 29);
  const Json fp16 = {{"fp16", {{"enabled", true}, {"initial_scale_power", 8}}}};
  const testing::Outcome want =
      testing::train(ep_run(root / "data", root / "ep1", 1, 1, Json::object(), fp16), root / "ep1",
                     4, ResumeMode::never);
  const fs::path dir = root / "ep2";
  testing::check_close(testing::train(ep_run(root / "data", dir, 1, 2, Json::object(), fp16), dir,
                                      4, ResumeMode::never),
                       want, 5e-3);
}

TEST_CASE("expert parallelism without drops or aux loss equals one process",
          "[trainer][moe][expert]") {
  const fs::path root = testing::fresh_dir("trainer_ep_single");
  testing::write_random_shard(root / "data", 29);
  const testing::Outcome want =
      testing::train(ep_run(root / "data", root / "single", 0, 1, kPerToken), root / "single", 1,
                     ResumeMode::never);
  const fs::path dir = root / "ep2";
  testing::check_close(
      testing::train(ep_run(root / "data", dir, 2, 2, kPerToken), dir, 4, ResumeMode::never), want,
      1e-5);
}

TEST_CASE("expert checkpoints hold each rank's experts and reshard to any ep_size",
          "[trainer][moe][expert]") {
  const fs::path root = testing::fresh_dir("trainer_ep_checkpoints");
  testing::write_random_shard(root / "data", 29);
  const testing::Outcome want = testing::train(
      ep_run(root / "data", root / "full", 1, 2, kPerToken), root / "full", 4, ResumeMode::never);
  // Expert-parallel rank e's files hold experts 2e and 2e + 1 of block 1, weights and
  // Adam's two moments, and nothing else.
  const fs::path step3 = root / "full" / "ckpt" / "step_00000003";
  for (int e = 0; e < 2; ++e) {
    const StateDict weights = read_safetensors((step3 / expert_model_name(e)).string()).tensors;
    const StateDict state = read_safetensors((step3 / expert_optimizer_name(e)).string()).tensors;
    std::set<std::string> names;
    for (const auto& [name, t] : weights) names.insert(name);
    std::set<std::string> expected;
    for (const int x : {2 * e, 2 * e + 1}) {
      for (const char* p : {"c_fc.weight", "c_proj.weight"}) {
        expected.insert("transformer.h.1.mlp.experts." + std::to_string(x) + "." + p);
      }
    }
    CHECK(names == expected);
    CHECK(state.size() == 2 * expected.size() + 1);  // exp_avg, exp_avg_sq, step
  }
  // The other weights and the whole checkpoint read as one model's.
  const StateDict whole = load_checkpoint(step3.string(), false).model;
  int64_t experts = 0;
  for (const auto& [name, t] : whole) experts += name.find(".experts.") != std::string::npos;
  CHECK(experts == 8);

  for (const auto& [world, ep, stage] : {std::tuple{2, 1, 0}, {4, 4, 2}, {2, 2, 1}}) {
    DYNAMIC_SECTION("resumed on " << world << " ranks at ep_size " << ep << ", stage " << stage) {
      const fs::path dir = root / ("w" + std::to_string(world) + "_ep" + std::to_string(ep));
      testing::copy_run_at(root / "full", 3, dir);
      testing::check_close(testing::train(ep_run(root / "data", dir, stage, ep, kPerToken), dir,
                                          world, ResumeMode::required),
                           want, 1e-5);
    }
  }
  SECTION("an ep_size 1 checkpoint resumes at ep_size 2") {
    const fs::path ep1 = root / "ep1_full";
    testing::train(ep_run(root / "data", ep1, 2, 1, kPerToken), ep1, 2, ResumeMode::never);
    const fs::path dir = root / "from_ep1";
    testing::copy_run_at(ep1, 3, dir);
    testing::check_close(
        testing::train(ep_run(root / "data", dir, 1, 2, kPerToken), dir, 4, ResumeMode::required),
        want, 1e-5);
  }
}

TEST_CASE("expert parallelism refuses what it cannot split", "[trainer][moe][expert]") {
  const fs::path root = testing::fresh_dir("trainer_ep_errors");
  testing::write_random_shard(root / "data", 29);
  // 3 ranks do not split into expert groups of 2.
  CHECK_THROWS_WITH(
      testing::train_on_threads(
          ep_run(root / "data", root / "w3", 0, 2, Json::object(), {{"train_batch_size", 12}}),
          root / "w3", 3, ResumeMode::never),
      Catch::Contains("ep_size 2: expected a divisor of the data-parallel group's 3 ranks"));
  // ep_size 8 does not divide 4 experts.
  CHECK_THROWS_WITH(
      parse_run_config(ep_run(root / "data", root / "ep8", 0, 8), "test", root.string(), 8),
      Catch::Contains("ep_size: expected a divisor of every num_experts (4), found 8"));
  // A pipeline with split experts.
  CHECK_THROWS_WITH(parse_run_config(ep_run(root / "data", root / "pipe", 0, 2, Json::object(),
                                            {{"pipeline", {{"stages", 2}}}}),
                                     "test", root.string(), 4),
                    Catch::Contains("expert parallelism with pipeline stages or tensor slicing"));
}

}  // namespace
}  // namespace tessera::train
