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

}  // namespace tessera::kernels
