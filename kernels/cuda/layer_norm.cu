// CUDA layer normalization over the last dim: forward and fused backward, a block per row.
//
// See Note [Row kernels] in kernels/cuda/rows.cuh.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/rows.cuh"

namespace tessera::kernels::cuda {
namespace {

using namespace rows;  // NOLINT: this file's own helpers, see rows.cuh

constexpr int64_t kMaxGradBlocks = 1024;  // row blocks of the backward, each with its partials
constexpr int64_t kMinGradRows = 8;       // rows per backward block, at least
constexpr int kTile = 32;                 // columns per block of the partial sums' reduction
constexpr int kTileRows = 8;              // thread rows per block of that reduction
constexpr size_t kDefaultSharedBytes = 48 << 10;  // shared memory per block without opt-in
constexpr size_t kStaticSharedBytes = 1024;       // bound on a kernel's static shared memory

__device__ __forceinline__ float sqrt_acc(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_acc(double v) { return sqrt(v); }

// y = (x - mean) * rstd * weight + bias per row; mean and rstd saved in acc_t (f32 for
// half inputs). weight and bias may be null.
template <class T>
__global__ void layer_norm_kernel(const T* __restrict__ x,       // (rows, cols)
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
    // Two passes as on the CPU, the mean then the squared deviations: no cancellation.
    // The second pass reads the row again from L1/L2.
    A s = A(0);
    visit_row(xr, none, cols, [&](int64_t, A v, A) { s += v; });
    const A m = block_sum(s, scratch) / static_cast<A>(cols);
    A q = A(0);
    visit_row(xr, none, cols, [&](int64_t, A v, A) {
      const A d = v - m;
      q += d * d;
    });
    const A rs = A(1) / sqrt_acc(block_sum(q, scratch) / static_cast<A>(cols) + eps);
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    map_row(xr, none, y + r * cols, cols, [&](int64_t j, A v, A) {
      A out = (v - m) * rs;
      if (weight != nullptr) out = out * to_acc(weight[j]);
      if (bias != nullptr) out = out + to_acc(bias[j]);
      return out;
    });
  }
}

// Note [CUDA layer norm backward]
// dx per row as on the CPU (Note [Layer norm backward]): with xhat = (x - mean) * rstd and
// dxhat = dy * weight, dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
// dweight = sum of dy * xhat and dbias = sum of dy over rows: block b adds its rows, in
// order, into its own (2, cols) accumulators (shared memory when they fit, else its row of
// `partial` in global memory), then writes them to partial[b]; a second kernel sums the
// blocks' partials column by column in a fixed order. Element j of a row may belong to
// another thread in the next row (rows at other 16-byte offsets), but the block_sum
// barriers between the rows order those updates; no atomics, so results are reproducible.
template <class T, class S>
__global__ void layer_norm_backward_kernel(const T* __restrict__ dy,      // (rows, cols)
                                           const T* __restrict__ x,       // (rows, cols)
                                           const T* __restrict__ weight,  // (cols) or null
                                           const S* __restrict__ mean,    // (rows)
                                           const S* __restrict__ rstd,    // (rows)
                                           T* __restrict__ dx,            // (rows, cols)
                                           acc_t<T>* partial,  // (gridDim.x, 2, cols) or null
                                           bool in_shared, int64_t rows, int64_t cols) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  __shared__ A scratch[32];
  A* acc = nullptr;  // (2, cols): dweight then dbias sums of this block's rows
  if (partial != nullptr) {
    acc = in_shared ? reinterpret_cast<A*>(shared_bytes) : partial + blockIdx.x * 2 * cols;
    for (int64_t j = threadIdx.x; j < 2 * cols; j += blockDim.x) acc[j] = A(0);
    __syncthreads();
  }
  const A inv_cols = A(1) / static_cast<A>(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* dyr = dy + r * cols;
    const T* xr = x + r * cols;
    const A m = to_acc(mean[r]);
    const A rs = to_acc(rstd[r]);
    A s1 = A(0);  // sum of dxhat
    A s2 = A(0);  // sum of dxhat * xhat
    visit_row(dyr, xr, cols, [&](int64_t j, A g, A v) {
      const A xhat = (v - m) * rs;
      const A dxhat = weight == nullptr ? g : g * to_acc(weight[j]);
      s1 += dxhat;
      s2 += dxhat * xhat;
    });
    const A mean_dxhat = block_sum(s1, scratch) * inv_cols;
    const A mean_dxhat_xhat = block_sum(s2, scratch) * inv_cols;
    map_row(dyr, xr, dx + r * cols, cols, [&](int64_t j, A g, A v) {
      const A xhat = (v - m) * rs;
      const A dxhat = weight == nullptr ? g : g * to_acc(weight[j]);
      if (acc != nullptr) {
        acc[j] += g * xhat;
        acc[cols + j] += g;
      }
      return rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    });
  }
  if (partial != nullptr && in_shared) {
    __syncthreads();  // every thread's last row is in acc
    A* out = partial + blockIdx.x * 2 * cols;
    for (int64_t j = threadIdx.x; j < 2 * cols; j += blockDim.x) out[j] = acc[j];
  }
}

// dweight[j] = sum over blocks b of partial[b, 0, j]; dbias[j] likewise from partial[b, 1, j].
// blockDim (kTile, kTileRows): a block owns kTile columns, its thread rows take every
// kTileRows-th block and are combined in order.
template <class T>
__global__ void param_grads_kernel(const acc_t<T>* __restrict__ partial,  // (parts, 2, cols)
                                   int64_t parts, int64_t cols,
                                   T* __restrict__ dweight,  // (cols)
                                   T* __restrict__ dbias) {  // (cols)
  using A = acc_t<T>;
  __shared__ A part[kTileRows][kTile + 1];
  const int64_t width = 2 * cols;
  for (int64_t c0 = int64_t{blockIdx.x} * kTile; c0 < width; c0 += int64_t{gridDim.x} * kTile) {
    const int64_t c = c0 + threadIdx.x;
    A s = A(0);
    if (c < width) {
      for (int64_t p = threadIdx.y; p < parts; p += kTileRows) s += partial[p * width + c];
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < width) {
      A total = part[0][threadIdx.x];
      for (int k = 1; k < kTileRows; ++k) total += part[k][threadIdx.x];
      if (c < cols) {
        dweight[c] = from_acc<T>(total);
      } else {
        dbias[c - cols] = from_acc<T>(total);
      }
    }
    __syncthreads();  // part is rewritten by the next tile
  }
}

// Calls f(TypeTag<S>{}) with S the element type of the saved statistics: x's own type, or
// acc_t (f32 for half inputs) as layer_norm on CUDA saves them.
template <class T, class F>
void dispatch_stats(const char* op, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    F&& f) {
  TS_CHECK(mean.dtype() == rstd.dtype(), "[", op, "] expected mean and rstd of one dtype, found ",
           dtype_name(mean.dtype()), " and ", dtype_name(rstd.dtype()));
  if (mean.dtype() == x.dtype()) return f(TypeTag<T>{});
  TS_CHECK(mean.dtype() == acc_dtype<T>(), "[", op, "] expected mean of dtype ",
           dtype_name(x.dtype()), " or ", dtype_name(acc_dtype<T>()), ", found ",
           dtype_name(mean.dtype()));
  f(TypeTag<acc_t<T>>{});
}

// Whether `bytes` of dynamic shared memory can be given to `kernel` on the current device,
// raising its limit past the default when the device allows.
template <class K>
bool fits_in_shared(const char* op, K* kernel, size_t bytes) {
  // The kernel's static shared memory (scratch) comes out of the same budget.
  if (bytes + kStaticSharedBytes <= kDefaultSharedBytes) return true;
  int device = 0;
  int optin = 0;
  check_cuda(cudaGetDevice(&device), op, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), op,
             "cudaDeviceGetAttribute");
  if (bytes + kStaticSharedBytes > static_cast<size_t>(optin)) return false;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             op, "cudaFuncSetAttribute");
  return true;
}

}  // namespace

