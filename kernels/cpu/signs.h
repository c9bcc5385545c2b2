// CPU sign-bit kernels (see kernels/signs.h).
#pragma once

#include "kernels/signs.h"

namespace tessera::kernels::cpu {

Tensor pack_signs(const Tensor& x);  // x contiguous 1-D floating
Tensor unpack_signs(const Tensor& bits, int64_t n, DType dtype);

}  // namespace tessera::kernels::cpu
