#include "kernels/cpu/sgd.h"

#include <algorithm>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kBlock = 1024;
constexpr int64_t kGrain = 1 << 16;

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdParams& p) {
  if (is_half(param.dtype())) {
    update_widened(param, [&](const Tensor& w) {
      if (p.momentum == 0.0) return cpu::sgd_step(w, widened(grad), momentum_buffer, p);
      update_widened(momentum_buffer,
                     [&](const Tensor& buf) { cpu::sgd_step(w, widened(grad), buf, p); });
    });
    return;
  }
  const int64_t n = param.numel();
  dispatch_floating(param.dtype(), "sgd_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pp = param.data_ptr<T>();
    const T* pg = grad.data_ptr<T>();
    T* pb = p.momentum != 0.0 ? momentum_buffer.data_ptr<T>() : nullptr;
    const T lr = static_cast<T>(p.lr);
    const T mu = static_cast<T>(p.momentum);
    const T keep = static_cast<T>(1 - p.dampening);
    const T wd = static_cast<T>(p.weight_decay);
    parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t b = i0; b < i1; b += kBlock) {
        const int64_t len = std::min(kBlock, i1 - b);
        ArrayMap<T> w(pp + b, len);
        const ArrayX<T> g = ConstArrayMap<T>(pg + b, len) + wd * w;
        if (pb == nullptr) {
          w -= lr * g;
          continue;
        }
        ArrayMap<T> buf(pb + b, len);
        buf = p.first_step ? g : ArrayX<T>(mu * buf + keep * g);
        w -= p.nesterov ? ArrayX<T>(lr * (g + mu * buf)) : ArrayX<T>(lr * buf);
      }
    });
  });
}

}  // namespace tessera::kernels::cpu
