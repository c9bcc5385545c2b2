// Validation and the device switch of the fused Adam/AdamW step.
#include "kernels/adamw.h"

#include "kernels/checks.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

// `name` is a contiguous tensor of param's dtype, device and shape.
void check_like_param(const Tensor& param, const char* name, const Tensor& t) {
  constexpr const char* op = "adamw_step";
  check_defined(op, name, t);
  check_same_dtype(op, "param", param, name, t);
  check_same_device(op, "param", param, name, t);
  check_same_shape(op, "param", param, name, t);
  TS_CHECK(t.is_contiguous(), "[adamw_step] expected a contiguous ", name, ", found strides ",
           shape_str(t.strides()), " for shape ", shape_str(t.shape()));
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p) {
  check_defined("adamw_step", "param", param);
  check_floating("adamw_step", "param", param);
  check_like_param(param, "param", param);
  check_like_param(param, "grad", grad);
  check_like_param(param, "exp_avg", exp_avg);
  check_like_param(param, "exp_avg_sq", exp_avg_sq);
  TS_CHECK(!p.bias_correction || p.step >= 1,
           "[adamw_step] expected step >= 1 with bias correction, found ", p.step);
  if (param.device().is_cuda()) return cuda::adamw_step(param, grad, exp_avg, exp_avg_sq, p);
  cpu::adamw_step(param, grad, exp_avg, exp_avg_sq, p);
}

}  // namespace tessera::kernels
