#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tessera::optim {

nlohmann::json LossScalerState::to_json() const {
  return {{"scale", scale},
          {"iteration", iteration},
          {"last_overflow_iteration", last_overflow_iteration},
          {"hysteresis_left", hysteresis_left}};
}

LossScalerState LossScalerState::from_json(const nlohmann::json& j, const std::string& what) {
  JsonObjectReader r(j, what);
  LossScalerState s;
  s.scale = r.required_in_range<double>("scale", 0.0, 1e300);
  TS_CHECK(s.scale > 0.0, "[", what, "] expected a positive loss scale, found ", s.scale);
  s.iteration = r.required_in_range<int64_t>("iteration", 0, std::numeric_limits<int64_t>::max());
  s.last_overflow_iteration = r.required_in_range<int64_t>("last_overflow_iteration", -1,
                                                           std::numeric_limits<int64_t>::max());
  s.hysteresis_left =
      r.required_in_range<int64_t>("hysteresis_left", 0, std::numeric_limits<int64_t>::max());
  r.finish();
  return s;
}

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  TS_CHECK(config_.static_scale >= 0.0, "[loss_scaler] expected loss_scale >= 0, found ",
           config_.static_scale);
  TS_CHECK(config_.window >= 1 && config_.hysteresis >= 1 && config_.min_scale > 0.0,
           "[loss_scaler] expected loss_scale_window >= 1, hysteresis >= 1 and min_loss_scale > "
           "0, found ",
           config_.window, ", ", config_.hysteresis, ", ", config_.min_scale);
  state_.scale = dynamic() ? std::ldexp(1.0, static_cast<int>(config_.initial_scale_power))
                           : config_.static_scale;
  state_.hysteresis_left = config_.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic()) {
    ++state_.iteration;
    return;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || state_.hysteresis_left == 1) {
      TS_CHECK(!(state_.scale == config_.min_scale && config_.raise_at_min_scale),
               "[loss_scaler] Current loss scale already at minimum - cannot decrease scale "
               "anymore. Exiting run. (scale ",
               state_.scale, " = min_loss_scale; expected finite gradients)");
      state_.scale = std::max(state_.scale / 2.0, config_.min_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow_iteration = state_.iteration;
  } else {
    if (config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
    if ((state_.iteration - state_.last_overflow_iteration) % config_.window == 0) {
      if (!config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
      state_.scale *= 2.0;
    }
  }
  ++state_.iteration;
}

}  // namespace tessera::optim
