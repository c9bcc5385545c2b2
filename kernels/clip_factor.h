// The unscale-and-clip factor of a gradient step, for the host and the device alike.
//
// Note [Clip factor]
// DeepSpeed's unscale_and_clip_grads (deepspeed/runtime/fp16/fused_optimizer.py) multiplies
// the loss-scaled gradients once by (1 / loss_scale) * min(1, max_norm / (norm + 1e-6)),
// where norm is the unscaled global L2 norm; clipping is off for max_norm <= 0 and when the
// norm is not finite. With a loss scaler (f16) a norm that is not finite is an overflow:
// the step is skipped, which the factor says by being NaN. kernels::clip_factor computes it
// where the squared norm lies (on a GPU without a host read); the CPU and CUDA backends run
// this one definition, in f64, so both give the same bits.
#pragma once

#include "core/host_device.h"

namespace tessera::kernels {

struct ClipFactor {
  double factor;  // the gradients' multiplier; NaN: skip the step (an f16 overflow)
  double norm;    // the unscaled global norm, sqrt(squared_norm) / loss_scale
};

// `sqrt` is the platform's correctly rounded f64 square root (IEEE 754), passed in so that
// this header needs neither <cmath> on the device nor CUDA's math on the host.
template <class Sqrt>
TESSERA_HOST_DEVICE ClipFactor clip_factor_of(double squared_norm, double loss_scale,
                                              double max_norm, bool overflow_skips,
                                              const Sqrt& sqrt) {
  const double norm = sqrt(squared_norm) / loss_scale;
  const double zero_if_finite = norm - norm;  // NaN for inf and NaN
  const bool finite = zero_if_finite == 0.0;
  if (overflow_skips && !finite) return {zero_if_finite, norm};
  double factor = 1.0 / loss_scale;
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0.0 && finite && coef < 1.0) factor *= coef;
  return {factor, norm};
}

}  // namespace tessera::kernels
