// CPU dropout with a Philox mask regenerated in backward (see kernels/dropout.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels::cpu {

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);  // (*) -> (*)
Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed,
                        uint64_t offset);  // (*) -> (*)
// keep[r * ld + c] = 1 where dropout(x, p, seed, offset) keeps row-major element
// first + r * row_stride + c of x, else 0, for r < rows and c < cols: rows of the mask
// without the tensor (the fused attention's blocks, Note [Attention-probability dropout]
// in kernels/attention.h).
void dropout_keep_rows(uint64_t seed, uint64_t offset, uint64_t first, uint64_t row_stride,
                       int64_t rows, int64_t cols, double p, uint8_t* keep, int64_t ld);

}  // namespace tessera::kernels::cpu
