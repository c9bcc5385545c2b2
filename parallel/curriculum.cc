#include "parallel/curriculum.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera::parallel {
namespace {

constexpr int64_t kMax = int64_t{1} << 62;

// DeepSpeed's assert message for a required key.
void require(JsonObjectReader& s, const char* key) {
  TS_CHECK(s.has(key), "[config] ", s.key_path(key), ": Curriculum learning requires the config '",
           key, "'");
}

}  // namespace

CurriculumConfig CurriculumConfig::from_json(JsonObjectReader s) {
  CurriculumConfig c;
  c.enabled = s.get<bool>("enabled", false);
  if (!c.enabled) {
    // Disabled sections are accepted as they are (their keys are not used).
    for (const char* key : {"curriculum_type", "min_difficulty", "max_difficulty", "schedule_type",
                            "schedule_config"}) {
      s.raw(key);
    }
    return c;
  }
  c.curriculum_type = s.get_one_of("curriculum_type", "seqlen", {"seqlen"});
  for (const char* key : {"min_difficulty", "max_difficulty", "schedule_type"}) require(s, key);
  c.min_difficulty = s.required_in_range<int64_t>("min_difficulty", 1, kMax);
  c.max_difficulty = s.required_in_range<int64_t>("max_difficulty", c.min_difficulty, kMax);
  const std::string type = s.required<std::string>("schedule_type");
  TS_CHECK(type != "custom", "[config] ", s.key_path("schedule_type"),
           ": \"custom\" schedules are set by a Python callback "
           "(set_custom_curriculum_learning_schedule); expected fixed_linear, fixed_root or "
           "fixed_discrete");
  TS_CHECK(type == "fixed_linear" || type == "fixed_root" || type == "fixed_discrete", "[config] ",
           s.key_path("schedule_type"), ": Unsupported curriculum schedule type \"", type,
           "\"; expected fixed_linear, fixed_root or fixed_discrete");
  c.schedule_type = type;
  JsonObjectReader sc = s.required_object("schedule_config");
  if (type == "fixed_discrete") {
    c.difficulty = sc.required<std::vector<int64_t>>("difficulty");
    c.max_step = sc.required<std::vector<int64_t>>("max_step");
    TS_CHECK(!c.max_step.empty() && c.difficulty.size() == c.max_step.size() + 1, "[config] ",
             sc.path(), ": expected difficulty to have one entry more than max_step (and max_step ",
             "at least one), found ", c.difficulty.size(), " and ", c.max_step.size());
    for (const int64_t d : c.difficulty) {
      TS_CHECK(d >= 1, "[config] ", sc.key_path("difficulty"),
               ": expected sequence lengths >= 1, found ", d);
    }
    return c;
  }
  c.total_curriculum_step = sc.required_in_range<int64_t>("total_curriculum_step", 1, kMax);
  c.difficulty_step = sc.required_in_range<int64_t>("difficulty_step", 1, kMax);
  if (type == "fixed_root") {
    c.root_degree = sc.required_in_range<int64_t>("root_degree", 1, kMax);
  } else {
    sc.ignored("root_degree", "fixed_linear is fixed_root of degree 1");
  }
  TS_CHECK(c.min_difficulty >= c.difficulty_step, "[config] ", s.key_path("min_difficulty"), ": ",
           c.min_difficulty, " rounds down to a multiple of difficulty_step ", c.difficulty_step,
           " (", c.min_difficulty - c.min_difficulty % c.difficulty_step,
           " tokens); expected min_difficulty >= difficulty_step");
  if (c.difficulty_step % 8 != 0) {
    s.warn(str_cat(sc.key_path("difficulty_step"), " ", c.difficulty_step,
                   " is not a multiple of 8: sequence lengths that are may run faster "
                   "(DeepSpeed's warning, for Tensor Cores)"));
  }
  return c;
}

int64_t curriculum_difficulty(const CurriculumConfig& c, int64_t t) {
  if (c.schedule_type == "fixed_discrete") {
    for (size_t i = 0; i < c.max_step.size(); ++i) {
      if (t <= c.max_step[i]) return c.difficulty[i];
    }
    return c.difficulty.back();
  }
  const double fraction = static_cast<double>(t) / static_cast<double>(c.total_curriculum_step);
  const double span = static_cast<double>(c.max_difficulty - c.min_difficulty);
  int64_t d = static_cast<int64_t>(
      std::floor(std::pow(fraction, 1.0 / static_cast<double>(c.root_degree)) * span +
                 static_cast<double>(c.min_difficulty)));
  d -= d % c.difficulty_step;
  return std::min(d, c.max_difficulty);
}

CurriculumScheduler::CurriculumScheduler(const CurriculumConfig& config)
    : config_(config), current_(config.min_difficulty) {}

int64_t CurriculumScheduler::update(int64_t t) {
  if (current_ < config_.max_difficulty) current_ = curriculum_difficulty(config_, t);
  return current_;
}

}  // namespace tessera::parallel
