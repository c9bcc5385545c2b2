// Sign bits for 1-bit compressed communication (parallel/compression): one bit per
// element, packed eight to a byte with the first element in the most significant bit (as
// numpy/cupy packbits). Bit 1 means "not negative": 0, -0 and nan pack as +1, as
// DeepSpeed's sign().add_(1).bool().
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

// (n) floating, contiguous -> (ceil(n / 8)) u8; the unused low bits of the last byte are 0.
Tensor pack_signs(const Tensor& x);
// (>= ceil(n / 8)) u8 -> (n) of +1 / -1 in `dtype` (floating), on the bits' device.
Tensor unpack_signs(const Tensor& bits, int64_t n, DType dtype);

}  // namespace tessera::kernels
