#include "optim/clip.h"

#include <cmath>

#include "kernels/blas1.h"

namespace tessera::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  double sq = 0.0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (g.defined()) sq += kernels::squared_norm(g);
  }
  const double norm = std::sqrt(sq);
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0.0 && std::isfinite(norm) && coef < 1.0) {
    for (const Tensor& p : params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      TS_CHECK(g.is_contiguous(), "[clip_grad_norm] expected contiguous gradients");
      kernels::scale_(g, coef);
    }
  }
  return norm;
}

}  // namespace tessera::optim
