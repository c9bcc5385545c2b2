#include "tools/bench/eigen_reference.h"

#include <Eigen/Core>

namespace tessera::bench {

void eigen_gemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const Mat> ma(a, m, k);
  Eigen::Map<const Mat> mb(b, n, k);
  Eigen::Map<Mat> mc(c, m, n);
  mc.noalias() = ma * mb.transpose();
}

}  // namespace tessera::bench
