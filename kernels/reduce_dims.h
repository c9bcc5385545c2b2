// Which dims a reduction removes, shared by the reduce family's validation and backends.
#pragma once

#include <cstdint>
#include <vector>

#include "core/shape.h"
#include "core/tensor.h"

namespace tessera::kernels {

// mask[d] is true for every dim of a rank-`ndim` tensor that `dims` names (all of them when
// `dims` is empty); throws naming `op` on an out-of-range or repeated dim.
std::vector<bool> reduced_dims_mask(const std::vector<int64_t>& dims, int64_t ndim, const char* op);
// `shape` without the masked dims, or with them set to 1 when `keepdim`.
Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim);
// Number of elements reduced into each output element.
int64_t reduced_count(const Shape& shape, const std::vector<bool>& mask);

// x viewed as a contiguous (outer, reduced, inner) block; outputs follow (outer, inner).
// Both backends reduce through it, so they add in the same groups.
struct ReduceBlock {
  Tensor data;
  int64_t outer = 1;
  int64_t reduced = 1;
  int64_t inner = 1;
};

// Uses x in place when it is contiguous and its reduced dims (ignoring size-1 dims) are one
// run; otherwise copies it with the kept dims first and the reduced dims last.
ReduceBlock reduce_block_layout(const Tensor& x, const std::vector<bool>& mask);

}  // namespace tessera::kernels
