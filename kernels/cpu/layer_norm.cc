#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kGrain = 32768;  // elements per parallel chunk, at least

// t without autograd state, made contiguous (copied only when it is not); undefined stays so.
Tensor contiguous_or_undefined(const Tensor& t) {
  return t.defined() ? t.detach().contiguous() : Tensor();
}

template <class T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

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
