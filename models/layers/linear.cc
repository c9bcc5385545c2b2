#include "models/layers/linear.h"

#include "autograd/ops/linalg.h"
#include "core/factories.h"

namespace tessera {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, DType dtype)
    : weight_(zeros({out_features, in_features}, {dtype})) {
  register_parameter("weight", weight_);
  if (bias) {
    bias_ = zeros({out_features}, {dtype});
    register_parameter("bias", bias_);
  }
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight_, bias_); }

}  // namespace tessera