LayerNormOutput layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                           double eps) {
  constexpr const char* op = "layer_norm";
  const Tensor x = x_in.detach().contiguous();  // (..., C)
  const Tensor weight = weight_in.defined() ? weight_in.detach().contiguous() : Tensor();  // (C)
  const Tensor bias = bias_in.defined() ? bias_in.detach().contiguous() : Tensor();        // (C)
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
    // A row of zero columns gets the CPU's mean 0 / 0 = NaN and rstd NaN.
    layer_norm_kernel<T><<<row_blocks(rows), row_threads<T>(cols), 0, kStream>>>(
        ptr<T>(x), weight.defined() ? ptr<T>(weight) : nullptr,
        bias.defined() ? ptr<T>(bias) : nullptr, ptr<T>(out.y), ptr<A>(out.mean), ptr<A>(out.rstd),
        rows, cols, static_cast<A>(eps));
    check_launch(op);
    return out;
  });
}

LayerNormGrads layer_norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& weight_in,
                                   const Tensor& mean_in, const Tensor& rstd_in) {
  constexpr const char* op = "layer_norm_backward";
  const Tensor dy = dy_in.detach().contiguous();  // (..., C)
  const Tensor x = x_in.detach().contiguous();    // (..., C)
  const Tensor weight = weight_in.defined() ? weight_in.detach().contiguous() : Tensor();  // (C)
  const Tensor mean = mean_in.detach().contiguous();                                       // (...)
  const Tensor rstd = rstd_in.detach().contiguous();                                       // (...)
  const TensorOptions options{x.dtype(), x.device()};
  const int64_t cols = x.size(-1);
  const int64_t rows = mean.numel();
  LayerNormGrads grads;
  grads.dx = empty(x.shape(), options);
  if (weight.defined()) {
    // Sums over no rows are zeros, as on the CPU.
    grads.dweight = rows == 0 ? zeros({cols}, options) : empty({cols}, options);
    grads.dbias = rows == 0 ? zeros({cols}, options) : empty({cols}, options);
  }
  if (rows == 0 || cols == 0) return grads;
  set_device(op, x);
  dispatch_cuda_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dispatch_stats<T>(op, x, mean, rstd, [&](auto stat_tag) {
      using S = typename decltype(stat_tag)::type;
      const int threads = row_threads<T>(cols);
      if (!weight.defined()) {
        layer_norm_backward_kernel<T, S><<<row_blocks(rows), threads, 0, kStream>>>(
            ptr<T>(dy), ptr<T>(x), nullptr, ptr<S>(mean), ptr<S>(rstd), ptr<T>(grads.dx), nullptr,
            false, rows, cols);
        check_launch(op);
        return;
      }
      // Note [CUDA layer norm backward]; the block count depends on the shape only.
      const int64_t blocks =
          std::clamp<int64_t>((rows + kMinGradRows - 1) / kMinGradRows, 1, kMaxGradBlocks);
      const Tensor partial =
          empty({blocks, 2, cols}, {acc_dtype<T>(), x.device()});  // (blocks, 2, C)
      const size_t bytes = 2 * static_cast<size_t>(cols) * sizeof(A);
      const bool in_shared = fits_in_shared(op, layer_norm_backward_kernel<T, S>, bytes);
      layer_norm_backward_kernel<T, S>
          <<<static_cast<unsigned>(blocks), threads, in_shared ? bytes : 0, kStream>>>(
              ptr<T>(dy), ptr<T>(x), ptr<T>(weight), ptr<S>(mean), ptr<S>(rstd), ptr<T>(grads.dx),
              ptr<A>(partial), in_shared, rows, cols);
      check_launch(op);
      const int64_t tiles = (2 * cols + kTile - 1) / kTile;
      param_grads_kernel<T>
          <<<static_cast<unsigned>(std::min(tiles, kMaxGrid)), dim3(kTile, kTileRows), 0,
             kStream>>>(ptr<A>(partial), blocks, cols, ptr<T>(grads.dweight), ptr<T>(grads.dbias));
      check_launch(op);
    });
  });
  return grads;
}

}  // namespace tessera::kernels::cuda
