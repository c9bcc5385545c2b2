// Validation and the device switch of the norm kernels.
#include "kernels/norm.h"

#include "kernels/checks.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {

double squared_norm(const Tensor& x) {
  check_defined("squared_norm", "x", x);
  check_floating("squared_norm", "x", x);
  if (x.device().is_cuda()) return cuda::squared_norm(x);
  return cpu::squared_norm(x);
}

void scale_(const Tensor& x, double factor) {
  check_defined("scale_", "x", x);
  check_floating("scale_", "x", x);
  TS_CHECK(x.is_contiguous(), "[scale_] expected a contiguous x, found strides ",
           shape_str(x.strides()), " for shape ", shape_str(x.shape()));
  if (x.device().is_cuda()) return cuda::scale_(x, factor);
  cpu::scale_(x, factor);
}

}  // namespace tessera::kernels
