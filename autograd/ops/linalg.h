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

// A dense -> GELU -> dense block as one op (NVIDIA Apex's FusedDenseGeluDense):
// linear(gelu(linear(x, w1, b1)), w2, b2), GELU being the tanh approximation. On CUDA with
// 16-bit operands GELU runs in the first product's epilogue and its derivative in the
// backward's product with w2 (kernels::linear_gelu, kernels::gelu_input_grads; Note [GELU
// epilogues] in kernels/cuda/matmul.cu). On the CPU the three ops' kernels run, giving their
// bits; on CUDA the values agree within rounding (the bias gradients may come from other
// epilogues). x's gradient goes to `reduce_input_grad` as linear()'s does, before the
// weights' gradients are computed.
//   x (..., in), w1 (hidden, in), b1 (hidden) or undefined, w2 (out, hidden),
//   b2 (out) or undefined -> (..., out)
Tensor dense_gelu_dense(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                        const Tensor& b2, const StartGradReduction& reduce_input_grad = {});

}  // namespace tessera
