#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"

namespace tessera::kernels::cpu {
namespace {

// Note [AdamW in cache-sized blocks]
// Each Eigen statement below is one fused loop; running them over blocks that fit in L1
// keeps the seven streams (read p, g, m, v; write p, m, v) at one pass over memory.
constexpr int64_t kBlock = 1024;
constexpr int64_t kGrain = 1 << 16;  // elements per thread, at least

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p) {
  const int64_t n = param.numel();
  const double bc1 = p.bias_correction ? 1 - std::pow(p.beta1, static_cast<double>(p.step)) : 1;
  const double bc2 = p.bias_correction ? 1 - std::pow(p.beta2, static_cast<double>(p.step)) : 1;
  dispatch_floating(param.dtype(), "adamw_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pp = param.data_ptr<T>();
    const T* pg = grad.data_ptr<T>();
    T* pm = exp_avg.data_ptr<T>();
    T* pv = exp_avg_sq.data_ptr<T>();
    const T lr = static_cast<T>(p.lr);
    const T beta1 = static_cast<T>(p.beta1);
    const T beta2 = static_cast<T>(p.beta2);
    const T eps = static_cast<T>(p.eps);
    const T wd = static_cast<T>(p.weight_decay);
    const T inv_bc1 = static_cast<T>(1 / bc1);
    const T inv_bc2 = static_cast<T>(1 / bc2);
    const bool l2 = !p.adam_w_mode;
    parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t b = i0; b < i1; b += kBlock) {
        const int64_t len = std::min(kBlock, i1 - b);
        ArrayMap<T> w(pp + b, len);
        ArrayMap<T> m(pm + b, len);
        ArrayMap<T> v(pv + b, len);
        const ConstArrayMap<T> g(pg + b, len);
        if (l2) {
          // L2 mode folds the decay into the gradient.
          const auto g_l2 = g + wd * w;
          m = beta1 * m + (1 - beta1) * g_l2;
          v = beta2 * v + (1 - beta2) * g_l2.square();
          w -= lr * ((m * inv_bc1) / ((v * inv_bc2).sqrt() + eps));
        } else {
          // AdamW mode decays the parameter in the update, decoupled from the moments.
          m = beta1 * m + (1 - beta1) * g;
          v = beta2 * v + (1 - beta2) * g.square();
          w -= lr * ((m * inv_bc1) / ((v * inv_bc2).sqrt() + eps) + wd * w);
        }
      }
    });
  });
}

}  // namespace tessera::kernels::cpu
