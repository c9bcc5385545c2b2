// Fused LAMB step with DeepSpeed FusedLamb semantics (You et al., arXiv:1904.00962).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

struct LambParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;  // 1-based step count after this update
  bool bias_correction = true;
  bool eps_inside_sqrt = false;  // sqrt(v_hat + eps) instead of sqrt(v_hat) + eps
  double max_coeff = 10.0;       // the trust ratio is clamped to [min_coeff, max_coeff]
  double min_coeff = 0.01;
};

// In place: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = m_hat / (sqrt(v_hat) + eps) + wd p;
// c = clamp(|p| / |u|, min_coeff, max_coeff) (1 when either norm is 0); p -= lr c u.
// Returns c. All four tensors contiguous with one shape and floating dtype.
double lamb_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const LambParams& p);

}  // namespace tessera::kernels
