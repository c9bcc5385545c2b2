// CPU SGD step (see kernels/sgd.h).
#pragma once

#include "kernels/sgd.h"

namespace tessera::kernels::cpu {

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdParams& p);

}  // namespace tessera::kernels::cpu
