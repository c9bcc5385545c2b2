// DeepSpeed's legacy curriculum learning (deepspeed/runtime/data_pipeline/
// curriculum_scheduler.py): training starts on short sequences and lengthens them with the
// step, which Megatron-DeepSpeed's GPT applies by truncating each batch's sequences.
//
// Note [Curriculum schedule]
// The difficulty (here: the training sequence length) of step t (1-based: DeepSpeed's
// engine calls update_difficulty(global_steps + 1) before each training forward) is
//   fixed_root:     d = floor((t / T)^(1 / root_degree) * (max - min) + min), in double
//                   precision; then d -= d % difficulty_step; then d = min(d, max)
//   fixed_linear:   fixed_root with root_degree 1
//   fixed_discrete: difficulty[i] for the first i with t <= max_step[i]; difficulty.back()
//                   after max_step.back()
// (T = total_curriculum_step). The rounding comes before the clamp, so max is reached only
// once the rounded value gets there: with min 16, max 1000, step 16, T 100, t = 100 gives
// 992 and t = 101 gives 1000. The scheduler updates only while its difficulty is below max, so
// it freezes there. DeepSpeed's rounding can fall below min (min 10, step 8: 8) and to 0
// when min < difficulty_step; here that is a config error, as a sequence of 0 tokens cannot
// be trained on. "custom" schedules need a Python callback and are refused, and so are
// curriculum types other than "seqlen".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace tessera::parallel {

// The "curriculum_learning" section, DeepSpeed's keys.
struct CurriculumConfig {
  bool enabled = false;
  std::string curriculum_type = "seqlen";
  int64_t min_difficulty = 0;
  int64_t max_difficulty = 0;
  std::string schedule_type;  // fixed_linear, fixed_root or fixed_discrete
  // fixed_linear and fixed_root:
  int64_t total_curriculum_step = 0;
  int64_t difficulty_step = 1;
  int64_t root_degree = 1;
  // fixed_discrete:
  std::vector<int64_t> difficulty;
  std::vector<int64_t> max_step;

  // Reads and checks the section (min_difficulty, max_difficulty and schedule_type required
  // when enabled, with DeepSpeed's messages; the schedule_config keys its type needs). A
  // difficulty_step that is not a multiple of 8 is a warning, as in DeepSpeed.
  static CurriculumConfig from_json(JsonObjectReader section);
};

// The difficulty of step t (1-based) by the schedule alone (Note [Curriculum schedule]).
int64_t curriculum_difficulty(const CurriculumConfig& config, int64_t t);

// DeepSpeed's CurriculumScheduler: the current difficulty, starting at min_difficulty and
// updated while below max_difficulty.
class CurriculumScheduler {
 public:
  explicit CurriculumScheduler(const CurriculumConfig& config);
  // The difficulty for step t (1-based), after updating to it.
  int64_t update(int64_t t);
  int64_t current() const { return current_; }
  // Restores a checkpoint's difficulty.
  void set_current(int64_t difficulty) { current_ = difficulty; }

 private:
  CurriculumConfig config_;
  int64_t current_;
};

}  // namespace tessera::parallel
