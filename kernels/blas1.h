// Level-1 vector kernels: squared L2 norms, in-place scaling and accumulation (gradient
// clipping, gradient accumulation).
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

// sum(x^2) accumulated in f64 (non-finite when any element is inf or nan).
double squared_norm(const Tensor& x);  // (*) floating, any strides -> scalar
// x *= factor, in place; x contiguous floating.
void scale_(const Tensor& x, double factor);
// y += alpha * x, in place; y contiguous floating, x of y's dtype, device and shape (any
// strides).
void axpy_(const Tensor& y, const Tensor& x, double alpha = 1.0);

}  // namespace tessera::kernels
