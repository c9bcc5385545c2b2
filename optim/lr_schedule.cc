#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera::optim {
namespace {

// The warmup fraction at t < W': ln(t + 1) / ln(W') (log) or t / W' (linear).
double warmup_fraction(int64_t t, int64_t steps, WarmupType type) {
  if (type == WarmupType::linear) return static_cast<double>(t) / static_cast<double>(steps);
  return std::log(static_cast<double>(t + 1)) / std::log(static_cast<double>(steps));
}

}  // namespace

WarmupLR::WarmupLR(WarmupParams p) : p_(p), steps_(std::max<int64_t>(2, p.warmup_num_steps)) {
  TS_CHECK(p.warmup_num_steps >= 0, "[WarmupLR] expected warmup_num_steps >= 0, found ",
           p.warmup_num_steps);
}

double WarmupLR::lr_at(int64_t t) const {
  if (t < 0) return p_.warmup_min_lr;
  const double gamma = t < steps_ ? warmup_fraction(t, steps_, p_.warmup_type) : 1.0;
  return p_.warmup_min_lr + (p_.warmup_max_lr - p_.warmup_min_lr) * gamma;
}

WarmupDecayLR::WarmupDecayLR(WarmupParams p, int64_t total_num_steps)
    : WarmupLR(p), total_(total_num_steps) {
  TS_CHECK(total_num_steps > 0, "[WarmupDecayLR] expected total_num_steps > 0, found ",
           total_num_steps);
}

double WarmupDecayLR::lr_at(int64_t t) const {
  if (t < 0) return p_.warmup_min_lr;
  const double gamma =
      t < steps_ ? warmup_fraction(t, steps_, p_.warmup_type)
                 : std::max(0.0, static_cast<double>(total_ - t) /
                                     static_cast<double>(std::max<int64_t>(1, total_ - steps_)));
  return p_.warmup_min_lr + (p_.warmup_max_lr - p_.warmup_min_lr) * gamma;
}

WarmupCosineLR::WarmupCosineLR(WarmupCosineParams p, double base_lr)
    : p_(p), base_lr_(base_lr), steps_(std::max<int64_t>(2, p.warmup_num_steps)) {
  TS_CHECK(p.total_num_steps > steps_, "[WarmupCosineLR] expected total_num_steps > ",
           "warmup_num_steps (", steps_, "), found ", p.total_num_steps);
}

double WarmupCosineLR::lr_at(int64_t t) const {
  if (t < 0) return 0.0;
  double ratio;
  if (t < steps_) {
    const double gamma = warmup_fraction(t, steps_, p_.warmup_type);
    ratio = p_.warmup_min_ratio + (1.0 - p_.warmup_min_ratio) * gamma;
  } else {
    const double progress =
        static_cast<double>(t - steps_ + 1) / static_cast<double>(p_.total_num_steps - steps_);
    ratio = std::max(
        0.0, p_.cos_min_ratio + (1.0 - p_.cos_min_ratio) * (1.0 + std::cos(M_PI * progress)) / 2.0);
  }
  return base_lr_ * ratio;
}

OneCycle::OneCycle(OneCycleParams p) : p_(p) {
  const int64_t first = p.cycle_first_step_size;
  const int64_t second = p.cycle_second_step_size.value_or(first);
  TS_CHECK(first > 0 && second > 0, "[OneCycle] expected positive cycle step sizes, found ", first,
           " and ", second);
  TS_CHECK(p.decay_step_size >= 0, "[OneCycle] expected decay_step_size >= 0, found ",
           p.decay_step_size);
  total_ = first + second;
  ratio_ = static_cast<double>(first) / static_cast<double>(total_);
}

double OneCycle::cycle_scale(int64_t t) const {
  const double progress = static_cast<double>(t + 1) / static_cast<double>(total_);
  const double x = 1.0 + progress - std::floor(1.0 + progress);
  return x <= ratio_ ? x / ratio_ : (x - 1.0) / (ratio_ - 1.0);
}

double OneCycle::decay_interval(int64_t t) const {
  if (p_.decay_step_size == 0) return 0.0;
  return static_cast<double>(t - total_ + 1) / static_cast<double>(p_.decay_step_size);
}

double OneCycle::lr_at(int64_t t) const {
  if (t < total_) return p_.cycle_min_lr + (p_.cycle_max_lr - p_.cycle_min_lr) * cycle_scale(t);
  return p_.cycle_min_lr / (1.0 + p_.decay_lr_rate * decay_interval(t));
}

std::optional<double> OneCycle::beta1_at(int64_t t) const {
  if (!p_.cycle_momentum) return std::nullopt;
  if (t < total_) {
    return p_.cycle_max_mom - (p_.cycle_max_mom - p_.cycle_min_mom) * cycle_scale(t);
  }
  return p_.cycle_max_mom * (1.0 + p_.decay_mom_rate * decay_interval(t));
}

LRRangeTest::LRRangeTest(LRRangeTestParams p) : p_(p) {
  TS_CHECK(p.lr_range_test_step_size > 0,
           "[LRRangeTest] expected lr_range_test_step_size > 0, found ", p.lr_range_test_step_size);
}

double LRRangeTest::lr_at(int64_t t) const {
  double interval = static_cast<double>(t + 1) / static_cast<double>(p_.lr_range_test_step_size);
  if (p_.lr_range_test_staircase) interval = std::floor(interval);
  return p_.lr_range_test_min_lr * (1.0 + p_.lr_range_test_step_rate * interval);
}

LrScheduler::LrScheduler(std::shared_ptr<const LrSchedule> schedule)
    : schedule_(std::move(schedule)) {
  TS_CHECK(schedule_ != nullptr, "[LrScheduler] expected a schedule, found none");
}

void LrScheduler::set_last_batch_iteration(int64_t t) {
  TS_CHECK(t >= -1, "[LrScheduler] expected last_batch_iteration >= -1, found ", t);
  t_ = t;
}

}  // namespace tessera::optim
