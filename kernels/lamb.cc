// Validation and the device switch of the fused LAMB step.
#include "kernels/lamb.h"

#include "kernels/checks.h"
#include "kernels/cpu/lamb.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {

double lamb_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq, const LambParams& p) {
  constexpr const char* op = "lamb_step";
  check_defined(op, "param", param);
  check_floating(op, "param", param);
  check_like_param(op, param, "param", param);
  check_like_param(op, param, "grad", grad);
  check_like_param(op, param, "exp_avg", exp_avg);
  check_like_param(op, param, "exp_avg_sq", exp_avg_sq);
  TS_CHECK(!p.bias_correction || p.step >= 1,
           "[lamb_step] expected step >= 1 with bias correction, found ", p.step);
  TS_CHECK(p.min_coeff <= p.max_coeff, "[lamb_step] expected min_coeff <= max_coeff, found ",
           p.min_coeff, " > ", p.max_coeff);
  if (param.device().is_cuda()) return cuda::lamb_step(param, grad, exp_avg, exp_avg_sq, p);
  return cpu::lamb_step(param, grad, exp_avg, exp_avg_sq, p);
}

}  // namespace tessera::kernels
