// CPU dropout with a Philox mask regenerated in backward (see kernels/dropout.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels::cpu {

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);  // (*) -> (*)
Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed,
                        uint64_t offset);  // (*) -> (*)

}  // namespace tessera::kernels::cpu
