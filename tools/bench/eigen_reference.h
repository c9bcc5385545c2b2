// Raw Eigen GEMM, the reference the framework's matmul is measured against. It lives in
// the benchmark (not kernels/) so that the reference stays independent of our kernel.
#pragma once

#include <cstdint>

namespace tessera::bench {

// c (M, N) = a (M, K) @ b (N, K)^T, row-major f32, through Eigen with no framework code.
void eigen_gemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k);

}  // namespace tessera::bench
