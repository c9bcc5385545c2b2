// Linear layer, PyTorch nn.Linear layout: y = x W^T + b.
#pragma once

#include "autograd/module.h"

namespace tessera {

class Linear : public Layer {
 public:
  // Parameters "weight" (out, in) and, when `bias`, "bias" (out), zero-initialized:
  // models initialize by parameter name (see the model's init).
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::f32);

  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }
  Tensor& bias() { return bias_; }

 protected:
  Tensor forward(const Tensor& x) const override;  // (..., in) -> (..., out)

 private:
  Tensor weight_;
  Tensor bias_;
};

}  // namespace tessera
