// SGD step with PyTorch torch.optim.SGD semantics (momentum, dampening, Nesterov).
#pragma once

#include "core/tensor.h"

namespace tessera::kernels {

struct SgdParams {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as the gradient (no dampening)
};

// In place: g' = g + wd p; with momentum: buf = first_step ? g' : momentum buf + (1-damp) g',
// d = nesterov ? g' + momentum buf : buf; else d = g'. p -= lr d. `momentum_buffer` may be
// undefined when momentum == 0; otherwise contiguous like param.
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdParams& p);

}  // namespace tessera::kernels
