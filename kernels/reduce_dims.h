// Which dims a reduction removes, shared by the reduce family's validation and backends.
#pragma once

#include <cstdint>
#include <vector>

#include "core/shape.h"

namespace tessera::kernels {

// mask[d] is true for every dim of a rank-`ndim` tensor that `dims` names (all of them when
// `dims` is empty); throws naming `op` on an out-of-range or repeated dim.
std::vector<bool> reduced_dims_mask(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// `shape` without the masked dims, or with them set to 1 when `keepdim`.
Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim);
// Number of elements reduced into each output element.
int64_t reduced_count(const Shape& shape, const std::vector<bool>& mask);

}  // namespace tessera::kernels
