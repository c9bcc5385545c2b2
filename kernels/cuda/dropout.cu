// CUDA dropout: the CPU kernel's Philox mask bit for bit, regenerated in backward.
//
// Element i (row-major) uses word i % 4 of Philox4x32-10 block offset + i / 4 (high
// counter word 0, key = seed) and is kept when uniform_from_bits(word) >= p, compared in
// float as kernels/cpu/dropout.cc does. Each thread makes one block and uses its 4 words.
#include <cstdint>

#include "core/factories.h"
#include "core/philox_block.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

template <class T>
__device__ __forceinline__ T masked(T v, uint32_t bits, float threshold, acc_t<T> scale) {
  return uniform_from_bits(bits) >= threshold ? from_acc<T>(to_acc(v) * scale)
                                              : from_acc<T>(acc_t<T>(0));
}

// y[i] = keep(i) ? x[i] * scale : 0 for the n row-major elements. kStrided reads x through
// ix; kPacked (contiguous, 4-element aligned x and y) moves whole groups as Pack<T, 4>.
template <class T, bool kStrided, bool kPacked>
__global__ void dropout_kernel(T* __restrict__ y, const T* __restrict__ x, Indexer ix, int64_t n,
                               uint64_t seed, uint64_t offset, float threshold, acc_t<T> scale) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < groups;
       b += int64_t{gridDim.x} * blockDim.x) {
    const PhiloxWords r = philox_block(offset + static_cast<uint64_t>(b), 0, seed);
    const uint32_t words[4] = {r.w[0], r.w[1], r.w[2], r.w[3]};
    const int64_t i0 = 4 * b;
    if (kPacked && i0 + 4 <= n) {
      Pack<T, 4> pack = *reinterpret_cast<const Pack<T, 4>*>(x + i0);
#pragma unroll
      for (int j = 0; j < 4; ++j) pack.v[j] = masked(pack.v[j], words[j], threshold, scale);
      *reinterpret_cast<Pack<T, 4>*>(y + i0) = pack;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t i = i0 + j;
        if (i < n) y[i] = masked(x[kStrided ? ix(i) : i], words[j], threshold, scale);
      }
    }
  }
}

// Applies the mask of (seed, offset) to x; y is contiguous with x's shape.
Tensor apply_mask(const char* op, const Tensor& x_in, double p, uint64_t seed,
                  uint64_t offset) {  // (*) -> (*)
  Tensor x = x_in.detach();
  // Strided inputs are read in place; one deeper than an Indexer reaches is copied first.
  if (x.dim() > kMaxDims && !x.is_contiguous()) x = x.contiguous();
  Tensor y = empty(x.shape(), {x.dtype(), x.device()});
  const int64_t n = x.numel();
  if (n == 0) return y;
  set_device(op, x);
  const bool strided = !x.is_contiguous();
  const Indexer ix = strided ? make_indexer(op, x, x.shape()) : Indexer{};
  // p == 1 (allowed here, rejected by the public wrapper) gives scale inf and keeps
  // nothing, as on the CPU, since every uniform is < 1.
  const float threshold = static_cast<float>(p);
  dispatch_cuda_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // In acc_t, which for f32/f64 is the CPU's static_cast<T>(1 / (1 - p)).
    const acc_t<T> scale = static_cast<acc_t<T>>(1.0 / (1.0 - p));
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    const unsigned grid = grid_for((n + 3) / 4);
    constexpr uintptr_t kPackBytes = sizeof(Pack<T, 4>);
    const bool aligned = reinterpret_cast<uintptr_t>(px) % kPackBytes == 0 &&
                         reinterpret_cast<uintptr_t>(py) % kPackBytes == 0;
    if (strided) {
      dropout_kernel<T, true, false>
          <<<grid, kThreads, 0, kStream>>>(py, px, ix, n, seed, offset, threshold, scale);
    } else if (aligned) {
      dropout_kernel<T, false, true>
          <<<grid, kThreads, 0, kStream>>>(py, px, ix, n, seed, offset, threshold, scale);
    } else {
      dropout_kernel<T, false, false>
          <<<grid, kThreads, 0, kStream>>>(py, px, ix, n, seed, offset, threshold, scale);
    }
    check_launch(op);
  });
  return y;
}

// mask[i] = 1 where element i is kept, else 0, one Philox block per thread; with kPacked
// (a mask aligned to Pack<T, 4>) whole groups of 4 are stored as one pack.
template <class T, bool kPacked>
__global__ void keep_mask_kernel(T* __restrict__ mask, int64_t n, uint64_t seed, uint64_t offset,
                                 float threshold) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < groups;
       b += int64_t{gridDim.x} * blockDim.x) {
    const PhiloxWords r = philox_block(offset + static_cast<uint64_t>(b), 0, seed);
    Pack<T, 4> pack;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pack.v[j] = from_acc<T>(acc_t<T>(uniform_from_bits(r.w[j]) >= threshold ? 1 : 0));
    }
    const int64_t i0 = 4 * b;
    if (kPacked && i0 + 4 <= n) {
      *reinterpret_cast<Pack<T, 4>*>(mask + i0) = pack;
    } else {
      for (int j = 0; i0 + j < n; ++j) mask[i0 + j] = pack.v[j];
    }
  }
}

}  // namespace

Tensor dropout_keep_mask(const Shape& shape, DType dtype, Device device, double p, uint64_t seed,
                         uint64_t offset) {
  constexpr const char* op = "dropout_keep_mask";
  Tensor mask = empty(shape, {dtype, device});
  const int64_t n = mask.numel();
  if (n == 0) return mask;
  set_device(op, mask);
  dispatch_cuda_floating(mask.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = ptr<T>(mask);
    const auto kernel = reinterpret_cast<uintptr_t>(out) % sizeof(Pack<T, 4>) == 0
                            ? keep_mask_kernel<T, true>
                            : keep_mask_kernel<T, false>;
    kernel<<<grid_for((n + 3) / 4), kThreads, 0, kStream>>>(out, n, seed, offset,
                                                            static_cast<float>(p));
    check_launch(op);
  });
  return mask;
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {  // (*) -> (*)
  return apply_mask("dropout", x, p, seed, offset);
}

Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed,
                        uint64_t offset) {  // (*) -> (*)
  return apply_mask("dropout_backward", dy, p, seed, offset);
}

}  // namespace tessera::kernels::cuda
