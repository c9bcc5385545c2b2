#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {

Tensor widened(const Tensor& t) {
  if (!t.defined() || !is_half(t.dtype())) return t;
  return t.detach().to(DType::f32);
}

Tensor narrowed(const Tensor& t, DType dtype) {
  if (!t.defined() || !is_half(dtype)) return t;
  return t.to(dtype);
}

}  // namespace tessera::kernels::cpu
