// CUDA layer normalization's backward over the last dim (the forward is in layer_norm.cu):
// a block per row, or a warp per row and column sums, with or without a residual gradient.
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

constexpr int64_t kMaxGradBlocks = 1024;  // row blocks of the backward, each with its partials
constexpr int64_t kMinGradRows = 8;       // rows per backward block, at least
constexpr int kTile = 32;                 // columns per block of the partial sums' reduction
constexpr int kTileRows = 32;             // thread rows per block of that reduction
constexpr int kMaxLanePacks = 8;          // packs of a row per lane in the warp-per-row dx
constexpr int kRowWarps = 8;              // warps per block of the warp-per-row dx
constexpr int64_t kGroupRows = 64;        // rows per group of the column sums, at least
constexpr int64_t kMaxGroups = 1024;      // row groups of the column sums, at most
constexpr int kRowLanes = 8;              // thread rows per block of the column sums
constexpr int kRowsInFlight = 4;          // rows a column-sum thread loads at once
constexpr size_t kDefaultSharedBytes = 48 << 10;  // shared memory per block without opt-in
constexpr size_t kStaticSharedBytes = 1024;       // bound on a kernel's static shared memory

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

// Note [Warp-per-row layer norm backward]
// When a row is a whole number of 16-byte packs, at most 32 x kMaxLanePacks of them, and
// the tensors are 16-byte aligned (GPT-2's C = 768 in any dtype but f64), the backward
// splits in two. dx takes a warp per row: each lane keeps its packs of dy and x in
// registers (each read once), the row's two sums are warp shuffles (no block barriers),
// and dx is written once. dweight and dbias, column sums over the rows, come from a
// kernel of their own that reads dy and x again: a block per 32 packs of columns and group
// of rows, whose kRowLanes thread rows take every kRowLanes-th row of the group,
// kRowsInFlight rows loaded at a time, and add up in order into the group's partial; then
// param_grads_kernel sums the groups in a fixed order. Every sum has a fixed order,
// so the results are reproducible. The block-per-row kernel above does both in one pass
// but waits at two barriers per row and leaves up to 1024 blocks' partials to the second
// pass; it remains for the other shapes.

// dx of the rows (Note [Warp-per-row layer norm backward]): one warp per row, lane l
// holding packs l, l + 32, ... of it, at most P of them.
template <class T, class S, int P>
__global__ void layer_norm_dx_warp_kernel(const T* __restrict__ dy,      // (rows, packs N)
                                          const T* __restrict__ x,       // (rows, packs N)
                                          const T* __restrict__ weight,  // (packs N) or null
                                          const S* __restrict__ mean,    // (rows)
                                          const S* __restrict__ rstd,    // (rows)
                                          const T* __restrict__ dh,      // (rows, packs N) or null
                                          T* __restrict__ dx,            // (rows, packs N)
                                          int64_t rows, int64_t packs) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  const int lane = threadIdx.x % 32;
  const int64_t cols = packs * N;
  const A inv_cols = A(1) / static_cast<A>(cols);
  Pack<T, N> w[P];  // this lane's packs of the weight, for every row
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int64_t p = int64_t{k} * 32 + lane;
    if (weight != nullptr && p < packs) w[k] = load_pack<T, N>(weight + p * N);
  }
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t r = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const A m = to_acc(mean[r]);
    const A rs = to_acc(rstd[r]);
    Pack<T, N> g[P], v[P];
    A s1 = A(0);  // sum of dxhat
    A s2 = A(0);  // sum of dxhat * xhat
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t p = int64_t{k} * 32 + lane;
      if (p >= packs) continue;
      g[k] = load_pack<T, N>(dy + r * cols + p * N);
      v[k] = load_pack<T, N>(x + r * cols + p * N);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const A xhat = (to_acc(v[k].v[i]) - m) * rs;
        const A dxhat =
            weight == nullptr ? to_acc(g[k].v[i]) : to_acc(g[k].v[i]) * to_acc(w[k].v[i]);
        s1 += dxhat;
        s2 += dxhat * xhat;
      }
    }
    const A mean_dxhat = warp_sum(s1) * inv_cols;
    const A mean_dxhat_xhat = warp_sum(s2) * inv_cols;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t p = int64_t{k} * 32 + lane;
      if (p >= packs) continue;
      Pack<T, N> out, residual{};
      if (dh != nullptr) residual = load_pack<T, N>(dh + r * cols + p * N);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const A xhat = (to_acc(v[k].v[i]) - m) * rs;
        const A dxhat =
            weight == nullptr ? to_acc(g[k].v[i]) : to_acc(g[k].v[i]) * to_acc(w[k].v[i]);
        const A norm_dx = rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        // Rounded to T before the sum, as the separate norm's dx is (Note [Residual layer
        // norm] in layer_norm.cu).
        out.v[i] = dh == nullptr
                       ? from_acc<T>(norm_dx)
                       : from_acc<T>(to_acc(residual.v[i]) + to_acc(from_acc<T>(norm_dx)));
      }
      store_pack(dx + r * cols + p * N, out);
    }
  }
}

