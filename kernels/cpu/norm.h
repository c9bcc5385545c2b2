// CPU norm kernels (see kernels/norm.h).
#pragma once

#include "kernels/norm.h"

namespace tessera::kernels::cpu {

double squared_norm(const Tensor& x);
void scale_(const Tensor& x, double factor);

}  // namespace tessera::kernels::cpu
