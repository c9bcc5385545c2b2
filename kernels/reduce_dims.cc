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

ReduceBlock reduce_block_layout(const Tensor& x, const std::vector<bool>& mask) {
  const Tensor xd = x.detach();
  const Shape& shape = xd.shape();
  enum { before, in, after } state = before;
  bool one_run = true;
  ReduceBlock b;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mask[d]) b.reduced *= shape[d];
    if (shape[d] == 1) continue;
    if (mask[d]) {
      one_run = one_run && state != after;
      state = in;
    } else {
      if (state == in) state = after;
      (state == before ? b.outer : b.inner) *= shape[d];
    }
  }
  if (one_run && xd.is_contiguous()) {
    b.data = xd;
    return b;
  }
  std::vector<int64_t> perm;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) perm.push_back(static_cast<int64_t>(d));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mask[d]) perm.push_back(static_cast<int64_t>(d));
  }
  b.data = xd.permute(perm).contiguous();
  b.outer *= b.inner;
  b.inner = 1;
  return b;
}

}  // namespace tessera::kernels
