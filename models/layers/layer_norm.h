// Layer normalization over the last dim with optional affine "weight" and "bias".
#pragma once

#include <utility>

#include "autograd/module.h"

namespace tessera {

class LayerNorm : public Layer {
 public:
  // weight = 1 and bias = 0 as in PyTorch; `bias` false keeps only the weight.
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true, DType dtype = DType::f32);

  Tensor& weight() { return weight_; }
  Tensor& bias() { return bias_; }

  // {h = x + delta, this norm of h} as one op (autograd's add_layer_norm; Note [Residual
  // layer norm] in kernels/cuda/layer_norm.cu), in a call of this module.
  // (..., dim) x2 -> (..., dim) x2
  std::pair<Tensor, Tensor> add_forward(const Tensor& x, const Tensor& delta) const;

 protected:
  Tensor forward(const Tensor& x) const override;  // (..., dim) -> (..., dim)

 private:
  double eps_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace tessera
