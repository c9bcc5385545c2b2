// CUDA softmax and log-softmax over the last dim and their fused backward: a block per row.
//
// See Note [Row kernels] in kernels/cuda/rows.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/rows.cuh"

namespace tessera::kernels::cuda {
namespace {

using namespace rows;  // NOLINT: this file's own helpers, see rows.cuh

template <class T, bool kLog>
__global__ void softmax_kernel(const T* __restrict__ x,  // (rows, cols)
                               T* __restrict__ y,        // (rows, cols)
                               int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    MaxSum<A> mine;
    visit_row(xr, static_cast<const T*>(nullptr), cols, [&](int64_t, A v, A) { mine.add(v); });
    const MaxSum<A> all = block_max_sum(mine, scratch);
    if constexpr (kLog) {
      const A shift = all.max + log_acc(all.sum);
      map_row(xr, static_cast<const T*>(nullptr), y + r * cols, cols,
              [&](int64_t, A v, A) { return v - shift; });
    } else {
      const A inv = A(1) / all.sum;
      map_row(xr, static_cast<const T*>(nullptr), y + r * cols, cols,
              [&](int64_t, A v, A) { return exp_acc(v - all.max) * inv; });
    }
  }
}

// softmax: dx = y * (dy - sum(dy * y)); log_softmax: dx = dy - exp(y) * sum(dy).
template <class T, bool kLog>
__global__ void softmax_backward_kernel(const T* __restrict__ dy,  // (rows, cols)
                                        const T* __restrict__ y,   // (rows, cols)
                                        T* __restrict__ dx,        // (rows, cols)
                                        int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* dyr = dy + r * cols;
    const T* yr = y + r * cols;
    A mine = A(0);
    if constexpr (kLog) {
      visit_row(dyr, static_cast<const T*>(nullptr), cols, [&](int64_t, A g, A) { mine += g; });
    } else {
      visit_row(dyr, yr, cols, [&](int64_t, A g, A v) { mine += g * v; });
    }
    const A s = block_sum(mine, scratch);
    if constexpr (kLog) {
      map_row(dyr, yr, dx + r * cols, cols, [&](int64_t, A g, A v) { return g - exp_acc(v) * s; });
    } else {
      map_row(dyr, yr, dx + r * cols, cols, [&](int64_t, A g, A v) { return v * (g - s); });
    }
  }
}

template <bool kLog>
Tensor forward(const char* op, const Tensor& x_in) {  // (..., V) -> (..., V)
  const Tensor x = x_in.detach().contiguous();
  Tensor y = empty(x.shape(), {x.dtype(), x.device()});
  if (y.numel() == 0) return y;
  set_device(op, x);
  const int64_t cols = x.size(-1);
  const int64_t rows = x.numel() / cols;
  dispatch_cuda_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<T, kLog>
        <<<row_blocks(rows), row_threads<T>(cols), 0, kStream>>>(ptr<T>(x), ptr<T>(y), rows, cols);
    check_launch(op);
  });
  return y;
}

template <bool kLog>
Tensor backward(const char* op, const Tensor& dy_in, const Tensor& y_in) {  // (..., V) x2
  const Tensor dy = dy_in.detach().contiguous();
  const Tensor y = y_in.detach().contiguous();
  Tensor dx = empty(y.shape(), {y.dtype(), y.device()});
  if (dx.numel() == 0) return dx;
  set_device(op, y);
  const int64_t cols = y.size(-1);
  const int64_t rows = y.numel() / cols;
  dispatch_cuda_floating(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T, kLog><<<row_blocks(rows), row_threads<T>(cols), 0, kStream>>>(
        ptr<T>(dy), ptr<T>(y), ptr<T>(dx), rows, cols);
    check_launch(op);
  });
  return dx;
}

}  // namespace

Tensor softmax(const Tensor& x) { return forward<false>("softmax", x); }

Tensor log_softmax(const Tensor& x) { return forward<true>("log_softmax", x); }

Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  return backward<false>("softmax_backward", dy, y);
}

Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) {
  return backward<true>("log_softmax_backward", dy, y);
}

}  // namespace tessera::kernels::cuda
