// CPU softmax and log-softmax over the last dim (see kernels/softmax.h).
#pragma once

#include "core/tensor.h"

namespace tessera::kernels::cpu {

Tensor softmax(const Tensor& x);                                 // (..., V) -> (..., V)
Tensor log_softmax(const Tensor& x);                             // (..., V) -> (..., V)
Tensor softmax_backward(const Tensor& dy, const Tensor& y);      // (..., V) x2 -> (..., V)
Tensor log_softmax_backward(const Tensor& dy, const Tensor& y);  // (..., V) x2 -> (..., V)

}  // namespace tessera::kernels::cpu
