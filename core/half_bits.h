// f32 -> f16 / bf16 rounding on the device, bit for bit the host's scalar conversions of
// core/half.h (round to nearest even; a NaN stays a NaN with its sign and top payload
// bits, as the host keeps it): the one definition that the device's dtype conversions
// (core/cuda/copy_kernel.cu) and the kernels that write 16-bit copies of f32 values (the
// optimizer's model copies, kernels/cuda/optimizers.cu) share, so that their results equal
// Tensor::copy_'s. CUDA's __float2half_rn and __float2bfloat16_rn give every NaN one fixed
// pattern instead. Device code only: empty without nvcc.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)

namespace tessera {

__device__ __forceinline__ uint16_t float_to_f16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    const float shifted = __uint_as_float(abs) + 0.5f;
    return uint16_t(sign | (__float_as_uint(shifted) - 0x3f000000u));
  }
  const uint32_t rounded = abs + 0xc8000fffu + ((abs >> 13) & 1u);
  return uint16_t(sign | (rounded >> 13));
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace tessera

#endif  // __CUDACC__
