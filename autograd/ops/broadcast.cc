#include "autograd/ops/broadcast.h"

#include "kernels/reduce.h"

namespace tessera {

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  TS_INTERNAL_ASSERT(lead >= 0, "sum_to from ", shape_str(grad.shape()), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
  }
  Tensor summed = dims.empty() ? grad : kernels::sum(grad, dims, /*keepdim=*/true);
  return summed.reshape(shape);
}

}  // namespace tessera
