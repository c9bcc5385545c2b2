// CPU dropout with a Philox mask regenerated in backward (see kernels/dropout.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels::cpu {

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);  // (*) -> (*)
Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed,
                        uint64_t offset);  // (*) -> (*)
// keep[e] = 1 where dropout(x, p, seed, offset) keeps row-major element first + e of x,
// else 0, for e in [0, count): a slice of the mask without the tensor (the fused
// attention's, Note [Attention-probability dropout] in kernels/attention.h).
void dropout_keep(uint64_t seed, uint64_t offset, uint64_t first, int64_t count, double p,
                  uint8_t* keep);

}  // namespace tessera::kernels::cpu