// The column sums of Note [Warp-per-row layer norm backward]. Block (c, g) owns packs
// [32 c, 32 c + 32) of the columns and rows [g rows_per_group, (g + 1) rows_per_group):
// thread (x, y) adds the rows y, y + kRowLanes, ... of them for its pack, kRowsInFlight
// rows loaded at a time, and the block adds its kRowLanes thread rows in order into
// partial[g, 0, c] = sum of dy * xhat and partial[g, 1, c] = sum of dy.
template <class T, class S>
__global__ void __launch_bounds__(32 * kRowLanes)
    layer_norm_column_sums_kernel(const T* __restrict__ dy,        // (rows, packs N)
                                  const T* __restrict__ x,         // (rows, packs N)
                                  const S* __restrict__ mean,      // (rows)
                                  const S* __restrict__ rstd,      // (rows)
                                  acc_t<T>* __restrict__ partial,  // (groups, 2, cols)
                                  int64_t rows, int64_t packs, int64_t rows_per_group) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  __shared__ A lanes[kRowLanes][32][2 * N];  // each thread row's sums, for the block's sum
  const int64_t p = int64_t{blockIdx.x} * 32 + threadIdx.x;
  const int64_t cols = packs * N;
  const int64_t first = int64_t{blockIdx.y} * rows_per_group;
  const int64_t end = imin(rows, first + rows_per_group);
  A dw[N], db[N];
#pragma unroll
  for (int i = 0; i < N; ++i) dw[i] = db[i] = A(0);
  const auto add = [&](const Pack<T, N>& g, const Pack<T, N>& v, A m, A rs) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const A gi = to_acc(g.v[i]);
      dw[i] += gi * ((to_acc(v.v[i]) - m) * rs);
      db[i] += gi;
    }
  };
  if (p < packs) {
    constexpr int64_t kStride = kRowLanes;
    int64_t r = first + threadIdx.y;
    for (; r + (kRowsInFlight - 1) * kStride < end; r += kRowsInFlight * kStride) {
      Pack<T, N> g[kRowsInFlight], v[kRowsInFlight];
#pragma unroll
      for (int k = 0; k < kRowsInFlight; ++k) {
        g[k] = load_pack<T, N>(dy + (r + k * kStride) * cols + p * N);
        v[k] = load_pack<T, N>(x + (r + k * kStride) * cols + p * N);
      }
#pragma unroll
      for (int k = 0; k < kRowsInFlight; ++k) {
        add(g[k], v[k], to_acc(mean[r + k * kStride]), to_acc(rstd[r + k * kStride]));
      }
    }
    for (; r < end; r += kStride) {
      add(load_pack<T, N>(dy + r * cols + p * N), load_pack<T, N>(x + r * cols + p * N),
          to_acc(mean[r]), to_acc(rstd[r]));
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    lanes[threadIdx.y][threadIdx.x][i] = dw[i];
    lanes[threadIdx.y][threadIdx.x][N + i] = db[i];
  }
  __syncthreads();
  if (threadIdx.y != 0 || p >= packs) return;
  A* out = partial + int64_t{blockIdx.y} * 2 * cols + p * N;
#pragma unroll
  for (int i = 0; i < 2 * N; ++i) {
    A total = lanes[0][threadIdx.x][i];
    for (int y = 1; y < kRowLanes; ++y) total += lanes[y][threadIdx.x][i];
    out[i < N ? i : cols + i - N] = total;
  }
}

