// CUDA reductions: sum and var over any dims, max with the index of its first maximum.
//
// Note [CUDA reduction layout]
// As on the CPU, x is viewed as a contiguous (outer, reduced, inner) block: in place when
// the reduced dims are one run of a contiguous x, otherwise through a copy with the kept
// dims first and the reduced dims last (inner = 1). inner == 1 reduces rows: a warp per
// row up to kWarpRowLimit elements, a block per row beyond. inner > 1 reduces columns: a
// block owns kTile adjacent columns (coalesced loads) and kTileRows thread rows that are
// combined through shared memory. Every thread adds its elements in a fixed order and the
// threads combine in a fixed tree, so the results are bitwise reproducible. Long
// reductions with few outputs are cut into chunks whose partial results (acc_t) a second
// launch combines in order; the chunk count depends on the shape only, never on the device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/reduce_dims.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int64_t kWarpRowLimit = 1024;  // rows up to this long are reduced by one warp
constexpr int kRowWarps = 8;             // warps per block when a warp owns a row
constexpr int kTile = 32;                // columns per block of a column reduction
constexpr int kTileRows = 8;             // thread rows per block of a column reduction
constexpr int64_t kTargetTasks = 1024;   // blocks that keep every SM busy
constexpr int64_t kMinChunk = 8192;      // elements per chunk of a cut row, at least
constexpr int64_t kMinChunkRows = 256;   // rows per chunk of a cut column reduction, at least
constexpr int64_t kMaxChunks = 65535;    // chunks index gridDim.y in column reductions
constexpr int64_t kMaxGrid = 65535 * 8;  // blocks per launch; grid-stride loops do the rest

template <class T>
constexpr DType acc_dtype() {
  return std::is_same_v<acc_t<T>, double> ? DType::f64 : DType::f32;
}

// Pieces each of `tasks` reductions of length n is cut into, so that about kTargetTasks
// pieces run and none is shorter than min_len.
int64_t chunk_count(int64_t tasks, int64_t n, int64_t min_len, int64_t most) {
  const int64_t wanted = (kTargetTasks + tasks - 1) / tasks;
  return std::clamp<int64_t>(wanted, 1, std::clamp<int64_t>(n / min_len, 1, most));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// v as the output type: unchanged when it already is, rounded otherwise.
template <class Out, class A>
__device__ __forceinline__ Out store_as(A v) {
  if constexpr (std::is_same_v<Out, A>) {
    return v;
  } else {
    return from_acc<Out>(v);
  }
}

// f(i, v) = v: plain sums.
struct Identity {
  template <class A>
  __device__ A operator()(int64_t, A v) const {
    return v;
  }
};

// f(i, v) = (v - mean[i])^2: the second pass of var.
template <class A>
struct SquaredDeviation {
  const A* mean;  // (outer * inner)
  __device__ A operator()(int64_t i, A v) const {
    const A d = v - mean[i];
    return d * d;
  }
};

// Task t of `tasks` sums f(row, x[row, i]) over chunk t % chunks of row t / chunks and
// writes the sum divided by `div` to out[t]. blockDim (32, kRowWarps): a warp per task;
// blockDim (kThreads, 1): a block per task.
template <class T, class Out, class F>
__global__ void row_sum_kernel(const T* __restrict__ x,  // (rows, n)
                               int64_t tasks, int64_t n, int64_t chunk_len, int64_t chunks,
                               Out* __restrict__ out,  // (rows, chunks)
                               F f, acc_t<T> div) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const bool by_warp = blockDim.y > 1;
  const int lane = threadIdx.x;
  const int width = blockDim.x;
  const int64_t first = by_warp ? int64_t{blockIdx.x} * blockDim.y + threadIdx.y : blockIdx.x;
  const int64_t step = by_warp ? int64_t{gridDim.x} * blockDim.y : gridDim.x;
  // The loop bound is uniform over a warp (by_warp) or the block, as the reductions need.
  for (int64_t t = first; t < tasks; t += step) {
    const int64_t row = t / chunks;
    const int64_t begin = t % chunks * chunk_len;
    const int64_t end = imin(n, begin + chunk_len);
    const T* p = x + row * n;
    A s = A(0);
    for (int64_t i = begin + lane; i < end; i += width) s += f(row, to_acc(p[i]));
    s = by_warp ? warp_sum(s) : block_sum(s, scratch);
    if (lane == 0) out[t] = store_as<Out>(s / div);
  }
}

