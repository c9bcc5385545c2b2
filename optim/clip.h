// Gradient clipping by global L2 norm (DeepSpeed's gradient_clipping).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessera::optim {

// The L2 norm over the gradients of all `params` (those without a grad count as zero),
// accumulated in f64. When max_norm > 0 and coef = max_norm / (norm + 1e-6) < 1, scales every
// gradient by coef, as DeepSpeed's clip_grad_norm_. Returns the norm before clipping (inf or nan
// when a gradient is not finite; then nothing is scaled).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

}  // namespace tessera::optim
