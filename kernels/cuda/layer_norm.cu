// CUDA layer normalization over the last dim, forward (a block per row), with or without a
// residual add before it; the backward is in layer_norm_backward.cu.
//
// See Note [Row kernels] in kernels/cuda/rows.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/factories.h"
#include "kernels/checks.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/rows.cuh"

namespace tessera::kernels::cuda {
namespace {

using namespace rows;  // NOLINT: this file's own helpers, see rows.cuh

__device__ __forceinline__ float sqrt_acc(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_acc(double v) { return sqrt(v); }

// Note [Residual layer norm]
// A pre-LayerNorm block adds a sub-layer's output into the residual stream and normalizes
// the sum: h = x + delta, y = LN(h). With kAdd the forward's passes read x and delta
// (the later ones from L1/L2) and form h rounded to T, as the separate add; the first also
// writes it. That saves the add kernel's launch and a read of h from memory. Backward adds dh, the
// gradient h receives from the residual stream, into the norm's dx in the same pass (warp-per-row
// kernel), which saves writing the norm's dx and reading it back for the sum; both x and delta take
// that gradient.

// y = (x - mean) * rstd * weight + bias per row; mean and rstd saved in acc_t (f32 for
// half inputs). weight and bias may be null. With kAdd the rows normalized are
// h = x + delta, written to h (Note [Residual layer norm]).
template <class T, bool kAdd>
__global__ void layer_norm_kernel(const T* __restrict__ x,       // (rows, cols)
                                  const T* __restrict__ delta,   // (rows, cols), kAdd
                                  T* __restrict__ h,             // (rows, cols), kAdd
                                  const T* __restrict__ weight,  // (cols) or null
                                  const T* __restrict__ bias,    // (cols) or null
                                  T* __restrict__ y,             // (rows, cols)
                                  acc_t<T>* __restrict__ mean,   // (rows)
                                  acc_t<T>* __restrict__ rstd,   // (rows)
                                  int64_t rows, int64_t cols, acc_t<T> eps) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const T* none = nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    const T* dr = kAdd ? delta + r * cols : none;
    // The row's value at j from x (and delta): h rounded to T, as the separate add.
    const auto value = [](A a, A b) { return kAdd ? to_acc(from_acc<T>(a + b)) : a; };
    // Two passes as on the CPU, the mean then the squared deviations: no cancellation.
    // The second pass reads the row again from L1/L2 (x and delta, not h: the read-only
    // loads need not see this kernel's own writes).
    A s = A(0);
    if constexpr (kAdd) {
      map_row(xr, dr, h + r * cols, cols, [&](int64_t, A a, A b) {
        const A v = value(a, b);
        s += v;
        return v;  // rounding it again to T changes nothing
      });
    } else {
      visit_row(xr, none, cols, [&](int64_t, A v, A) { s += v; });
    }
    const A m = block_sum(s, scratch) / static_cast<A>(cols);
    A q = A(0);
    visit_row(xr, dr, cols, [&](int64_t, A a, A b) {
      const A d = value(a, b) - m;
      q += d * d;
    });
    const A rs = A(1) / sqrt_acc(block_sum(q, scratch) / static_cast<A>(cols) + eps);
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    map_row(xr, dr, y + r * cols, cols, [&](int64_t j, A a, A b) {
      const A v = value(a, b);
      A out = (v - m) * rs;
      if (weight != nullptr) out = out * to_acc(weight[j]);
      if (bias != nullptr) out = out + to_acc(bias[j]);
      return out;
    });
  }
}

// The layer norm of contiguous x (..., C), or with `delta` of h = x + delta, written into
// `h` (Note [Residual layer norm]); weight and bias contiguous or undefined.
LayerNormOutput norm_rows(const char* op, const Tensor& x, const Tensor& delta, const Tensor& h,
                          const Tensor& weight, const Tensor& bias, double eps) {
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t cols = x.size(-1);
  const int64_t rows = numel_of(stat_shape);
  return dispatch_cuda_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const TensorOptions stat_options{acc_dtype<T>(), x.device()};
    LayerNormOutput out{empty(x.shape(), {x.dtype(), x.device()}), empty(stat_shape, stat_options),
                        empty(stat_shape, stat_options)};
    if (rows == 0) return out;
    set_device(op, x);
    const T* w = weight.defined() ? ptr<T>(weight) : nullptr;
    const T* b = bias.defined() ? ptr<T>(bias) : nullptr;
    // A row of zero columns gets the CPU's mean 0 / 0 = NaN and rstd NaN.
    if (delta.defined()) {
      layer_norm_kernel<T, true><<<row_blocks(rows), row_threads<T>(cols), 0, kStream>>>(
          ptr<T>(x), ptr<T>(delta), ptr<T>(h), w, b, ptr<T>(out.y), ptr<A>(out.mean),
          ptr<A>(out.rstd), rows, cols, static_cast<A>(eps));
    } else {
      layer_norm_kernel<T, false><<<row_blocks(rows), row_threads<T>(cols), 0, kStream>>>(
          ptr<T>(x), nullptr, nullptr, w, b, ptr<T>(out.y), ptr<A>(out.mean), ptr<A>(out.rstd),
          rows, cols, static_cast<A>(eps));
    }
    check_launch(op);
    return out;
  });
}

}  // namespace

LayerNormOutput layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return norm_rows("layer_norm", contiguous_or_undefined(x), Tensor(), Tensor(),
                   contiguous_or_undefined(weight), contiguous_or_undefined(bias), eps);
}

AddLayerNormOutput add_layer_norm(const Tensor& x_in, const Tensor& delta, const Tensor& weight,
                                  const Tensor& bias, double eps) {
  const Tensor x = contiguous_or_undefined(x_in);  // (..., C)
  const Tensor h = empty(x.shape(), {x.dtype(), x.device()});
  LayerNormOutput norm =
      norm_rows("add_layer_norm", x, contiguous_or_undefined(delta), h,
                contiguous_or_undefined(weight), contiguous_or_undefined(bias), eps);
  return {h, std::move(norm)};
}

}  // namespace tessera::kernels::cuda