// out[o, chunk, c] = sum over the rows r of chunk blockIdx.y of f(o * inner + c, x[o, r, c]),
// divided by `div`. blockDim (kTile, kTileRows); gridDim.y = chunks.
template <class T, class Out, class F>
__global__ void col_sum_kernel(const T* __restrict__ x,  // (outer, n, inner)
                               int64_t outer, int64_t n, int64_t inner, int64_t chunk_len,
                               Out* __restrict__ out,  // (outer, chunks, inner)
                               F f, acc_t<T> div) {
  using A = acc_t<T>;
  __shared__ A part[kTileRows][kTile + 1];
  const int64_t chunks = gridDim.y;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * chunk_len;
  const int64_t end = imin(n, begin + chunk_len);
  const int64_t tiles = (inner + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < outer * tiles; t += gridDim.x) {
    const int64_t o = t / tiles;
    const int64_t c = t % tiles * kTile + threadIdx.x;
    A s = A(0);
    if (c < inner) {
      const T* p = x + o * n * inner + c;
      const int64_t at = o * inner + c;
      for (int64_t r = begin + threadIdx.y; r < end; r += kTileRows)
        s += f(at, to_acc(p[r * inner]));
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < inner) {
      A total = part[0][threadIdx.x];
      for (int k = 1; k < kTileRows; ++k) total += part[k][threadIdx.x];
      out[(o * chunks + chunk) * inner + c] = store_as<Out>(total / div);
    }
    __syncthreads();  // part is rewritten by the next tile
  }
}

// Sums chunk by chunk: `tasks` = rows * chunks sums of chunk_len elements (see row_sum_kernel).
template <class T, class Out, class F>
void launch_rows(const char* op, const T* x, int64_t tasks, int64_t n, int64_t chunk_len,
                 int64_t chunks, Out* out, F f, acc_t<T> div) {
  if (chunk_len <= kWarpRowLimit) {
    const dim3 block(32, kRowWarps);
    row_sum_kernel<<<static_cast<unsigned>(std::min(ceil_div(tasks, kRowWarps), kMaxGrid)), block,
                     0, kStream>>>(x, tasks, n, chunk_len, chunks, out, f, div);
  } else {
    row_sum_kernel<<<static_cast<unsigned>(std::min(tasks, kMaxGrid)), kThreads, 0, kStream>>>(
        x, tasks, n, chunk_len, chunks, out, f, div);
  }
  check_launch(op);
}

template <class T, class Out, class F>
void launch_cols(const char* op, const T* x, int64_t outer, int64_t n, int64_t inner,
                 int64_t chunk_len, int64_t chunks, Out* out, F f, acc_t<T> div) {
  const int64_t tiles = outer * ceil_div(inner, kTile);
  const dim3 grid(static_cast<unsigned>(std::min(tiles, kMaxGrid)), static_cast<unsigned>(chunks));
  col_sum_kernel<<<grid, dim3(kTile, kTileRows), 0, kStream>>>(x, outer, n, inner, chunk_len, out,
                                                               f, div);
  check_launch(op);
}

