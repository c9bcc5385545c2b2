// CUDA level-1 vector kernels: squared L2 norm, in-place scaling and y += alpha x.
//
// Note [Deterministic device norms]
// squared_norm sums in f64 in two passes: a grid whose size depends only on n writes one
// partial per block (each thread strides over fixed elements, then a fixed block tree),
// and one block adds the partials in a fixed order. The same tensor thus gives bitwise
// the same norm on every run. A non-finite element makes the sum non-finite (squares
// are never negative, so inf cannot cancel), which the loss scaler's overflow check uses.
#include <cstdint>

#include "core/factories.h"
#include "kernels/clip_factor.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxReduceBlocks = 1024;

// Blocks of the first pass: a function of n only (Note [Deterministic device norms]).
int reduce_blocks(int64_t n) {
  const int64_t per_block = int64_t{kThreads} * 8;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxReduceBlocks ? kMaxReduceBlocks : blocks));
}

template <int VEC, class T>
__global__ void __launch_bounds__(kThreads)
    squared_norm_partials_kernel(const T* __restrict__ x, int64_t n,
                                 double* __restrict__ partials) {
  __shared__ double scratch[32];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  double acc = 0;
  for (int64_t k = first; k < packs; k += stride) {
    const Pack<T, VEC> a = reinterpret_cast<const Pack<T, VEC>*>(x)[k];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const double v = static_cast<double>(to_acc(a.v[e]));
      acc += v * v;
    }
  }
  for (int64_t i = packs * VEC + first; i < n; i += stride) {
    const double v = static_cast<double>(to_acc(x[i]));
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: *out = sum of partials[0, count) in a fixed order, or *out += it (`add`).
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const double* __restrict__ partials, int count, bool add,
                        double* __restrict__ out) {
  __shared__ double scratch[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = add ? *out + acc : acc;
}

// One thread: out = {factor, norm} of Note [Clip factor] (kernels/clip_factor.h).
__global__ void clip_factor_kernel(const double* __restrict__ squared_norm, double loss_scale,
                                   double max_norm, bool overflow_skips, double* __restrict__ out) {
  const ClipFactor c = clip_factor_of(*squared_norm, loss_scale, max_norm, overflow_skips,
                                      [](double v) { return sqrt(v); });
  out[0] = c.factor;
  out[1] = c.norm;
}

// Queues sum(x^2) into *out (written, or added to with `add`), as Note [Deterministic device
// norms] describes; `scratch` holds reduce_blocks(n) doubles.
void queue_squared_norm(const Tensor& x, double* scratch, bool add, double* out) {
  const int64_t n = x.numel();
  const int blocks = reduce_blocks(n);
  dispatch_cuda_floating(x.dtype(), "squared_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vec_of<T>();
    const T* px = ptr<const T>(x);
    if (aligned_for<T, kVec>(px)) {
      squared_norm_partials_kernel<kVec><<<blocks, kThreads, 0, kStream>>>(px, n, scratch);
    } else {
      squared_norm_partials_kernel<1><<<blocks, kThreads, 0, kStream>>>(px, n, scratch);
    }
  });
  check_launch("squared_norm");
  sum_partials_kernel<<<1, kThreads, 0, kStream>>>(scratch, blocks, add, out);
  check_launch("squared_norm");
}

template <int VEC, class T>
__global__ void __launch_bounds__(kThreads)
    scale_kernel(T* __restrict__ x, int64_t n, acc_t<T> factor) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t k = first; k < packs; k += stride) {
    Pack<T, VEC> a = reinterpret_cast<const Pack<T, VEC>*>(x)[k];
#pragma unroll
    for (int e = 0; e < VEC; ++e) a.v[e] = from_acc<T>(to_acc(a.v[e]) * factor);
    reinterpret_cast<Pack<T, VEC>*>(x)[k] = a;
  }
  for (int64_t i = packs * VEC + first; i < n; i += stride) {
    x[i] = from_acc<T>(to_acc(x[i]) * factor);
  }
}

