// CPU fused LAMB step (see kernels/lamb.h).
#pragma once

#include "kernels/lamb.h"

namespace tessera::kernels::cpu {

double lamb_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const LambParams& p);

}  // namespace tessera::kernels::cpu
