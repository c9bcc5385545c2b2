#include "parallel/compression/onebit_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::parallel {

const char* onebit_step_name(OneBitStep kind) {
  switch (kind) {
    case OneBitStep::init:
      return "init";
    case OneBitStep::full_precision:
      return "full_precision";
    case OneBitStep::compressed:
      return "compressed";
    case OneBitStep::onebit_gradient:
      return "onebit_gradient";
    case OneBitStep::local:
      return "local";
    case OneBitStep::local_sync:
      return "local_sync";
  }
  return "?";
}

OneBitStep onebit_adam_step(int64_t step, int64_t freeze_step) {
  TS_CHECK(step >= 1, "[onebit] expected a step count from 1, found ", step);
  if (step == 1) return OneBitStep::init;
  return step <= freeze_step ? OneBitStep::full_precision : OneBitStep::compressed;
}

ZeroOneAdamSchedule::ZeroOneAdamSchedule(int64_t var_freeze_step, int64_t var_update_scaler,
                                         int64_t local_step_scaler, int64_t local_step_clipper)
    : var_freeze_step_(var_freeze_step),
      var_update_scaler_(var_update_scaler),
      local_step_scaler_(local_step_scaler),
      local_step_clipper_(local_step_clipper) {
  TS_CHECK(var_update_scaler >= 1 && local_step_scaler >= 1 && local_step_clipper >= 1,
           "[onebit] expected var_update_scaler, local_step_scaler and local_step_clipper >= 1, "
           "found ",
           var_update_scaler, ", ", local_step_scaler, ", ", local_step_clipper);
}

bool ZeroOneAdamSchedule::next_is_full_precision() const {
  return step_ >= 1 && !frozen_ && (step_ + 1) % var_interval_ == 0;
}

OneBitStep ZeroOneAdamSchedule::next() {
  const int64_t t = ++step_;
  if (t == 1) return OneBitStep::init;
  OneBitStep kind;
  if (!frozen_) {
    if (t % var_interval_ == 0) {
      kind = OneBitStep::full_precision;
      if (++var_counter_ == var_update_scaler_) var_counter_ = 0, var_interval_ *= 2;
    } else {
      kind = OneBitStep::onebit_gradient;
    }
    frozen_ = t > var_freeze_step_;  // the variance freezes after the first step past it
    return kind;
  }
  kind = t % local_interval_ == 0 ? OneBitStep::local_sync : OneBitStep::local;
  if (++local_counter_ == local_step_scaler_) {
    local_counter_ = 0;
    local_interval_ = std::min(local_step_clipper_, 2 * local_interval_);
  }
  return kind;
}

}  // namespace tessera::parallel
