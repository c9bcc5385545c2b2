#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/checks.h"
#include "kernels/cpu/avx512_math.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kGrain = 32768;  // elements per parallel chunk, at least

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

#if defined(__AVX512F__)
// The sum of x[0, n) in one 16-lane accumulator, vector by vector in order: the order in
// which layer_norm_rows_avx512 sums every next row, so a row's sums do not depend on
// whether it starts a thread's chunk (and results not on the thread count).
float row_sum_avx512(const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(first_lanes(n - i), x + i));
  }
  return _mm512_reduce_add_ps(acc);
}
// The sum of (x - shift)^2 over x[0, n), in two 16-lane accumulators.
float row_squared_deviation_avx512(const float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + i), s);
    const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), s);
    a0 = _mm512_fmadd_ps(d0, d0, a0);
    a1 = _mm512_fmadd_ps(d1, d1, a1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = first_lanes(n - i);
    const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), s);
    a0 = _mm512_fmadd_ps(d, d, a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// layer_norm on f32 rows [r0, r1) with AVX-512: the same two-pass mean and variance as the
// Eigen form, the second pass reading the row from L1. The loop that writes row r also sums
// row r + 1, so reads from memory and writes to it overlap rather than alternate in bursts
// of a row (Note [Memory-bound kernels] in kernels/cpu/avx512_math.h).
void layer_norm_rows_avx512(const float* px, const float* pw, const float* pb, float* py,
                            float* pmean, float* prstd, int64_t r0, int64_t r1, int64_t cols,
                            float eps) {
  const float inv_cols = 1 / static_cast<float>(cols);
  float sum = row_sum_avx512(px + r0 * cols, cols);  // of row r
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = px + r * cols;
    const float* next = r + 1 < r1 ? xr + cols : nullptr;
    const float mean = sum * inv_cols;
    const float rstd = 1 / std::sqrt(row_squared_deviation_avx512(xr, cols, mean) * inv_cols + eps);
    pmean[r] = mean;
    prstd[r] = rstd;
    const __m512 vmean = _mm512_set1_ps(mean), vrstd = _mm512_set1_ps(rstd);
    __m512 next_sum = _mm512_setzero_ps();
    for_each_vector(py + r * cols, cols, [&](int64_t i, __mmask16 m) {
      if (next != nullptr) next_sum = _mm512_add_ps(next_sum, _mm512_maskz_loadu_ps(m, next + i));
      __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, xr + i), vmean), vrstd);
      if (pw != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, pw + i));
      if (pb != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, pb + i));
      return v;
    });
    sum = _mm512_reduce_add_ps(next_sum);
  }
}
#endif

}  // namespace

LayerNormOutput layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                           double eps) {
  if (is_half(x_in.dtype())) {  // mean and rstd stay f32
    LayerNormOutput out = cpu::layer_norm(widened(x_in), widened(weight_in), widened(bias_in), eps);
    out.y = narrowed(out.y, x_in.dtype());
    return out;
  }
  const Tensor x = x_in.detach().contiguous();               // (..., C)
  const Tensor weight = contiguous_or_undefined(weight_in);  // (C)
  const Tensor bias = contiguous_or_undefined(bias_in);      // (C)
  const TensorOptions options{x.dtype(), x.device()};
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  LayerNormOutput out{empty(x.shape(), options), empty(stat_shape, options),
                      empty(stat_shape, options)};
  const int64_t cols = x.size(-1);
  const int64_t rows = numel_of(stat_shape);
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    const T* pw = data_or_null<T>(weight);
    const T* pb = data_or_null<T>(bias);
    T* py = out.y.data_ptr<T>();
    T* pmean = out.mean.data_ptr<T>();
    T* prstd = out.rstd.data_ptr<T>();
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
        layer_norm_rows_avx512(px, pw, pb, py, pmean, prstd, r0, r1, cols, static_cast<float>(eps));
      });
      return;
    }
