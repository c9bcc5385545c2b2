// Validation and the device switch of the SGD step.
#include "kernels/sgd.h"

#include "kernels/checks.h"
#include "kernels/cpu/sgd.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdParams& p) {
  constexpr const char* op = "sgd_step";
  check_defined(op, "param", param);
  check_floating(op, "param", param);
  check_like_param(op, param, "param", param);
  check_like_param(op, param, "grad", grad);
  if (p.momentum != 0.0) check_like_param(op, param, "momentum_buffer", momentum_buffer);
  TS_CHECK(!p.nesterov || (p.momentum > 0.0 && p.dampening == 0.0),
           "[sgd_step] Nesterov momentum requires momentum > 0 and dampening 0, found momentum ",
           p.momentum, ", dampening ", p.dampening);
  if (param.device().is_cuda()) return cuda::sgd_step(param, grad, momentum_buffer, p);
  cpu::sgd_step(param, grad, momentum_buffer, p);
}

}  // namespace tessera::kernels
