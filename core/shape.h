// Shapes and strides: row-major, any rank, int64 dimensions, strides in elements.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace tessera {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// Product of the dimensions (1 for a 0-dim shape); throws on negative dims or overflow.
int64_t numel_of(const Shape& shape);
// Row-major strides for `shape`.
Strides contiguous_strides(const Shape& shape);
// "(2, 3, 4)"; "()" for a scalar.
std::string shape_str(const Shape& shape);
// Broadcast shape of `a` and `b` (numpy rules); throws naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Maps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);

}  // namespace tessera