// dweight[j] = sum over blocks b of partial[b, 0, j]; dbias[j] likewise from partial[b, 1, j].
// blockDim (kTile, kTileRows): a block owns kTile columns, its thread rows take every
// kTileRows-th block and are combined in order.
template <class T>
__global__ void __launch_bounds__(kTile* kTileRows)
    param_grads_kernel(const acc_t<T>* __restrict__ partial,  // (parts, 2, cols)
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
#pragma unroll 4
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

// grads.dweight and grads.dbias from `parts` partial sums (parts, 2, cols), with
// param_grads_kernel.
template <class T>
void sum_partials(const char* op, const Tensor& partial, int64_t parts, int64_t cols,
                  const LayerNormGrads& grads) {
  const int64_t tiles = (2 * cols + kTile - 1) / kTile;
  param_grads_kernel<T>
      <<<static_cast<unsigned>(std::min(tiles, kMaxGrid)), dim3(kTile, kTileRows), 0, kStream>>>(
          ptr<acc_t<T>>(partial), parts, cols, ptr<T>(grads.dweight), ptr<T>(grads.dbias));
  check_launch(op);
}

// layer_norm_dx_warp_kernel for rows of `lane_packs` packs per lane (1 to kMaxLanePacks).
template <class T, class S>
auto dx_warp_kernel(int64_t lane_packs) {
  static_assert(kMaxLanePacks == 8, "the instances below go up to 8 packs per lane");
  return lane_packs <= 1   ? layer_norm_dx_warp_kernel<T, S, 1>
         : lane_packs <= 2 ? layer_norm_dx_warp_kernel<T, S, 2>
         : lane_packs <= 4 ? layer_norm_dx_warp_kernel<T, S, 4>
                           : layer_norm_dx_warp_kernel<T, S, 8>;
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

// layer_norm_backward of contiguous operands, with dh (undefined: none) added to dx (Note
// [Residual layer norm] in layer_norm.cu): in the warp-per-row kernel, else after.
LayerNormGrads backward_rows(const char* op, const Tensor& dy, const Tensor& dh, const Tensor& x,
                             const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
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
  bool dh_added = false;
  dispatch_cuda_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dispatch_stats<T>(op, x, mean, rstd, [&](auto stat_tag) {
      using S = typename decltype(stat_tag)::type;
      constexpr int N = 16 / sizeof(T);
      const int64_t packs = cols / N;
      const bool aligned = aligned_for<T, N>(ptr<T>(dy)) && aligned_for<T, N>(ptr<T>(x)) &&
                           aligned_for<T, N>(ptr<T>(grads.dx)) &&
                           (!weight.defined() || aligned_for<T, N>(ptr<T>(weight))) &&
                           (!dh.defined() || aligned_for<T, N>(ptr<T>(dh)));
      if (cols % N == 0 && packs <= 32 * kMaxLanePacks && aligned) {
        // Note [Warp-per-row layer norm backward].
        const int64_t blocks = std::min((rows + kRowWarps - 1) / kRowWarps, kMaxGrid);
        const auto dx_kernel = dx_warp_kernel<T, S>((packs + 31) / 32);
        dx_kernel<<<static_cast<unsigned>(blocks), 32 * kRowWarps, 0, kStream>>>(
            ptr<T>(dy), ptr<T>(x), weight.defined() ? ptr<T>(weight) : nullptr, ptr<S>(mean),
            ptr<S>(rstd), dh.defined() ? ptr<T>(dh) : nullptr, ptr<T>(grads.dx), rows, packs);
        check_launch(op);
        dh_added = true;
        if (!weight.defined()) return;
        const int64_t wanted = std::clamp<int64_t>(rows / kGroupRows, 1, kMaxGroups);
        const int64_t per_group = (rows + wanted - 1) / wanted;
        const int64_t groups = (rows + per_group - 1) / per_group;  // none empty
        const Tensor partial =
            empty({groups, 2, cols}, {acc_dtype<T>(), x.device()});  // (groups, 2, C)
        layer_norm_column_sums_kernel<T, S>
            <<<dim3(static_cast<unsigned>((packs + 31) / 32), static_cast<unsigned>(groups)),
               dim3(32, kRowLanes), 0, kStream>>>(ptr<T>(dy), ptr<T>(x), ptr<S>(mean), ptr<S>(rstd),
                                                  ptr<A>(partial), rows, packs, per_group);
        check_launch(op);
        sum_partials<T>(op, partial, groups, cols, grads);
        return;
      }
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
      sum_partials<T>(op, partial, blocks, cols, grads);
    });
  });
  if (dh.defined() && !dh_added) grads.dx = cuda::binary(BinaryOp::add, dh, grads.dx);
  return grads;
}

}  // namespace

LayerNormGrads layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& mean, const Tensor& rstd) {
  return backward_rows("layer_norm_backward", contiguous_or_undefined(dy), Tensor(),
                       contiguous_or_undefined(x), contiguous_or_undefined(weight),
                       contiguous_or_undefined(mean), contiguous_or_undefined(rstd));
}

LayerNormGrads add_layer_norm_backward(const Tensor& dy, const Tensor& dh, const Tensor& h,
                                       const Tensor& weight, const Tensor& mean,
                                       const Tensor& rstd) {
  return backward_rows("add_layer_norm_backward", contiguous_or_undefined(dy),
                       contiguous_or_undefined(dh), contiguous_or_undefined(h),
                       contiguous_or_undefined(weight), contiguous_or_undefined(mean),
                       contiguous_or_undefined(rstd));
}

}  // namespace tessera::kernels::cuda
