// CPU layer normalization over the last dim (see kernels/layer_norm.h).
#pragma once

#include "kernels/layer_norm.h"

namespace tessera::kernels::cpu {

// x: (..., C); weight, bias: (C) or undefined.
LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// dy, x: (..., C); weight: (C) or undefined; mean, rstd: (...).
LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd);

}  // namespace tessera::kernels::cpu
