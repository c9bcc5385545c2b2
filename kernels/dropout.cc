// Validation and the device switch of dropout.
#include "kernels/dropout.h"

#include "kernels/checks.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

void check_args(const char* op, const char* name, const Tensor& x, double p) {
  check_defined(op, name, x);
  check_floating(op, name, x);
  TS_CHECK(p >= 0.0 && p < 1.0, "[", op, "] expected p in [0, 1), found ", p);
}

}  // namespace

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  check_args("dropout", "x", x, p);
  if (p == 0.0) return x.detach().clone();
  if (x.device().is_cuda()) return cuda::dropout(x, p, seed, offset);
  return cpu::dropout(x, p, seed, offset);
}

Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed, uint64_t offset) {
  check_args("dropout_backward", "dy", dy, p);
  if (p == 0.0) return dy.detach().clone();
  if (dy.device().is_cuda()) return cuda::dropout_backward(dy, p, seed, offset);
  return cpu::dropout_backward(dy, p, seed, offset);
}

}  // namespace tessera::kernels
