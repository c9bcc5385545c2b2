// Squared L2 norms and in-place scaling: the pieces of global-norm gradient clipping.
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

// sum(x^2) accumulated in f64 (non-finite when any element is inf or nan).
double squared_norm(const Tensor& x);  // (*) floating, any strides -> scalar
// x *= factor, in place; x contiguous floating.
void scale_(const Tensor& x, double factor);

}  // namespace tessera::kernels
