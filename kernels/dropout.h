// Dropout with a Philox mask that is regenerated in backward, never stored.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

// y[i] = keep(i) ? x[i] / (1 - p) : 0, keep(i) = uniform(i) >= p, where uniform(i) maps
// word i % 4 of Philox block (offset + i / 4) under key `seed` (i: row-major index).
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);  // (*) -> (*)
// dx = the same mask applied to dy.
Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed, uint64_t offset);

}  // namespace tessera::kernels
