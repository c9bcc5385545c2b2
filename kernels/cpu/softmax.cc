#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// Rows per parallel_for chunk, so that each chunk touches at least ~32K elements.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1)); }

// Calls fn(a_row, b_row, out_row) on every last-dim row, rows split across threads, and
// returns the new contiguous output. a and b are (..., V) of one dtype; an undefined b
// passes a's row in its place.
template <class Fn>
Tensor map_rows(const char* op, const Tensor& a_in, const Tensor& b_in, Fn&& fn) {
  const Tensor a = a_in.detach().contiguous();
  const Tensor b = b_in.defined() ? b_in.detach().contiguous() : Tensor();
  Tensor out = empty(a.shape(), {a.dtype(), a.device()});
  if (out.numel() == 0) return out;
  const int64_t cols = a.size(-1);
  const int64_t rows = a.numel() / cols;
  dispatch_floating(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    const T* pb = b.defined() ? b.data_ptr<T>() : nullptr;
    T* po = out.data_ptr<T>();
    parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t at = r * cols;
        fn(ConstArrayMap<T>(pa + at, cols), ConstArrayMap<T>(pb == nullptr ? pa : pb + at, cols),
           ArrayMap<T>(po + at, cols));
      }
    });
  });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x) {
  if (is_half(x.dtype())) return narrowed(cpu::softmax(widened(x)), x.dtype());
  return map_rows("softmax", x, Tensor(), [](auto xr, auto, auto yr) {
    using T = typename decltype(yr)::Scalar;
    const T max = xr.maxCoeff();
    // exp and sum block by block, so the sum reads values still in L1.
    constexpr int64_t kBlock = 1024;
    T sum = 0;
    for (int64_t j = 0; j < xr.size(); j += kBlock) {
      const int64_t len = std::min<int64_t>(kBlock, xr.size() - j);
      auto yb = yr.segment(j, len);
      yb = (xr.segment(j, len) - max).exp();
      sum += yb.sum();
    }
    yr *= 1 / sum;
  });
}

Tensor log_softmax(const Tensor& x) {
  if (is_half(x.dtype())) return narrowed(cpu::log_softmax(widened(x)), x.dtype());
  return map_rows("log_softmax", x, Tensor(), [](auto xr, auto, auto yr) {
    const auto max = xr.maxCoeff();
    yr = (xr - max).exp();
    yr = xr - (max + std::log(yr.sum()));
  });
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  if (is_half(y.dtype())) {
    return narrowed(cpu::softmax_backward(widened(dy), widened(y)), y.dtype());
  }
  return map_rows("softmax_backward", dy, y,
                  [](auto dyr, auto yr, auto dxr) { dxr = yr * (dyr - (dyr * yr).sum()); });
}

Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) {
  if (is_half(y.dtype())) {
    return narrowed(cpu::log_softmax_backward(widened(dy), widened(y)), y.dtype());
  }
  return map_rows("log_softmax_backward", dy, y,
                  [](auto dyr, auto yr, auto dxr) { dxr = dyr - yr.exp() * dyr.sum(); });
}

}  // namespace tessera::kernels::cpu
