// A matrix operand of the CPU GEMM kernels (sgemm.h, bf16_gemm.h): a pointer and two strides,
// so every transpose and leading dimension is a stride.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace tessera::kernels::cpu {

// Element (r, c) is at data[r * row_stride + c * col_stride].
template <class T>
struct StridedOf {
  const T* data;
  int64_t row_stride;
  int64_t col_stride;
};
using StridedMatrix = StridedOf<float>;
using HalfMatrix = StridedOf<Half>;
using Bf16Matrix = StridedOf<BFloat16>;

}  // namespace tessera::kernels::cpu
