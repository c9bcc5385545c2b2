// Loss scaling for fp16 training: DeepSpeed's DynamicLossScaler and static scale.
//
// Note [Dynamic loss scaling]
// fp16 gradients underflow unless the loss is multiplied by a large scale before backward.
// After each backward the caller checks the (scaled) gradients for inf/nan and calls
// update(overflow):
//   overflow:    the step is skipped. With hysteresis left (cur_hysteresis > 1 and
//                hysteresis > 1) one unit of it is spent and the scale kept; otherwise the
//                scale halves, not below min_scale. At min_scale with raise_at_min_scale the
//                update throws DeepSpeed's "Current loss scale already at minimum" error.
//   no overflow: with consecutive_hysteresis the hysteresis refills; every `window`
//                iterations since the last overflow the scale doubles (and, without
//                consecutive_hysteresis, the hysteresis refills).
// The iteration counter advances on every update, as deepspeed/runtime/fp16/loss_scaler.py.
// A static scale (loss_scale > 0 in the config) never changes; overflowed steps are still
// skipped.
#pragma once

#include <cstdint>

#include "core/json.h"

namespace tessera::optim {

struct LossScalerConfig {
  double static_scale = 0.0;  // > 0: this fixed scale; 0: dynamic (DeepSpeed's loss_scale)
  int64_t initial_scale_power = 16;
  int64_t window = 1000;  // loss_scale_window
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;  // min_loss_scale
  bool raise_at_min_scale = true;
};

// Everything needed to resume the scaler exactly.
struct LossScalerState {
  double scale = 1.0;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int64_t hysteresis_left = 0;

  nlohmann::json to_json() const;
  // Strict: every key present with a valid value, or an error naming `what`.
  static LossScalerState from_json(const nlohmann::json& j, const std::string& what);
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config);

  double scale() const { return state_.scale; }
  bool dynamic() const { return config_.static_scale == 0.0; }
  // Applies Note [Dynamic loss scaling] for one step's overflow check.
  void update(bool overflow);

  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace tessera::optim