// out[i] = (sum of f(i, v) over the elements v reduced into output i) / div, for every
// output i of b (Note [CUDA reduction layout]). An empty reduction gives 0 / div.
template <class T, class Out, class F>
void reduce_sum(const char* op, const ReduceBlock& b, Out* out, F f, acc_t<T> div) {
  using A = acc_t<T>;
  const T* x = ptr<T>(b.data);
  const int64_t n = b.reduced;
  const bool rows = b.inner == 1;
  const int64_t tasks = rows ? b.outer : b.outer * ceil_div(b.inner, kTile);
  int64_t chunks = 1;
  if (rows && n > kWarpRowLimit) chunks = chunk_count(tasks, n, kMinChunk, kMaxGrid);
  if (!rows) chunks = chunk_count(tasks, n, kMinChunkRows, kMaxChunks);
  const int64_t chunk_len = std::max<int64_t>(1, ceil_div(n, chunks));
  chunks = std::max<int64_t>(1, ceil_div(n, chunk_len));  // no empty chunk
  if (chunks == 1) {
    if (rows) {
      launch_rows(op, x, b.outer, n, chunk_len, 1, out, f, div);
    } else {
      launch_cols(op, x, b.outer, n, b.inner, chunk_len, 1, out, f, div);
    }
    return;
  }
  // Partial sums in acc_t, then the same kernel sums each output's chunks in order.
  const Tensor partial = empty({b.outer * chunks * b.inner},
                               {acc_dtype<T>(), b.data.device()});  // (outer, chunks, inner)
  A* pp = ptr<A>(partial);
  if (rows) {
    launch_rows(op, x, b.outer * chunks, n, chunk_len, chunks, pp, f, A(1));
    launch_rows(op, static_cast<const A*>(pp), b.outer, chunks, chunks, 1, out, Identity(), div);
  } else {
    launch_cols(op, x, b.outer, n, b.inner, chunk_len, chunks, pp, f, A(1));
    launch_cols(op, static_cast<const A*>(pp), b.outer, chunks, b.inner, chunks, 1, out, Identity(),
                div);
  }
}

// ---- max ---------------------------------------------------------------------------
// Whether (v, i) wins over (best, at): a NaN beats any number (torch propagates NaN), a
// larger number beats a smaller one, and equals (or two NaNs) go to the lower index: the
// CPU's first maximum (or first NaN). A strict order, so any combining tree agrees.
template <class A>
__device__ __forceinline__ bool wins(A v, int64_t i, A best, int64_t at) {
  const bool v_nan = v != v;
  const bool best_nan = best != best;
  if (v_nan != best_nan) return v_nan;
  if (!v_nan && v != best) return v > best;
  return i < at;
}

// The identity of `wins`: loses to every element, -inf included (by its index).
constexpr int64_t kNoIndex = INT64_MAX;

