// Validation and the device switch of the reduce family; mean and argmax are composed.
#include "kernels/reduce.h"

#include "core/factories.h"
#include "kernels/checks.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/kernels.h"
#include "kernels/elementwise.h"
#include "kernels/reduce_dims.h"

namespace tessera::kernels {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {  // (*) -> (*r)
  check_defined("sum", "x", x);
  check_floating("sum", "x", x);
  reduced_dims_mask(dims, x.dim(), "sum");
  if (x.device().is_cuda()) return cuda::sum(x, dims, keepdim);
  return cpu::sum(x, dims, keepdim);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {  // (*) -> (*r)
  check_defined("mean", "x", x);
  check_floating("mean", "x", x);
  const int64_t count = reduced_count(x.shape(), reduced_dims_mask(dims, x.dim(), "mean"));
  const Tensor total = sum(x, dims, keepdim);
  // An empty reduction divides 0 by 0 and gives NaN, as torch.mean.
  return binary(BinaryOp::div, total,
                scalar_tensor(static_cast<double>(count), {total.dtype(), total.device()}));
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction,
           bool keepdim) {  // (*) -> (*r)
  check_defined("var", "x", x);
  check_floating("var", "x", x);
  reduced_dims_mask(dims, x.dim(), "var");
  TS_CHECK(correction >= 0, "[var] expected a non-negative correction, found ", correction);
  if (x.device().is_cuda()) return cuda::var(x, dims, correction, keepdim);
  return cpu::var(x, dims, correction, keepdim);
}

MaxResult max(const Tensor& x, int64_t dim, bool keepdim) {  // (*) -> (*r), (*r) i64
  check_defined("max", "x", x);
  check_floating("max", "x", x);
  const int64_t d = normalize_dim(dim, x.dim(), "max");
  TS_CHECK(x.dim() == 0 || x.size(d) > 0, "[max] expected a non-empty dim ", d, ", found ",
           shape_str(x.shape()));
  if (x.device().is_cuda()) return cuda::max(x, dim, keepdim);
  return cpu::max(x, dim, keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {  // (*) -> (*r) i64
  return max(x, dim, keepdim).indices;
}

}  // namespace tessera::kernels
