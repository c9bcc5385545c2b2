#include "kernels/reduce_dims.h"

#include "core/error.h"

namespace tessera::kernels {

std::vector<bool> reduced_dims_mask(const std::vector<int64_t>& dims, int64_t ndim,
                                    const char* op) {
  std::vector<bool> mask(static_cast<size_t>(ndim), dims.empty());
  for (int64_t dim : dims) {
    // A 0-dim tensor accepts dim 0 or -1 and has nothing to mark.
    const int64_t d = normalize_dim(dim, ndim, op);
    if (ndim == 0) continue;
    TS_CHECK(!mask[d], "[", op, "] expected distinct dims, found dim ", d, " twice in ",
             shape_str(dims));
    mask[d] = true;
  }
  return mask;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) {
      out.push_back(shape[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

int64_t reduced_count(const Shape& shape, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mask[d]) n *= shape[d];
  }
  return n;
}

}  // namespace tessera::kernels
