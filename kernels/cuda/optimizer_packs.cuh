// What the CUDA optimizer steps share (kernels/cuda/adamw.cu, optimizers.cu): vector
// loads and stores of packs, the grid-stride loop over them, and Adam's bias correction.
// Included by those two files only.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace tessera::kernels::cuda {

// True when every pointer allows VEC-element vector accesses.
template <class T, int VEC, class... P>
bool all_aligned(const P*... p) {
  return (aligned_for<T, VEC>(p) && ...);
}

__device__ __forceinline__ float m_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double m_sqrt(double v) { return sqrt(v); }

// Loads pack k (or element k when VEC == 1) of p.
template <int VEC, class T>
__device__ __forceinline__ Pack<T, VEC> load(const T* p, int64_t k) {
  return reinterpret_cast<const Pack<T, VEC>*>(p)[k];
}
template <int VEC, class T>
__device__ __forceinline__ void store(T* p, int64_t k, const Pack<T, VEC>& v) {
  reinterpret_cast<Pack<T, VEC>*>(p)[k] = v;
}

// This thread's share of n elements, grid-stride: body(width, k) for pack k of VEC
// elements, then for the tail element by element as packs of one (width is an
// integral_constant, so the body loads Pack<T, width> and indexes in packs of it).
template <int VEC, class F>
__device__ __forceinline__ void for_each_pack(int64_t n, const F& body) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t k = first; k < packs; k += stride) body(std::integral_constant<int, VEC>{}, k);
  if constexpr (VEC > 1) {
    for (int64_t i = packs * VEC + first; i < n; i += stride) {
      body(std::integral_constant<int, 1>{}, i);
    }
  }
}

// 1 - beta^step in f64, or 1 without bias correction (as the CPU).
inline double bias_correction(bool enabled, double beta, int64_t step) {
  return enabled ? 1 - std::pow(beta, static_cast<double>(step)) : 1;
}

}  // namespace tessera::kernels::cuda
