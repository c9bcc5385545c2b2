// Validation and the device switch of the fused Adam/AdamW step.
#include "kernels/adamw.h"

#include "kernels/checks.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p) {
  check_defined("adamw_step", "param", param);
  check_floating("adamw_step", "param", param);
  check_like_param("adamw_step", param, "param", param);
  check_like_param("adamw_step", param, "grad", grad);
  check_like_param("adamw_step", param, "exp_avg", exp_avg);
  check_like_param("adamw_step", param, "exp_avg_sq", exp_avg_sq);
  TS_CHECK(!p.bias_correction || p.step >= 1,
           "[adamw_step] expected step >= 1 with bias correction, found ", p.step);
  if (param.device().is_cuda()) return cuda::adamw_step(param, grad, exp_avg, exp_avg_sq, p);
  cpu::adamw_step(param, grad, exp_avg, exp_avg_sq, p);
}

}  // namespace tessera::kernels