template <class A>
__device__ void warp_argmax(A& v, int64_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const A ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (wins(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// The block's winner, returned to every thread; blockDim.x is a multiple of 32.
template <class A>
__device__ void block_argmax(A& v, int64_t& i, A* scratch_v, int64_t* scratch_i) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  warp_argmax(v, i);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) {
    scratch_v[warp] = v;
    scratch_i[warp] = i;
  }
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch_v[lane] : A(-INFINITY);
  i = lane < warps ? scratch_i[lane] : kNoIndex;
  warp_argmax(v, i);
}

// Task t: the winner of chunk t % chunks of row t / chunks. An element's index is its
// position in the row, or x_index[row, position] when given (the combining pass).
// Launched as row_sum_kernel.
template <class T>
__global__ void row_max_kernel(const T* __restrict__ x,              // (rows, n)
                               const int64_t* __restrict__ x_index,  // (rows, n) or null
                               int64_t tasks, int64_t n, int64_t chunk_len, int64_t chunks,
                               T* __restrict__ values,           // (rows, chunks)
                               int64_t* __restrict__ indices) {  // (rows, chunks)
  using A = acc_t<T>;
  __shared__ A scratch_v[32];
  __shared__ int64_t scratch_i[32];
  const bool by_warp = blockDim.y > 1;
  const int lane = threadIdx.x;
  const int width = blockDim.x;
  const int64_t first = by_warp ? int64_t{blockIdx.x} * blockDim.y + threadIdx.y : blockIdx.x;
  const int64_t step = by_warp ? int64_t{gridDim.x} * blockDim.y : gridDim.x;
  for (int64_t t = first; t < tasks; t += step) {
    const int64_t row = t / chunks;
    const int64_t begin = t % chunks * chunk_len;
    const int64_t end = imin(n, begin + chunk_len);
    const T* p = x + row * n;
    A best = A(-INFINITY);
    int64_t at = kNoIndex;
    for (int64_t i = begin + lane; i < end; i += width) {
      const A v = to_acc(p[i]);
      const int64_t k = x_index == nullptr ? i : x_index[row * n + i];
      if (wins(v, k, best, at)) {
        best = v;
        at = k;
      }
    }
    if (by_warp) {
      warp_argmax(best, at);
    } else {
      block_argmax(best, at, scratch_v, scratch_i);
    }
    if (lane == 0) {
      values[t] = store_as<T>(best);  // exact: best is one of x's values
      indices[t] = at;
    }
  }
}

// values/indices[o, c] = the winner over r of x[o, r, c]. blockDim (kTile, kTileRows).
template <class T>
__global__ void col_max_kernel(const T* __restrict__ x,  // (outer, n, inner)
                               int64_t outer, int64_t n, int64_t inner,
                               T* __restrict__ values,           // (outer, inner)
                               int64_t* __restrict__ indices) {  // (outer, inner)
  using A = acc_t<T>;
  __shared__ A part_v[kTileRows][kTile + 1];
  __shared__ int64_t part_i[kTileRows][kTile + 1];
  const int64_t tiles = (inner + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < outer * tiles; t += gridDim.x) {
    const int64_t o = t / tiles;
    const int64_t c = t % tiles * kTile + threadIdx.x;
    A best = A(-INFINITY);
    int64_t at = kNoIndex;
    if (c < inner) {
      const T* p = x + o * n * inner + c;
      for (int64_t r = threadIdx.y; r < n; r += kTileRows) {
        const A v = to_acc(p[r * inner]);
        if (wins(v, r, best, at)) {
          best = v;
          at = r;
        }
      }
    }
    part_v[threadIdx.y][threadIdx.x] = best;
    part_i[threadIdx.y][threadIdx.x] = at;
    __syncthreads();
    if (threadIdx.y == 0 && c < inner) {
      for (int k = 1; k < kTileRows; ++k) {
        if (wins(part_v[k][threadIdx.x], part_i[k][threadIdx.x], best, at)) {
          best = part_v[k][threadIdx.x];
          at = part_i[k][threadIdx.x];
        }
      }
      values[o * inner + c] = store_as<T>(best);
      indices[o * inner + c] = at;
    }
    __syncthreads();  // part_v/part_i are rewritten by the next tile
  }
}

template <class T>
void launch_row_max(const T* x, const int64_t* x_index, int64_t tasks, int64_t n, int64_t chunk_len,
                    int64_t chunks, T* values, int64_t* indices) {
  if (chunk_len <= kWarpRowLimit) {
    const dim3 block(32, kRowWarps);
    row_max_kernel<<<static_cast<unsigned>(std::min(ceil_div(tasks, kRowWarps), kMaxGrid)), block,
                     0, kStream>>>(x, x_index, tasks, n, chunk_len, chunks, values, indices);
  } else {
    row_max_kernel<<<static_cast<unsigned>(std::min(tasks, kMaxGrid)), kThreads, 0, kStream>>>(
        x, x_index, tasks, n, chunk_len, chunks, values, indices);
  }
  check_launch("max");
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {  // (*) -> (*r)
  const std::vector<bool> mask = reduced_dims_mask(dims, x.dim(), "sum");
  Tensor out = empty(reduced_shape(x.shape(), mask, keepdim), {x.dtype(), x.device()});
  if (out.numel() == 0) return out;
  set_device("sum", x);
  dispatch_cuda_floating(x.dtype(), "sum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const ReduceBlock b = reduce_block_layout(x, mask);
    reduce_sum<T>("sum", b, ptr<T>(out), Identity(), A(1));
  });
  return out;
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction,
           bool keepdim) {  // (*) -> (*r)
  const std::vector<bool> mask = reduced_dims_mask(dims, x.dim(), "var");
  Tensor out = empty(reduced_shape(x.shape(), mask, keepdim), {x.dtype(), x.device()});
  if (out.numel() == 0) return out;
  set_device("var", x);
  dispatch_cuda_floating(x.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const ReduceBlock b = reduce_block_layout(x, mask);
    // Two passes as on the CPU, the mean then the squared deviations: no cancellation. An
    // empty reduction gives the mean 0 / 0 = NaN and the variance NaN.
    const Tensor mean = empty({out.numel()}, {acc_dtype<T>(), x.device()});  // (outer * inner)
    reduce_sum<T>("var", b, ptr<A>(mean), Identity(), static_cast<A>(b.reduced));
    // Like torch, a divisor of zero or less gives inf or NaN rather than an error.
    const A divisor = static_cast<A>(std::max<int64_t>(0, b.reduced - correction));
    reduce_sum<T>("var", b, ptr<T>(out), SquaredDeviation<A>{ptr<A>(mean)}, divisor);
  });
  return out;
}

