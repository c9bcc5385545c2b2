// Differentiable matrix products.
#pragma once

#include "core/tensor.h"

namespace tessera {

// a: (..., M, K); b: (K, N) shared by every batch, or (..., K, N) -> (..., M, N).
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + bias, PyTorch nn.Linear layout; bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight,
              const Tensor& bias);  // (..., in), (out, in), (out) -> (..., out)

}  // namespace tessera
