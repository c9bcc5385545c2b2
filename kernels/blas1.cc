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

namespace {

// A 0-dim f64 tensor on `device`, for the norms' device sums.
void check_f64_scalar(const char* op, const char* name, const Tensor& t, Device device) {
  check_defined(op, name, t);
  TS_CHECK(t.dim() == 0 && t.dtype() == DType::f64 && t.device() == device && t.is_contiguous(),
           "[", op, "] expected ", name, " a 0-dim f64 tensor on ", device.str(), ", found ",
           t.str());
}

}  // namespace

void add_squared_norm(const Tensor& x, const Tensor& total) {
  check_defined("add_squared_norm", "x", x);
  check_floating("add_squared_norm", "x", x);
  check_f64_scalar("add_squared_norm", "total", total, x.device());
  if (x.device().is_cuda()) return cuda::add_squared_norm(x, total);
  cpu::add_squared_norm(x, total);
}

Tensor clip_factor(const Tensor& squared_norm, double loss_scale, double max_norm,
                   bool overflow_skips) {
  check_f64_scalar("clip_factor", "squared_norm", squared_norm, squared_norm.device());
  TS_CHECK(loss_scale > 0, "[clip_factor] expected a loss scale > 0, found ", loss_scale);
  if (squared_norm.device().is_cuda()) {
    return cuda::clip_factor(squared_norm, loss_scale, max_norm, overflow_skips);
  }
  return cpu::clip_factor(squared_norm, loss_scale, max_norm, overflow_skips);
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
