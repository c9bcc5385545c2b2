// Learning-rate schedules with DeepSpeed's exact semantics (deepspeed/runtime/lr_schedules.py).
//
// Note [Schedule time]
// t is DeepSpeed's `last_batch_iteration`: -1 before the first optimizer step, and
// LrScheduler::step() (called once per optimizer step, skipped on an overflow step)
// increments it before the new rate is read. So the first real step runs at t = 0.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace tessera::optim {

enum class WarmupType : uint8_t { log, linear };

// The rate (and, for OneCycle, the momentum beta1) as a pure function of t.
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double lr_at(int64_t t) const = 0;
  // beta1 at t when the schedule cycles momentum; nullopt otherwise.
  virtual std::optional<double> beta1_at(int64_t t) const { return std::nullopt; }
  virtual std::string name() const = 0;
};

struct WarmupParams {
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
};

// lr = min + (max - min) * gamma(t); gamma rises over W' = max(2, warmup_num_steps) steps
// as ln(t + 1) / ln(W') (log) or t / W' (linear), then stays 1.
class WarmupLR : public LrSchedule {
 public:
  explicit WarmupLR(WarmupParams p);
  double lr_at(int64_t t) const override;
  std::string name() const override { return "WarmupLR"; }

 protected:
  WarmupParams p_;
  int64_t steps_;  // W'
};

// WarmupLR, then linear decay to 0 at total_num_steps: gamma = max(0, (T - t) / max(1, T - W')).
class WarmupDecayLR final : public WarmupLR {
 public:
  WarmupDecayLR(WarmupParams p, int64_t total_num_steps);
  double lr_at(int64_t t) const override;
  std::string name() const override { return "WarmupDecayLR"; }

 private:
  int64_t total_;
};

struct WarmupCosineParams {
  int64_t total_num_steps = 0;
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 1e-4;
  WarmupType warmup_type = WarmupType::log;
};

// Scales the optimizer's own lr: warmup ratio wmr + (1 - wmr) gamma, then cosine from 1 to
// cos_min_ratio: max(0, cmr + (1 - cmr) (1 + cos(pi (t - W' + 1) / (T - W'))) / 2).
class WarmupCosineLR final : public LrSchedule {
 public:
  WarmupCosineLR(WarmupCosineParams p, double base_lr);
  double lr_at(int64_t t) const override;
  std::string name() const override { return "WarmupCosineLR"; }

 private:
  WarmupCosineParams p_;
  double base_lr_;
  int64_t steps_;  // W'
};

struct OneCycleParams {
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;  // defaults to the first
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

// One triangular cycle of lr (min -> max -> min) and momentum (max -> min -> max) over
// first + second steps, then lr = min / (1 + decay_lr_rate * (t - total + 1) / decay_step_size)
// and beta1 = max_mom * (1 + decay_mom_rate * (same interval)).
class OneCycle final : public LrSchedule {
 public:
  explicit OneCycle(OneCycleParams p);
  double lr_at(int64_t t) const override;
  std::optional<double> beta1_at(int64_t t) const override;
  std::string name() const override { return "OneCycle"; }

 private:
  double cycle_scale(int64_t t) const;     // in [0, 1] during the cycle
  double decay_interval(int64_t t) const;  // after the cycle; 0 when decay is off
  OneCycleParams p_;
  int64_t total_;
  double ratio_;  // first / total
};

struct LRRangeTestParams {
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// lr = min * (1 + rate * interval), interval = (t + 1) / size, floored when staircase.
class LRRangeTest final : public LrSchedule {
 public:
  explicit LRRangeTest(LRRangeTestParams p);
  double lr_at(int64_t t) const override;
  std::string name() const override { return "LRRangeTest"; }

 private:
  LRRangeTestParams p_;
};

// A constant learning rate: what a config without a `scheduler` section trains with.
class ConstantLR final : public LrSchedule {
 public:
  explicit ConstantLR(double lr) : lr_(lr) {}
  double lr_at(int64_t) const override { return lr_; }
  std::string name() const override { return "ConstantLR"; }

 private:
  double lr_;
};

// A schedule and its position t (Note [Schedule time]); t is what checkpoints save.
class LrScheduler {
 public:
  explicit LrScheduler(std::shared_ptr<const LrSchedule> schedule);
  // Advances to the next optimizer step.
  void step() { ++t_; }
  double lr() const { return schedule_->lr_at(t_); }
  std::optional<double> beta1() const { return schedule_->beta1_at(t_); }
  int64_t last_batch_iteration() const { return t_; }
  void set_last_batch_iteration(int64_t t);
  const LrSchedule& schedule() const { return *schedule_; }

 private:
  std::shared_ptr<const LrSchedule> schedule_;
  int64_t t_ = -1;
};

}  // namespace tessera::optim
