// CUDA layer normalization over the last dim: forward and fused backward, a block per row.
//
// Note [Row kernels]
// A block owns a row at a time (grid-stride over rows) and sizes itself to the row, up to
// kMaxRowThreads. Rows are read in 16-byte packs when every pointer of the row has the same
// offset from a 16-byte boundary (a scalar head reaches the boundary, a scalar tail ends
// the row), otherwise element by element. Each thread accumulates its elements in order
// and the block combines threads in a fixed tree (block_sum), so results are reproducible.
// (The same helpers live in softmax.cu and cross_entropy.cu.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxRowThreads = 256;
constexpr int64_t kMaxGrid = 65535 * 8;   // blocks per launch; grid-stride loops do the rest
constexpr int64_t kMaxGradBlocks = 1024;  // row blocks of the backward, each with its partials
constexpr int64_t kMinGradRows = 8;       // rows per backward block, at least
constexpr int kTile = 32;                 // columns per block of the partial sums' reduction
constexpr int kTileRows = 8;              // thread rows per block of that reduction
constexpr size_t kDefaultSharedBytes = 48 << 10;  // shared memory per block without opt-in
constexpr size_t kStaticSharedBytes = 1024;       // bound on a kernel's static shared memory

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ float sqrt_acc(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_acc(double v) { return sqrt(v); }

// N elements of T loaded or stored as one 16-byte access.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// A pack seen as one uint4, so that the compiler emits one 16-byte load or store.
template <class T, int N>
union PackBits {
  uint4 bits;
  Pack<T, N> pack;
};

template <class T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  PackBits<T, N> u;
  u.bits = __ldg(reinterpret_cast<const uint4*>(p));
  return u.pack;
}

template <class T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  PackBits<T, N> u;
  u.pack = v;
  // __stwb is an ordinary store; a plain uint4 assignment was split into 4-byte stores.
  __stwb(reinterpret_cast<uint4*>(p), u.bits);
}

// Elements before the first 16-byte boundary at or after p, or all n when the row cannot
// be read in packs (the other pointers sit at another offset from a boundary).
template <class T>
__device__ __forceinline__ int64_t head_of(const T* p, bool same_offset, int64_t n) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(p) % 16;
  if (!same_offset) return n;
  return offset == 0 ? 0 : imin(n, static_cast<int64_t>((16 - offset) / sizeof(T)));
}

template <class T>
__device__ __forceinline__ bool same_offset(const T* a, const T* b) {
  return b == nullptr || reinterpret_cast<uintptr_t>(a) % 16 == reinterpret_cast<uintptr_t>(b) % 16;
}

// Calls fn(j, a[j], b[j]) (b[j] read as 0 when b is null) for the j < n this thread owns
// (Note [Row kernels]).
template <class T, class F>
__device__ __forceinline__ void visit_row(const T* a, const T* b, int64_t n, F&& fn) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  const int64_t head = head_of(a, same_offset(a, b), n);
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j]));
  }
  const int64_t packs = (n - head) / N;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const int64_t j = head + k * N;
    const Pack<T, N> pa = load_pack<T, N>(a + j);
    Pack<T, N> pb{};
    if (b != nullptr) pb = load_pack<T, N>(b + j);
#pragma unroll
    for (int i = 0; i < N; ++i) fn(j + i, to_acc(pa.v[i]), b == nullptr ? A(0) : to_acc(pb.v[i]));
  }
  for (int64_t j = head + packs * N + threadIdx.x; j < n; j += blockDim.x) {
    fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j]));
  }
}

// out[j] = fn(j, a[j], b[j]) for the j < n this thread owns, as visit_row.
template <class T, class F>
__device__ __forceinline__ void map_row(const T* a, const T* b, T* out, int64_t n, F&& fn) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  const int64_t head = head_of(a, same_offset(a, b) && same_offset<T>(a, out), n);
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    out[j] = from_acc<T>(fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j])));
  }
  const int64_t packs = (n - head) / N;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const int64_t j = head + k * N;
    const Pack<T, N> pa = load_pack<T, N>(a + j);
    Pack<T, N> pb{};
    if (b != nullptr) pb = load_pack<T, N>(b + j);
    Pack<T, N> po;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      po.v[i] = from_acc<T>(fn(j + i, to_acc(pa.v[i]), b == nullptr ? A(0) : to_acc(pb.v[i])));
    }
    store_pack(out + j, po);
  }
  for (int64_t j = head + packs * N + threadIdx.x; j < n; j += blockDim.x) {
    out[j] = from_acc<T>(fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j])));
  }
}

// Threads of a block that owns rows of `cols` elements: one per 16-byte pack, rounded to
// whole warps, at most kMaxRowThreads.
template <class T>
int row_threads(int64_t cols) {
  const int64_t packs = (cols + 16 / sizeof(T) - 1) / (16 / sizeof(T));
  return static_cast<int>(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, kMaxRowThreads));
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxGrid)); }

template <class T>
constexpr DType acc_dtype() {
  return std::is_same_v<acc_t<T>, double> ? DType::f64 : DType::f32;
}

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
