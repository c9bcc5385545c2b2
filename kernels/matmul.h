// Matrix multiplication through Eigen's GEMM (CPU) or cuBLAS (CUDA).
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

// out = op(a) @ op(b), op = transpose of the last two dims when the flag is set.
//   a: (..., M, K), or (..., K, M) with trans_a
//   b: (K, N), or (N, K) with trans_b; or batched (..., K, N) / (..., N, K) with the same
//      leading dims as a
//   out: (..., M, N)
// A 2-D b is shared by every batch of a (one large GEMM when a is contiguous).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// The forward of a linear layer: out = x @ weight^T + bias.
//   x: (..., M, K) with at least 2 dims; weight: (N, K); bias: (N), or undefined for none
//   out: (..., M, N)
// On CUDA the bias is added in the GEMM's epilogue (cuBLASLt), with no second pass over
// out; on the CPU it is added after the GEMM.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// The weight and bias gradients of a linear layer from its output gradient g and input x.
//   g: (R, N); x: (R, K) -> dweight (N, K) = g^T x; dbias (N) = g summed over its R rows
// On CUDA with 16-bit operands the sums come from the GEMM's epilogue (cuBLASLt's BGRADB)
// where cuBLASLt offers it; otherwise a matmul and a sum.
struct LinearParamGrads {
  Tensor dweight;  // (N, K)
  Tensor dbias;    // (N)
};
LinearParamGrads linear_param_grads(const Tensor& g, const Tensor& x);

// linear_param_grads with the weight gradient added into `dweight` (N, K; contiguous, g's
// dtype and device): dweight += g^T x, one GEMM with beta = 1 on CUDA (a weight gradient
// accumulated into its buffer: Note [Gradients accumulated into leaves] in
// autograd/grad_slot.h; 16-bit sums rounded once), a matmul and an add on the CPU. Returns
// dbias (N) when `with_bias`, as linear_param_grads gives it; undefined otherwise.
Tensor add_linear_param_grads(const Tensor& g, const Tensor& x, const Tensor& dweight,
                              bool with_bias);

// A linear layer followed by GELU (the tanh approximation of kernels::unary), with the
// pre-activation that GELU's backward reads (Note [GELU epilogues] in
// kernels/cuda/matmul.cu).
//   x: (R, K); weight: (N, K); bias: (N) or undefined -> y = gelu(pre), pre = x weight^T + bias,
//   both (R, N)
// On CUDA with 16-bit operands one cuBLASLt call writes both (the GELU_AUX_BIAS epilogue)
// where cuBLASLt offers it; otherwise linear() then unary(gelu).
struct LinearGelu {
  Tensor y;    // (R, N)
  Tensor pre;  // (R, N)
};
LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);

// The gradient of the pre-activation of a GELU whose output fed a linear layer of `weight`,
// from that layer's output gradient g, and its sums over the rows (the gradient of the
// bias that pre includes).
//   g: (R, N); weight: (N, K); pre: (R, K) -> dpre = (g weight) * gelu'(pre) (R, K), dbias (K)
// On CUDA with 16-bit operands one cuBLASLt call (the DGELU_BGRAD epilogue) where cuBLASLt
// offers it; otherwise matmul(), unary_backward(gelu) and a sum.
struct GeluInputGrads {
  Tensor dpre;   // (R, K)
  Tensor dbias;  // (K)
};
GeluInputGrads gelu_input_grads(const Tensor& g, const Tensor& weight, const Tensor& pre);

}  // namespace tessera::kernels
