// Validation and the device switch of the softmax family.
#include "kernels/softmax.h"

#include "kernels/checks.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

void check_input(const char* op, const Tensor& x) {  // (..., V)
  check_defined(op, "x", x);
  check_floating(op, "x", x);
  TS_CHECK(x.dim() >= 1, "[", op, "] expected x with at least 1 dim, found ", shape_str(x.shape()));
}

void check_backward(const char* op, const Tensor& dy, const Tensor& y) {  // (..., V) x2
  check_defined(op, "dy", dy);
  check_defined(op, "y", y);
  check_floating(op, "y", y);
  check_same_dtype(op, "dy", dy, "y", y);
  check_same_device(op, "dy", dy, "y", y);
  check_same_shape(op, "dy", dy, "y", y);
  TS_CHECK(y.dim() >= 1, "[", op, "] expected y with at least 1 dim, found ", shape_str(y.shape()));
}

}  // namespace

Tensor softmax(const Tensor& x) {
  check_input("softmax", x);
  if (x.device().is_cuda()) return cuda::softmax(x);
  return cpu::softmax(x);
}

Tensor log_softmax(const Tensor& x) {
  check_input("log_softmax", x);
  if (x.device().is_cuda()) return cuda::log_softmax(x);
  return cpu::log_softmax(x);
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  check_backward("softmax_backward", dy, y);
  if (y.device().is_cuda()) return cuda::softmax_backward(dy, y);
  return cpu::softmax_backward(dy, y);
}

Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) {
  check_backward("log_softmax_backward", dy, y);
  if (y.device().is_cuda()) return cuda::log_softmax_backward(dy, y);
  return cpu::log_softmax_backward(dy, y);
}

}  // namespace tessera::kernels
