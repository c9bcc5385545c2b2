// CUDA dropout: the CPU kernel's Philox mask bit for bit, regenerated in backward.
//
// Element i (row-major) uses word i % 4 of Philox4x32-10 block offset + i / 4 (high
// counter word 0, key = seed) and is kept when uniform_from_bits(word) >= p, compared in
// float as kernels/cpu/dropout.cc does. Each thread makes one block and uses its 4 words.
#include <cstdint>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

// One Philox4x32-10 block, equal to core/philox.cc's philox4x32.
__device__ __forceinline__ uint4 philox4x32(uint64_t counter_lo, uint64_t counter_hi,
                                            uint64_t key) {
  constexpr uint32_t kMul0 = 0xD2511F53u;
  constexpr uint32_t kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter_lo);
  uint32_t c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi);
  uint32_t c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key);
  uint32_t k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kMul0, c0);
    const uint32_t lo0 = kMul0 * c0;
    const uint32_t hi1 = __umulhi(kMul1, c2);
    const uint32_t lo1 = kMul1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return make_uint4(c0, c1, c2, c3);
}

// core/philox.h's uniform_from_bits: 24 bits to [0, 1), exact in float.
__device__ __forceinline__ float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

template <class T>
__device__ __forceinline__ T masked(T v, uint32_t bits, float threshold, acc_t<T> scale) {
  return uniform_from_bits(bits) >= threshold ? from_acc<T>(to_acc(v) * scale)
                                              : from_acc<T>(acc_t<T>(0));
}

// Four consecutive elements moved as one aligned load or store.
template <class T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// y[i] = keep(i) ? x[i] * scale : 0 for the n row-major elements. kStrided reads x through
// ix; kPacked (contiguous, 4-element aligned x and y) moves whole groups as Pack4.
template <class T, bool kStrided, bool kPacked>
__global__ void dropout_kernel(T* __restrict__ y, const T* __restrict__ x, Indexer ix, int64_t n,
                               uint64_t seed, uint64_t offset, float threshold, acc_t<T> scale) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < groups;
       b += int64_t{gridDim.x} * blockDim.x) {
    const uint4 r = philox4x32(offset + static_cast<uint64_t>(b), 0, seed);
    const uint32_t words[4] = {r.x, r.y, r.z, r.w};
    const int64_t i0 = 4 * b;
    if (kPacked && i0 + 4 <= n) {
      Pack4<T> pack = *reinterpret_cast<const Pack4<T>*>(x + i0);
#pragma unroll
      for (int j = 0; j < 4; ++j) pack.v[j] = masked(pack.v[j], words[j], threshold, scale);
      *reinterpret_cast<Pack4<T>*>(y + i0) = pack;
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
    constexpr uintptr_t kPackBytes = sizeof(Pack4<T>);
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

}  // namespace

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {  // (*) -> (*)
  return apply_mask("dropout", x, p, seed, offset);
}

Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed,
                        uint64_t offset) {  // (*) -> (*)
  return apply_mask("dropout_backward", dy, p, seed, offset);
}

}  // namespace tessera::kernels::cuda
