// Fused layer normalization over the last dim.
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

struct LayerNormOutput {
  Tensor y;     // (..., C)
  Tensor mean;  // (...)   saved for backward; f32 for f16/bf16 x (stat_dtype)
  Tensor rstd;  // (...)   1 / sqrt(var + eps), biased variance; as mean
};

// y = (x - mean) * rstd * weight + bias; weight and bias are (C) or undefined (no affine).
LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);

struct LayerNormGrads {
  Tensor dx;       // (..., C)
  Tensor dweight;  // (C), undefined when weight is
  Tensor dbias;    // (C), undefined when weight is
};

LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd);

}  // namespace tessera::kernels
