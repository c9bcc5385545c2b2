#include "kernels/cpu/blas1.h"

#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kGrain = 1 << 16;

void scale_in_place(const Tensor& x, double factor) {
  dispatch_floating(x.dtype(), "scale_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* px = x.data_ptr<T>();
    const T f = static_cast<T>(factor);
    parallel_for(x.numel(), kGrain,
                 [&](int64_t i0, int64_t i1) { ArrayMap<T>(px + i0, i1 - i0) *= f; });
  });
}

void axpy_in_place(const Tensor& y, const Tensor& x, double alpha) {
  dispatch_floating(y.dtype(), "axpy_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* py = y.data_ptr<T>();
    const T* px = x.data_ptr<T>();
    const T a = static_cast<T>(alpha);
    parallel_for(y.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      ArrayMap<T> out(py + i0, i1 - i0);
      const ConstArrayMap<T> in(px + i0, i1 - i0);
      if (a == T(1)) {
        out += in;
      } else {
        out += a * in;
      }
    });
  });
}

}  // namespace

double squared_norm(const Tensor& x_in) {
  const Tensor x = widened(x_in).contiguous();
  const int64_t n = x.numel();
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  dispatch_floating(x.dtype(), "squared_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t b = c * kGrain;
        const ConstArrayMap<T> a(px + b, std::min(kGrain, n - b));
        partial[c] = a.template cast<double>().square().sum();
      }
    });
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void scale_(const Tensor& x_in, double factor) {
  update_widened(x_in, [&](const Tensor& x) { scale_in_place(x, factor); });
}

void axpy_(const Tensor& y_in, const Tensor& x_in, double alpha) {
  update_widened(y_in, [&](const Tensor& y) { axpy_in_place(y, widened(x_in), alpha); });
}

}  // namespace tessera::kernels::cpu
