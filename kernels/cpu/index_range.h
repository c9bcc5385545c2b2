// Range check of integer ids or indices before a gather or scatter reads through them.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/shape.h"

namespace tessera::kernels::cpu {

// Throws "[op] expected <what> in [0, bound), found <v> at flat position <i> of <what>
// <shape>" for the first of the n values p (laid out as `shape`) that is out of range.
template <class I>
void check_index_range(const char* op, const char* what, const I* p, int64_t n, int64_t bound,
                       const Shape& shape) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(p[i]);
    TS_CHECK(v >= 0 && v < bound, "[", op, "] expected ", what, " in [0, ", bound, "), found ", v,
             " at flat position ", i, " of ", what, " ", shape_str(shape));
  }
}

}  // namespace tessera::kernels::cpu
