// CPU matrix multiplication: the packed SGEMM for f32 (kernels/cpu/sgemm.h), Eigen otherwise.
#pragma once

#include "core/tensor.h"

namespace tessera::kernels::cpu {

// a: (..., M, K) or (..., K, M); b: (K, N) / (N, K) or batched like a -> (..., M, N), plus
// bias (N) on every row when it is defined (of a's dtype; linear's bias, added by the GEMM).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
              const Tensor& bias = Tensor());

}  // namespace tessera::kernels::cpu
