// The 1-bit optimizers' timelines (Note [0/1 Adam timeline]) against a replay of
// DeepSpeed's deepspeed/runtime/fp16/onebit/zoadam.py counters for
// kappa = 2, var_freeze_step = 20, local_step_scaler = 3, local_step_clipper = 4; 1-bit
// Adam's three stages; and when the variance freezes.
#include "parallel/compression/onebit_schedule.h"

#include <catch2/catch.hpp>
#include <vector>

namespace tessera::parallel {
namespace {

std::vector<int64_t> steps_of(const std::vector<OneBitStep>& kinds, OneBitStep kind) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == kind) out.push_back(static_cast<int64_t>(i) + 1);
  }
  return out;
}

TEST_CASE("0/1 Adam's timeline equals the reference vector", "[onebit]") {
  ZeroOneAdamSchedule s(20, 2, 3, 4);
  std::vector<OneBitStep> kinds;
  std::vector<bool> full_next;  // before each step: whether it needs the f32 all-reduce
  for (int i = 0; i < 44; ++i) {
    full_next.push_back(s.next_is_full_precision());
    kinds.push_back(s.next());
  }
  CHECK(s.step() == 44);
  CHECK(steps_of(kinds, OneBitStep::init) == std::vector<int64_t>{1});
  CHECK(steps_of(kinds, OneBitStep::full_precision) == std::vector<int64_t>{2, 3, 4, 6, 8, 12, 16});
  CHECK(steps_of(kinds, OneBitStep::onebit_gradient) ==
        std::vector<int64_t>{5, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 20, 21});
  CHECK(steps_of(kinds, OneBitStep::local_sync) ==
        std::vector<int64_t>{22, 23, 24, 26, 28, 32, 36, 40, 44});
  const std::vector<int64_t> local = steps_of(kinds, OneBitStep::local);
  CHECK(local.front() == 25);
  CHECK(local.size() == 44 - 21 - 9);
  // The engine all-reduces in full precision exactly before the variance steps.
  for (size_t i = 0; i < kinds.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(full_next[i] == (kinds[i] == OneBitStep::full_precision));
  }
}

TEST_CASE("1-bit Adam: init, full precision to freeze_step, then compressed", "[onebit]") {
  std::vector<OneBitStep> kinds;
  for (int64_t t = 1; t <= 6; ++t) kinds.push_back(onebit_adam_step(t, 4));
  CHECK(kinds == std::vector<OneBitStep>{OneBitStep::init, OneBitStep::full_precision,
                                         OneBitStep::full_precision, OneBitStep::full_precision,
                                         OneBitStep::compressed, OneBitStep::compressed});
  CHECK(onebit_adam_step(1000, 1 << 30) == OneBitStep::full_precision);  // never compressed
  CHECK_THROWS_WITH(onebit_adam_step(0, 4), Catch::Contains("expected a step count from 1"));
}

TEST_CASE("0/1 Adam's variance freezes at the end of the first step past var_freeze_step",
          "[onebit]") {
  ZeroOneAdamSchedule s(20, 2, 3, 4);
  for (int i = 0; i < 21; ++i) {
    CHECK_FALSE(s.variance_frozen());
    s.next();
  }
  CHECK(s.variance_frozen());  // after step 21; step 22 is the first local step
  CHECK(s.next() == OneBitStep::local_sync);
  CHECK_THROWS_WITH(ZeroOneAdamSchedule(20, 0, 3, 4),
                    Catch::Contains("expected var_update_scaler, local_step_scaler and "
                                    "local_step_clipper >= 1, found 0, 3, 4"));
}

}  // namespace
}  // namespace tessera::parallel
