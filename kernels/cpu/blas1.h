// CPU norm kernels (see kernels/blas1.h).
#pragma once

#include "kernels/blas1.h"

namespace tessera::kernels::cpu {

double squared_norm(const Tensor& x);
void add_squared_norm(const Tensor& x, const Tensor& total);
Tensor clip_factor(const Tensor& squared_norm, double loss_scale, double max_norm,
                   bool overflow_skips);
void scale_(const Tensor& x, double factor);
// y and x contiguous.
void axpy_(const Tensor& y, const Tensor& x, double alpha);

}  // namespace tessera::kernels::cpu
