#include "core/shape.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TS_CHECK(d >= 0, "[shape] expected non-negative dimensions, found ", shape_str(shape));
    TS_CHECK(!__builtin_mul_overflow(n, d, &n), "[shape] element count of ", shape_str(shape),
             " overflows int64");
  }
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TS_CHECK(da == db || da == 1 || db == 1, "[", op, "] shapes do not broadcast: ", shape_str(a),
             " vs ", shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim;
  const int64_t hi = ndim == 0 ? 0 : ndim - 1;
  TS_CHECK(dim >= lo && dim <= hi, "[", op, "] dim ", dim, " out of range: expected [", lo, ", ",
           hi, "] for a ", ndim, "-dim tensor");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

}  // namespace tessera
