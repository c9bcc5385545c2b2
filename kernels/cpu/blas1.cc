#include "kernels/cpu/blas1.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/clip_factor.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kGrain = 1 << 16;

// Calls f(c0, c1) on consecutive chunks [c0, c1) of [b, e), each at most kHalfChunk long.
template <class F>
void for_chunks(int64_t b, int64_t e, F&& f) {
  for (int64_t i0 = b; i0 < e; i0 += kHalfChunk) f(i0, std::min(e, i0 + kHalfChunk));
}

}  // namespace

double squared_norm(const Tensor& x_in) {
  const Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  dispatch_floating_and_half(x.dtype(), "squared_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t b = c * kGrain, e = std::min(n, b + kGrain);
        if constexpr (!kIsHalf<T>) {
          partial[c] = ConstArrayMap<T>(px + b, e - b).template cast<double>().square().sum();
        } else {
          double sum = 0.0;
          for_chunks(b, e, [&](int64_t i0, int64_t i1) {
            alignas(kCpuAlignment) float v[kHalfChunk];  // Note [Aligned scratch]
            load_floats<T>(reinterpret_cast<const char*>(px + i0), sizeof(T), i1 - i0, v);
            sum += ConstArrayMap<float>(v, i1 - i0).template cast<double>().square().sum();
          });
          partial[c] = sum;
        }
      }
    });
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void add_squared_norm(const Tensor& x, const Tensor& total) {
  total.data_ptr<double>()[0] += squared_norm(x);
}

Tensor clip_factor(const Tensor& squared_norm, double loss_scale, double max_norm,
                   bool overflow_skips) {
  const ClipFactor c = clip_factor_of(squared_norm.item<double>(), loss_scale, max_norm,
                                      overflow_skips, [](double v) { return std::sqrt(v); });
  const Tensor out = empty({2}, {DType::f64, Device::cpu()});
  out.data_ptr<double>()[0] = c.factor;
  out.data_ptr<double>()[1] = c.norm;
  return out;
}

void scale_(const Tensor& x, double factor) {
  dispatch_floating_and_half(x.dtype(), "scale_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* px = x.data_ptr<T>();
    const A f = static_cast<A>(factor);
    parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      if constexpr (!kIsHalf<T>) {
        ArrayMap<T>(px + i0, i1 - i0) *= f;
      } else {  // each value rounded once from its f32 product
        for_chunks(i0, i1, [&](int64_t c0, int64_t c1) {
          alignas(kCpuAlignment) float v[kHalfChunk];
          load_floats<T>(reinterpret_cast<const char*>(px + c0), sizeof(T), c1 - c0, v);
          ArrayMap<float>(v, c1 - c0) *= f;
          store_floats<T>(v, c1 - c0, px + c0);
        });
      }
    });
  });
}

void axpy_(const Tensor& y, const Tensor& x, double alpha) {
  dispatch_floating_and_half(y.dtype(), "axpy_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* py = y.data_ptr<T>();
    const T* px = x.data_ptr<T>();
    const A a = static_cast<A>(alpha);
    parallel_for(y.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      if constexpr (!kIsHalf<T>) {
        ArrayMap<T> out(py + i0, i1 - i0);
        const ConstArrayMap<T> in(px + i0, i1 - i0);
        if (a == T(1)) {
          out += in;
        } else {
          out += a * in;
        }
      } else {  // y + a x in f32, rounded once
        for_chunks(i0, i1, [&](int64_t c0, int64_t c1) {
          alignas(kCpuAlignment) float vy[kHalfChunk];
          alignas(kCpuAlignment) float vx[kHalfChunk];
          load_floats<T>(reinterpret_cast<const char*>(py + c0), sizeof(T), c1 - c0, vy);
          load_floats<T>(reinterpret_cast<const char*>(px + c0), sizeof(T), c1 - c0, vx);
          ArrayMap<float>(vy, c1 - c0) += a * ConstArrayMap<float>(vx, c1 - c0);
          store_floats<T>(vy, c1 - c0, py + c0);
        });
      }
    });
  });
}

}  // namespace tessera::kernels::cpu
