// DeepSpeed's legacy curriculum schedules (Note [Curriculum schedule] in
// parallel/curriculum.h) against DeepSpeed's own test vectors
// (tests/unit/runtime/test_data_efficiency.py) and worked values from its formulas, and the
// section's checks.
#include "parallel/curriculum.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "tests/testing.h"

namespace tessera::parallel {
namespace {

CurriculumConfig parse(const nlohmann::json& section) {
  const nlohmann::json doc = {{"curriculum_learning", section}};
  JsonObjectReader root(doc, "config");
  CurriculumConfig c = CurriculumConfig::from_json(root.object("curriculum_learning"));
  root.finish();
  return c;
}

nlohmann::json root_schedule(int64_t min, int64_t max, int64_t total, int64_t step,
                             int64_t degree) {
  nlohmann::json s = {
      {"enabled", true},
      {"curriculum_type", "seqlen"},
      {"min_difficulty", min},
      {"max_difficulty", max},
      {"schedule_type", degree == 1 ? "fixed_linear" : "fixed_root"},
      {"schedule_config", {{"total_curriculum_step", total}, {"difficulty_step", step}}}};
  if (degree != 1) s["schedule_config"]["root_degree"] = degree;
  return s;
}

// The scheduler's difficulty at t = 1, 2, ... `steps`, updated once per step.
std::vector<int64_t> trajectory(const CurriculumConfig& c, int64_t steps) {
  CurriculumScheduler s(c);
  std::vector<int64_t> out;
  for (int64_t t = 1; t <= steps; ++t) out.push_back(s.update(t));
  return out;
}

TEST_CASE("fixed_linear and fixed_discrete follow DeepSpeed's unit tests", "[curriculum]") {
  // test_fixed_linear: min 2, max 10, T 8, step 2.
  CHECK(trajectory(parse(root_schedule(2, 10, 8, 2, 1)), 10) ==
        std::vector<int64_t>{2, 4, 4, 6, 6, 8, 8, 10, 10, 10});
  // test_fixed_discrete: difficulty [1..5], max_step [2, 4, 6, 8].
  const CurriculumConfig discrete =
      parse({{"enabled", true},
             {"min_difficulty", 1},
             {"max_difficulty", 5},
             {"schedule_type", "fixed_discrete"},
             {"schedule_config", {{"difficulty", {1, 2, 3, 4, 5}}, {"max_step", {2, 4, 6, 8}}}}});
  CHECK(trajectory(discrete, 10) == std::vector<int64_t>{1, 1, 2, 2, 3, 3, 4, 4, 5, 5});
}

TEST_CASE("fixed_root and fixed_linear at chosen steps", "[curriculum]") {
  const std::vector<std::pair<int64_t, int64_t>> root2 = {
      {100, 56}, {10000, 512}, {20000, 720}, {39999, 1016}, {40000, 1024}};
  const CurriculumConfig r = parse(root_schedule(8, 1024, 40000, 8, 2));
  for (const auto& [t, d] : root2) {
    INFO("t " << t);
    CHECK(curriculum_difficulty(r, t) == d);
  }
  const CurriculumConfig l = parse(root_schedule(8, 1024, 40000, 8, 1));
  CHECK(curriculum_difficulty(l, 1) == 8);
  CHECK(curriculum_difficulty(l, 10000) == 256);
  CHECK(curriculum_difficulty(l, 20000) == 512);
  CHECK(curriculum_difficulty(l, 40000) == 1024);
  // Rounding before the clamp: max is reached only after T (min 16, max 1000, step 16).
  const CurriculumConfig late = parse(root_schedule(16, 1000, 100, 16, 1));
  CHECK(curriculum_difficulty(late, 100) == 992);
  CHECK(curriculum_difficulty(late, 101) == 1000);
  // The scheduler freezes at max.
  // DeepSpeed's rounding may fall below min (min 10, step 8: 8 at t = 1).
  CHECK(curriculum_difficulty(parse(root_schedule(10, 1000, 40000, 8, 1)), 1) == 8);
  CurriculumScheduler s(late);
  CHECK(s.current() == 16);
  CHECK(s.update(101) == 1000);
  CHECK(s.update(50) == 1000);
}

TEST_CASE("the section's errors name the key and what was expected", "[curriculum]") {
  nlohmann::json s = root_schedule(8, 64, 100, 8, 1);
  s.erase("min_difficulty");
  CHECK(testing::error_of([&] { parse(s); }) ==
        "[config] $.curriculum_learning.min_difficulty: Curriculum learning requires the config "
        "'min_difficulty'");
  s = root_schedule(4, 64, 100, 8, 1);
  CHECK(testing::error_of([&] { parse(s); }) ==
        "[config] $.curriculum_learning.min_difficulty: 4 rounds down to a multiple of "
        "difficulty_step 8 (0 tokens); expected min_difficulty >= difficulty_step");
  s = root_schedule(8, 64, 100, 8, 1);
  s["schedule_type"] = "custom";
  CHECK_THAT(testing::error_of([&] { parse(s); }),
             Catch::Contains("\"custom\" schedules are set by a Python callback"));
  s["schedule_type"] = "fixed_log";
  CHECK_THAT(testing::error_of([&] { parse(s); }),
             Catch::Contains("Unsupported curriculum schedule type \"fixed_log\""));
  s = root_schedule(8, 64, 100, 8, 1);
  s["curriculum_type"] = "vocab";
  CHECK_THAT(testing::error_of([&] { parse(s); }),
             Catch::Contains("$.curriculum_learning.curriculum_type") && Catch::Contains("seqlen"));
  s = root_schedule(8, 64, 100, 8, 2);
  s["schedule_config"].erase("root_degree");
  CHECK_THAT(testing::error_of([&] { parse(s); }),
             Catch::Contains("$.curriculum_learning.schedule_config.root_degree"));
  // A disabled section is accepted with its keys.
  s = root_schedule(8, 64, 100, 8, 1);
  s["enabled"] = false;
  CHECK_FALSE(parse(s).enabled);
}

}  // namespace
}  // namespace tessera::parallel
