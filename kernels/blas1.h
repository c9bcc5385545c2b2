// Level-1 vector kernels: squared L2 norms, in-place scaling and accumulation (gradient
// clipping, gradient accumulation).
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

// sum(x^2) accumulated in f64 (non-finite when any element is inf or nan).
double squared_norm(const Tensor& x);  // (*) floating, any strides -> scalar
// total += squared_norm(x), where total lies (a 0-dim f64 tensor on x's device): on a GPU
// the sum stays on the device, with no host read. The same bits as adding squared_norm(x)
// to total's value on the host.
void add_squared_norm(const Tensor& x, const Tensor& total);  // (*), () f64
// Note [Clip factor] (kernels/clip_factor.h) from a squared global norm (a 0-dim f64
// tensor), computed on its device: (2) f64 {factor, norm}, factor NaN where
// `overflow_skips` and the norm is not finite. loss_scale > 0.
Tensor clip_factor(const Tensor& squared_norm, double loss_scale, double max_norm,
                   bool overflow_skips);  // () f64 -> (2) f64
// x *= factor, in place; x contiguous floating.
void scale_(const Tensor& x, double factor);
// y += alpha * x, in place; y contiguous floating, x of y's dtype, device and shape (any
// strides).
void axpy_(const Tensor& y, const Tensor& x, double alpha = 1.0);

}  // namespace tessera::kernels
