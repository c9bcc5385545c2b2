#include "optim/clip.h"

#include <cmath>

#include "kernels/blas1.h"
#include "kernels/clip_factor.h"

namespace tessera::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  double sq = 0.0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (g.defined()) sq += kernels::squared_norm(g);
  }
  // Note [Clip factor] with no loss scale: 1 unless the norm is clipped.
  const kernels::ClipFactor clip = kernels::clip_factor_of(
      sq, 1.0, max_norm, /*overflow_skips=*/false, [](double x) { return std::sqrt(x); });
  if (clip.factor != 1.0) {
    for (const Tensor& p : params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      TS_CHECK(g.is_contiguous(), "[clip_grad_norm] expected contiguous gradients");
      kernels::scale_(g, clip.factor);
    }
  }
  return clip.norm;
}

}  // namespace tessera::optim
