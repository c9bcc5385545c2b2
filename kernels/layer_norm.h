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

// A residual add and the layer normalization of its result (a pre-LayerNorm block's
// h = x + delta, then LN(h)), with the gradients of both (Note [Residual layer norm] in
// kernels/cuda/layer_norm.cu). On CUDA one kernel reads x and delta and writes h and the
// norm, and the backward adds dh, the gradient h gets besides through the norm, into the
// norm's dx in the same pass; elsewhere the add and layer_norm run one after the other.
struct AddLayerNormOutput {
  Tensor h;              // (..., C): x + delta in x's dtype
  LayerNormOutput norm;  // layer_norm(h, weight, bias, eps)
};
AddLayerNormOutput add_layer_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                  const Tensor& bias, double eps);
// layer_norm_backward(dy, h, ...) with dh added to dx: the gradient of x and of delta.
LayerNormGrads add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                                       const Tensor& weight, const Tensor& mean,
                                       const Tensor& rstd);

}  // namespace tessera::kernels
