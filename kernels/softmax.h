// Softmax and log-softmax over the last dim, with their fused backward.
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

Tensor softmax(const Tensor& x);      // (..., V) -> (..., V)
Tensor log_softmax(const Tensor& x);  // (..., V) -> (..., V)
// dx = y * (dy - sum(dy * y)), from the softmax output y.
Tensor softmax_backward(const Tensor& dy, const Tensor& y);  // (..., V), (..., V) -> (..., V)
// dx = dy - exp(y) * sum(dy), from the log-softmax output y.
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y);  // (..., V), (..., V) -> (..., V)

}  // namespace tessera::kernels