// y + alpha x (x may alias y); with alpha == 1 it equals y + x exactly (one rounding either way).
template <int VEC, class T>
__global__ void __launch_bounds__(kThreads)
    axpy_kernel(T* y, const T* x, int64_t n, acc_t<T> alpha) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t k = first; k < packs; k += stride) {
    Pack<T, VEC> a = reinterpret_cast<const Pack<T, VEC>*>(y)[k];
    const Pack<T, VEC> b = reinterpret_cast<const Pack<T, VEC>*>(x)[k];
#pragma unroll
    for (int e = 0; e < VEC; ++e) a.v[e] = from_acc<T>(to_acc(a.v[e]) + alpha * to_acc(b.v[e]));
    reinterpret_cast<Pack<T, VEC>*>(y)[k] = a;
  }
  for (int64_t i = packs * VEC + first; i < n; i += stride) {
    y[i] = from_acc<T>(to_acc(y[i]) + alpha * to_acc(x[i]));
  }
}

}  // namespace

double squared_norm(const Tensor& x_in) {  // (*) -> scalar
  const int64_t n = x_in.numel();
  if (n == 0) return 0.0;
  set_device("squared_norm", x_in);
  // detach: contiguous() of a tensor that requires grad throws while grad mode is on.
  const Tensor x = x_in.detach().contiguous();
  const int blocks = reduce_blocks(n);
  // partials[0, blocks), then the total.
  const Tensor scratch = empty({blocks + 1}, {DType::f64, x.device()});
  double* partials = ptr<double>(scratch);
  queue_squared_norm(x, partials, /*add=*/false, partials + blocks);
  double total = 0;
  // Synchronous on the compute stream: sees both kernels (Note [One compute stream]).
  check_cuda(cudaMemcpy(&total, partials + blocks, sizeof(double), cudaMemcpyDeviceToHost),
             "squared_norm", "cudaMemcpy");
  return total;
}

void add_squared_norm(const Tensor& x_in, const Tensor& total) {  // (*), () f64
  const int64_t n = x_in.numel();
  if (n == 0) return;
  set_device("add_squared_norm", x_in);
  const Tensor x = x_in.detach().contiguous();
  const Tensor scratch = empty({reduce_blocks(n)}, {DType::f64, x.device()});
  queue_squared_norm(x, ptr<double>(scratch), /*add=*/true, ptr<double>(total));
}

Tensor clip_factor(const Tensor& squared_norm, double loss_scale, double max_norm,
                   bool overflow_skips) {  // () f64 -> (2) f64
  set_device("clip_factor", squared_norm);
  const Tensor out = empty({2}, {DType::f64, squared_norm.device()});
  clip_factor_kernel<<<1, 1, 0, kStream>>>(ptr<const double>(squared_norm), loss_scale, max_norm,
                                           overflow_skips, ptr<double>(out));
  check_launch("clip_factor");
  return out;
}

void scale_(const Tensor& x, double factor) {  // (*) contiguous, in place
  const int64_t n = x.numel();
  if (n == 0) return;
  set_device("scale_", x);
  dispatch_cuda_floating(x.dtype(), "scale_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vec_of<T>();
    T* px = ptr<T>(x);
    const auto f = static_cast<acc_t<T>>(factor);
    if (aligned_for<T, kVec>(px) && n >= kVec) {
      scale_kernel<kVec><<<grid_for(n / kVec), kThreads, 0, kStream>>>(px, n, f);
    } else {
      scale_kernel<1><<<grid_for(n), kThreads, 0, kStream>>>(px, n, f);
    }
  });
  check_launch("scale_");
}

void axpy_(const Tensor& y, const Tensor& x_in, double alpha) {  // (*) contiguous, (*)
  const int64_t n = y.numel();
  if (n == 0) return;
  set_device("axpy_", y);
  const Tensor x = x_in.detach().contiguous();
  dispatch_cuda_floating(y.dtype(), "axpy_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vec_of<T>();
    T* py = ptr<T>(y);
    const T* px = ptr<const T>(x);
    const auto a = static_cast<acc_t<T>>(alpha);
    if (aligned_for<T, kVec>(py) && aligned_for<T, kVec>(px) && n >= kVec) {
      axpy_kernel<kVec><<<grid_for(n / kVec), kThreads, 0, kStream>>>(py, px, n, a);
    } else {
      axpy_kernel<1><<<grid_for(n), kThreads, 0, kStream>>>(py, px, n, a);
    }
  });
  check_launch("axpy_");
}

}  // namespace tessera::kernels::cuda
