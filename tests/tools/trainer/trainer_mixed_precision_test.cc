// bf16 and fp16 training on the CPU, end to end on data-parallel thread ranks: ZeRO stages
// 0-3 at 2 and 3 ranks against the one-rank mixed-precision run, and resume from a
// mixed-precision checkpoint (bitwise at the same layout; a bf16 one at another world size
// and stage).
#include <catch2/catch.hpp>
#include <string>

#include "tests/test_files.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"
#include "tools/trainer/checkpoint.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing::check_close;
using testing::Outcome;
using testing::run_config;
using testing::train;

// The precision section; fp16 with a dynamic loss scale whose window is short enough to
// grow within the run.
Json precision(const std::string& dtype) {
  if (dtype == "bf16") return {{"bf16", {{"enabled", true}}}};
  return {{"fp16", {{"enabled", true}, {"initial_scale_power", 12}, {"loss_scale_window", 2}}}};
}

// A data-parallel run's losses and f32 masters differ from the one-rank run's by the
// order of the f32 gradient sums, which moves a 16-bit model value across a rounding
// boundary now and then, and training carries it (largest relative difference seen over
// every case here: 1.3e-3).
double tolerance(const std::string& dtype) { return dtype == "bf16" ? 5e-3 : 3e-3; }

TEST_CASE("bf16 and fp16 data-parallel runs at ZeRO stages 0-3 follow the one-rank run",
          "[trainer][mixed]") {
  const fs::path root = testing::fresh_dir("trainer_mixed_equivalence");
  testing::write_random_shard(root / "data", 41);
  // The f32 run: the mixed-precision runs must differ from it (training happened in 16 bits).
  const Outcome f32 = train(run_config(root / "data", root / "f32", 0, 6, 500'000'000),
                            root / "f32", 1, ResumeMode::never);
  for (const std::string dtype : {"bf16", "fp16"}) {
    const fs::path single = root / (dtype + "_single");
    const Outcome want =
        train(run_config(root / "data", single, 0, 6, 500'000'000, precision(dtype)), single, 1,
              ResumeMode::never);
    REQUIRE(want.losses.size() == 6);
    CHECK(want.losses.at(6) != f32.losses.at(6));
    for (int stage = 0; stage <= 3; ++stage) {
      for (int world : {2, 3}) {
        INFO(dtype << ", stage " << stage << ", world " << world);
        const fs::path dir =
            root / (dtype + "_s" + std::to_string(stage) + "w" + std::to_string(world));
        check_close(train(run_config(root / "data", dir, stage, 6, 1000, precision(dtype)), dir,
                          world, ResumeMode::never),
                    want, tolerance(dtype));
      }
    }
  }
}

TEST_CASE("a mixed-precision checkpoint resumes bitwise; a bf16 one at another world and stage",
          "[trainer][mixed]") {
  const fs::path root = testing::fresh_dir("trainer_mixed_resume");
  testing::write_random_shard(root / "data", 41);
  for (const std::string dtype : {"bf16", "fp16"}) {
    // The uninterrupted run: 2 ranks at stage 2, 6 steps, checkpoints at 3 and 6.
    const fs::path full = root / (dtype + "_full");
    const Outcome want = train(run_config(root / "data", full, 2, 6, 1000, precision(dtype)), full,
                               2, ResumeMode::never);
    const std::vector<std::pair<int, int>> layouts =
        dtype == "bf16" ? std::vector<std::pair<int, int>>{{2, 2}, {1, 0}, {3, 1}, {2, 3}}
                        : std::vector<std::pair<int, int>>{{2, 2}};
    for (const auto& [world, stage] : layouts) {
      INFO(dtype << " resumed at " << world << " ranks, stage " << stage);
      const fs::path dir =
          root / (dtype + "_resume" + std::to_string(world) + std::to_string(stage));
      testing::copy_run_at(full, 3, dir);
      const Outcome got = train(run_config(root / "data", dir, stage, 6, 1000, precision(dtype)),
                                dir, world, ResumeMode::required);
      if (world == 2) {  // the same layout: the fp16 loss scale and every bit carry over
        CHECK(got.losses == want.losses);
        CHECK(got.weights == want.weights);
      } else {
        check_close(got, want, tolerance(dtype));
      }
    }
  }
}

}  // namespace
}  // namespace tessera::train
