// Validation and the device switch of the level-1 vector kernels.
#include "kernels/blas1.h"

#include "kernels/checks.h"
#include "kernels/cpu/blas1.h"
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

void axpy_(const Tensor& y, const Tensor& x, double alpha) {
  check_defined("axpy_", "y", y);
  check_floating("axpy_", "y", y);
  check_defined("axpy_", "x", x);
  check_same_dtype("axpy_", "y", y, "x", x);
  check_same_device("axpy_", "y", y, "x", x);
  check_same_shape("axpy_", "y", y, "x", x);
  TS_CHECK(y.is_contiguous(), "[axpy_] expected a contiguous y, found strides ",
           shape_str(y.strides()), " for shape ", shape_str(y.shape()));
  if (y.device().is_cuda()) return cuda::axpy_(y, x, alpha);
  cpu::axpy_(y, x.contiguous(), alpha);
}

}  // namespace tessera::kernels
