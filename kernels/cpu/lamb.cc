#include "kernels/cpu/lamb.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// Note [LAMB in two passes]
// The trust ratio needs |u| before any parameter moves, and u depends on p (weight decay).
// Pass 1 updates the moments and sums |p|^2 and |u|^2 in f64 per thread chunk; pass 2
// recomputes u from the new moments and the untouched p, so no scratch tensor is needed.
constexpr int64_t kBlock = 1024;
constexpr int64_t kGrain = 1 << 16;

}  // namespace

double lamb_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const LambParams& p) {
  if (is_half(param.dtype())) {
    double ratio = 0.0;
    update_widened(param, [&](const Tensor& w) {
      update_widened(exp_avg, [&](const Tensor& m) {
        update_widened(exp_avg_sq,
                       [&](const Tensor& v) { ratio = cpu::lamb_step(w, widened(grad), m, v, p); });
      });
    });
    return ratio;
  }
  const int64_t n = param.numel();
  const double bc1 = p.bias_correction ? 1 - std::pow(p.beta1, static_cast<double>(p.step)) : 1;
  const double bc2 = p.bias_correction ? 1 - std::pow(p.beta2, static_cast<double>(p.step)) : 1;
  double coeff = 1.0;
  dispatch_floating(param.dtype(), "lamb_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pp = param.data_ptr<T>();
    const T* pg = grad.data_ptr<T>();
    T* pm = exp_avg.data_ptr<T>();
    T* pv = exp_avg_sq.data_ptr<T>();
    const T beta1 = static_cast<T>(p.beta1);
    const T beta2 = static_cast<T>(p.beta2);
    const T eps = static_cast<T>(p.eps);
    const T wd = static_cast<T>(p.weight_decay);
    const T inv_bc1 = static_cast<T>(1 / bc1);
    const T inv_bc2 = static_cast<T>(1 / bc2);
    const bool inside = p.eps_inside_sqrt;
    // u for one block from the (already updated) moments and p.
    auto update = [&](const ArrayMap<T>& m, const ArrayMap<T>& v, const ArrayMap<T>& w) {
      const ArrayX<T> denom =
          inside ? ArrayX<T>(((v * inv_bc2) + eps).sqrt()) : ArrayX<T>((v * inv_bc2).sqrt() + eps);
      return ArrayX<T>((m * inv_bc1) / denom + wd * w);
    };
    const int64_t chunks = (n + kGrain - 1) / kGrain;
    std::vector<double> p_sq(static_cast<size_t>(chunks)), u_sq(static_cast<size_t>(chunks));
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double ps = 0, us = 0;
        for (int64_t b = c * kGrain; b < std::min(n, (c + 1) * kGrain); b += kBlock) {
          const int64_t len = std::min(kBlock, n - b);
          ArrayMap<T> w(pp + b, len);
          ArrayMap<T> m(pm + b, len);
          ArrayMap<T> v(pv + b, len);
          const ConstArrayMap<T> g(pg + b, len);
          m = beta1 * m + (1 - beta1) * g;
          v = beta2 * v + (1 - beta2) * g.square();
          ps += static_cast<double>(w.square().sum());
          us += static_cast<double>(update(m, v, w).square().sum());
        }
        p_sq[c] = ps;
        u_sq[c] = us;
      }
    });
    double p_norm = 0, u_norm = 0;
    for (int64_t c = 0; c < chunks; ++c) p_norm += p_sq[c], u_norm += u_sq[c];
    p_norm = std::sqrt(p_norm);
    u_norm = std::sqrt(u_norm);
    if (p_norm > 0 && u_norm > 0) coeff = std::clamp(p_norm / u_norm, p.min_coeff, p.max_coeff);
    const T step = static_cast<T>(p.lr * coeff);
    parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t b = i0; b < i1; b += kBlock) {
        const int64_t len = std::min(kBlock, i1 - b);
        ArrayMap<T> w(pp + b, len);
        ArrayMap<T> m(pm + b, len);
        ArrayMap<T> v(pv + b, len);
        w -= step * update(m, v, w);
      }
    });
  });
  return coeff;
}

}  // namespace tessera::kernels::cpu