#endif
    parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const ConstArrayMap<T> xr(px + r * cols, cols);
        ArrayMap<T> yr(py + r * cols, cols);
        const T mean = xr.mean();
        const T rstd = 1 / std::sqrt((xr - mean).square().mean() + static_cast<T>(eps));
        pmean[r] = mean;
        prstd[r] = rstd;
        if (pw == nullptr) {
          yr = (xr - mean) * rstd;
        } else if (pb == nullptr) {
          yr = (xr - mean) * rstd * ConstArrayMap<T>(pw, cols);
        } else {
          yr = (xr - mean) * rstd * ConstArrayMap<T>(pw, cols) + ConstArrayMap<T>(pb, cols);
        }
      }
    });
  });
  return out;
}

// Note [Layer norm backward]
// With xhat = (x - mean) * rstd and dxhat = dy * weight, per row:
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
// dweight and dbias sum dy * xhat and dy over rows: each chunk of rows accumulates into its
// own column of a partial buffer, and the columns are summed at the end, so no two threads
// write one location and the result does not depend on thread timing.
LayerNormGrads layer_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& weight_in,
                                   const Tensor& mean_in, const Tensor& rstd_in) {
  if (is_half(x_in.dtype())) {
    LayerNormGrads g = cpu::layer_norm_backward(widened(dy_in), widened(x_in), widened(weight_in),
                                                mean_in, rstd_in);
    return {narrowed(g.dx, x_in.dtype()), narrowed(g.dweight, x_in.dtype()),
            narrowed(g.dbias, x_in.dtype())};
  }
  const Tensor dy = dy_in.detach().contiguous();             // (..., C)
  const Tensor x = x_in.detach().contiguous();               // (..., C)
  const Tensor weight = contiguous_or_undefined(weight_in);  // (C)
  const Tensor mean = mean_in.detach().contiguous();         // (...)
  const Tensor rstd = rstd_in.detach().contiguous();         // (...)
  const TensorOptions options{x.dtype(), x.device()};
  const int64_t cols = x.size(-1);
  const int64_t rows = mean.numel();
  LayerNormGrads grads;
  grads.dx = empty(x.shape(), options);
  if (weight.defined()) {
    grads.dweight = empty({cols}, options);
    grads.dbias = empty({cols}, options);
  }
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pdy = dy.data_ptr<T>();
    const T* px = x.data_ptr<T>();
    const T* pw = data_or_null<T>(weight);
    const T* pmean = mean.data_ptr<T>();
    const T* prstd = rstd.data_ptr<T>();
    T* pdx = grads.dx.data_ptr<T>();
    const int64_t chunks =
        std::clamp<int64_t>(rows * cols / kGrain, 1, std::max<int64_t>(num_threads(), 1));
    Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic> dweight_parts(cols, chunks);  // (C, chunks)
    Eigen::Array<T, Eigen::Dynamic, Eigen::Dynamic> dbias_parts(cols, chunks);    // (C, chunks)
    dweight_parts.setZero();
    dbias_parts.setZero();
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      ArrayX<T> xhat(cols);
      ArrayX<T> dxhat(cols);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = rows * c / chunks; r < rows * (c + 1) / chunks; ++r) {
          const ConstArrayMap<T> dyr(pdy + r * cols, cols);
          xhat = (ConstArrayMap<T>(px + r * cols, cols) - pmean[r]) * prstd[r];
          if (pw == nullptr) {
            dxhat = dyr;
          } else {
            dxhat = dyr * ConstArrayMap<T>(pw, cols);
            dweight_parts.col(c) += dyr * xhat;
            dbias_parts.col(c) += dyr;
          }
          const T mean_dxhat = dxhat.mean();
          const T mean_dxhat_xhat = (dxhat * xhat).mean();
          ArrayMap<T>(pdx + r * cols, cols) =
              prstd[r] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        }
      }
    });
    if (pw != nullptr) {
      ArrayMap<T>(grads.dweight.data_ptr<T>(), cols) = dweight_parts.rowwise().sum();
      ArrayMap<T>(grads.dbias.data_ptr<T>(), cols) = dbias_parts.rowwise().sum();
    }
  });
  return grads;
}

}  // namespace tessera::kernels::cpu