MaxResult max(const Tensor& x, int64_t dim, bool keepdim) {  // (*) -> (*r), (*r) i64
  std::vector<bool> mask(static_cast<size_t>(x.dim()), false);
  if (x.dim() > 0) mask[normalize_dim(dim, x.dim(), "max")] = true;
  const Shape shape = reduced_shape(x.shape(), mask, keepdim);
  MaxResult result{empty(shape, {x.dtype(), x.device()}), empty(shape, {DType::i64, x.device()})};
  if (result.values.numel() == 0) return result;
  set_device("max", x);
  dispatch_cuda_floating(x.dtype(), "max", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ReduceBlock b = reduce_block_layout(x, mask);  // b.reduced > 0: the wrapper checked
    const T* px = ptr<T>(b.data);
    T* values = ptr<T>(result.values);
    int64_t* indices = ptr<int64_t>(result.indices);
    const int64_t n = b.reduced;
    if (b.inner > 1) {
      const int64_t tiles = b.outer * ceil_div(b.inner, kTile);
      col_max_kernel<<<static_cast<unsigned>(std::min(tiles, kMaxGrid)), dim3(kTile, kTileRows), 0,
                       kStream>>>(px, b.outer, n, b.inner, values, indices);
      check_launch("max");
      return;
    }
    const int64_t chunks0 = n > kWarpRowLimit ? chunk_count(b.outer, n, kMinChunk, kMaxGrid) : 1;
    const int64_t chunk_len = ceil_div(n, chunks0);
    const int64_t chunks = ceil_div(n, chunk_len);  // no empty chunk
    if (chunks == 1) {
      launch_row_max(px, nullptr, b.outer, n, n, 1, values, indices);
      return;
    }
    // Each chunk's winner, then the winner of the chunks (indices already row positions).
    const Tensor part_values =
        empty({b.outer * chunks}, {x.dtype(), x.device()});  // (outer, chunks)
    const Tensor part_indices =
        empty({b.outer * chunks}, {DType::i64, x.device()});  // (outer, chunks)
    launch_row_max(px, nullptr, b.outer * chunks, n, chunk_len, chunks, ptr<T>(part_values),
                   ptr<int64_t>(part_indices));
    launch_row_max(static_cast<const T*>(ptr<T>(part_values)),
                   static_cast<const int64_t*>(ptr<int64_t>(part_indices)), b.outer, chunks, chunks,
                   1, values, indices);
  });
  return result;
}

}  // namespace tessera::kernels::cuda
