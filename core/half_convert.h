// Bulk conversion between f32 and the 16-bit formats (f16, bf16) of contiguous arrays.
//
// Every result is bitwise the one of the scalar conversions in core/half.h (round to
// nearest even, NaN kept a NaN with the scalar's bits), so a tensor converted in bulk equals
// one converted element by element. With AVX-512 the loops take 16 values per instruction
// sequence; otherwise they are the scalar loops. The mixed-precision paths of the CPU
// backend convert whole activations and weights with them (Note [16-bit math on the CPU] in
// kernels/cpu/widen.h), where the scalar loop cost more than the op it fed.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace tessera {

// dst[i] = BFloat16(src[i]) / Half(src[i]) for i in [0, n).
void f32_to_bf16(const float* src, BFloat16* dst, int64_t n);
void f32_to_f16(const float* src, Half* dst, int64_t n);
// dst[i] = float(src[i]) for i in [0, n); exact.
void bf16_to_f32(const BFloat16* src, float* dst, int64_t n);
void f16_to_f32(const Half* src, float* dst, int64_t n);

}  // namespace tessera
