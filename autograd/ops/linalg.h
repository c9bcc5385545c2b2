// Differentiable matrix products.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace tessera {

// Starts a reduction of a freshly computed input gradient in place (Megatron's async
// tensor-model-parallel all-reduce: see linear()). Whoever starts it also arranges the
// wait for it before the gradient is read (Note [Deferred gradient waits] in
// autograd/gradient_wait.h).
using StartGradReduction = std::function<void(const Tensor& grad)>;

// a: (..., M, K); b: (K, N) shared by every batch, or (..., K, N) -> (..., M, N).
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + bias, PyTorch nn.Linear layout; bias may be undefined. With
// `reduce_input_grad`, backward computes x's gradient first, starts its reduction with it,
// and computes the weight's and bias's gradients while it travels (Megatron-LM's
// LinearWithGradAccumulationAndAsyncCommunication: a column-parallel layer's input gradient
// is summed over the model group under its weight gradient's product); x's gradient is
// handed on with its reduction in flight, for the wait the starter arranged.
Tensor linear(
    const Tensor& x, const Tensor& weight, const Tensor& bias,
    const StartGradReduction& reduce_input_grad = {});  // (..., in), (out, in), (out) -> (..., out)

}  // namespace tessera
