// DeepSpeed's legacy seqlen curriculum in training runs (Note [Curriculum schedule] in
// parallel/curriculum.h): each step trains on the schedule's sequence length; a checkpoint
// resumes the schedule exactly; a pipeline relearns its transfer shapes as the length grows
// and around whole-window evaluations, and follows the one-process run; a schedule longer
// than the training windows is a config error.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "parallel/curriculum.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/data_parallel_runs.h"
#include "tests/tools/trainer/random_shard.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// fixed_linear from 2 to 6 tokens (the windows' length) over 4 steps, in steps of 2:
// 2, 4, 4, 6, then 6.
const Json kCurriculum = {
    {"enabled", true},
    {"curriculum_type", "seqlen"},
    {"min_difficulty", 2},
    {"max_difficulty", 6},
    {"schedule_type", "fixed_linear"},
    {"schedule_config", {{"total_curriculum_step", 4}, {"difficulty_step", 2}}}};

Json curriculum_run(const fs::path& root, const fs::path& dir, const Json& more = Json::object()) {
  Json extra = {{"curriculum_learning", kCurriculum},
                {"data", {{"val", (root / "data" / "train_*.bin").string()}}},
                {"trainer", {{"eval_interval", 2}, {"eval_batches", 2}}}};
  extra.merge_patch(more);
  return testing::run_config(root / "data", dir, 1, 6, 1000, extra);
}

// step -> the sequence length metrics.jsonl recorded.
std::map<int64_t, int64_t> seq_lens(const fs::path& dir) {
  std::map<int64_t, int64_t> out;
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json r = Json::parse(line);
    if (r["kind"] == "train") out[r["step"].get<int64_t>()] = r["seq_len"].get<int64_t>();
  }
  return out;
}

TEST_CASE("steps train on the schedule's lengths, and a checkpoint resumes it exactly",
          "[trainer][curriculum]") {
  const fs::path root = testing::fresh_dir("trainer_curriculum");
  testing::write_random_shard(root / "data", 41);
  const testing::Outcome full =
      testing::train(curriculum_run(root, root / "full"), root / "full", 1, ResumeMode::never);
  CHECK(seq_lens(root / "full") ==
        std::map<int64_t, int64_t>{{1, 2}, {2, 4}, {3, 4}, {4, 6}, {5, 6}, {6, 6}});
  // The same schedule by DeepSpeed's formula.
  JsonObjectReader section(kCurriculum, "config");
  const parallel::CurriculumConfig c = parallel::CurriculumConfig::from_json(section);
  for (int64_t t = 1; t <= 6; ++t)
    CHECK(seq_lens(root / "full").at(t) == parallel::curriculum_difficulty(c, t));
  // Stopped after step 3's checkpoint (at length 4), resumed to 6: the same bits.
  const fs::path resumed = root / "resumed";
  Json first = curriculum_run(root, resumed);
  first["trainer"]["steps"] = 3;
  testing::train(first, resumed, 1, ResumeMode::never);
  const testing::Outcome second =
      testing::train(curriculum_run(root, resumed), resumed, 1, ResumeMode::required);
  testing::check_close(second, full, 0);
  CHECK(seq_lens(resumed) == seq_lens(root / "full"));
}

TEST_CASE("a pipeline follows the curriculum and the one-process run", "[trainer][curriculum]") {
  const fs::path root = testing::fresh_dir("trainer_curriculum_pipeline");
  testing::write_random_shard(root / "data", 41);
  const testing::Outcome single =
      testing::train(curriculum_run(root, root / "single"), root / "single", 1, ResumeMode::never);
  const fs::path dir = root / "pipeline";
  const testing::Outcome piped = testing::train(
      curriculum_run(root, dir, {{"pipeline", {{"stages", 2}, {"partition_method", "uniform"}}}}),
      dir, 2, ResumeMode::never);
  testing::check_close(piped, single, 1e-5);
  CHECK(testing::read_run_metrics(dir).val_losses.size() == 3);
}

TEST_CASE("a schedule longer than the training windows is an error", "[trainer][curriculum]") {
  const fs::path root = testing::fresh_dir("trainer_curriculum_error");
  Json doc = curriculum_run(root, root / "run");
  doc["curriculum_learning"]["max_difficulty"] = 8;
  CHECK(testing::error_of([&] { parse_run_config(doc, "test", (root / "run").string()); }) ==
        "[config] $.curriculum_learning: its sequences reach 8 tokens; expected at most "
        "data.seq_len, 6 (the curriculum shortens the training windows)");
}

}  // namespace
}  // namespace tessera::train
