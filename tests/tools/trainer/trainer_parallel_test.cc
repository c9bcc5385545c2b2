// The trainer on data-parallel thread ranks, end to end: per-step losses and final weights
// against the single-process run with the same global batch (ZeRO stages 0-3, world 1-4),
// and resume from a 2-rank ZeRO-2 or ZeRO-3 checkpoint at 2 ranks (bitwise) and at 1 and 3
// ranks.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>

#include "parallel/comm/thread_comm.h"
#include "tests/test_files.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"
#include "tools/trainer/trainer.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::check_close;
using testing::Outcome;
using testing::run_config;
using testing::train;

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
        testing::copy_run_at(full, 3, dir);
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
