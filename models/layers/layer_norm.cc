#include "models/layers/layer_norm.h"

#include "autograd/ops/nn.h"
#include "core/factories.h"

namespace tessera {

LayerNorm::LayerNorm(int64_t dim, double eps, bool bias, DType dtype)
    : eps_(eps), weight_(ones({dim}, {dtype})) {
  register_parameter("weight", weight_);
  if (bias) {
    bias_ = zeros({dim}, {dtype});
    register_parameter("bias", bias_);
  }
}

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight_, bias_, eps_); }

std::pair<Tensor, Tensor> LayerNorm::add_forward(const Tensor& x, const Tensor& delta) const {
  const ModuleCall call(*this);
  auto [h, y] = add_layer_norm(x, delta, weight_, bias_, eps_);
  return {h, call.output(y)};
}

}  // namespace tessera
