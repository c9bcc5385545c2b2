// Validation and the device switch of the fused Adam/AdamW step.
#include "kernels/adamw.h"

#include "kernels/checks.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {

namespace {

void check_operands(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq) {
  check_defined("adamw_step", "param", param);
  check_floating("adamw_step", "param", param);
  check_like_param("adamw_step", param, "param", param);
  check_like_param("adamw_step", param, "grad", grad);
  check_like_param("adamw_step", param, "exp_avg", exp_avg);
  check_like_param("adamw_step", param, "exp_avg_sq", exp_avg_sq);
}

void check_step(const AdamWParams& p) {
  TS_CHECK(!p.bias_correction || p.step >= 1,
           "[adamw_step] expected step >= 1 with bias correction, found ", p.step);
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p) {
  check_operands(param, grad, exp_avg, exp_avg_sq);
  check_step(p);
  if (param.device().is_cuda()) return cuda::adamw_step(param, grad, exp_avg, exp_avg_sq, p);
  cpu::adamw_step(param, grad, exp_avg, exp_avg_sq, p);
}

void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& p) {
  check_step(p);
  if (tensors.empty()) return;
  const Tensor& first = tensors.front().param;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensors& t = tensors[i];
    check_operands(t.param, t.grad, t.exp_avg, t.exp_avg_sq);
    TS_CHECK(t.param.device() == first.device() && t.param.dtype() == first.dtype(),
             "[adamw_step] expected every tensor on ", first.device(), " in ",
             dtype_name(first.dtype()), ", found tensor ", i, " on ", t.param.device(), " in ",
             dtype_name(t.param.dtype()));
  }
  if (first.device().is_cuda()) return cuda::adamw_step(tensors, p);
  cpu::adamw_step(tensors, p);
}

}  // namespace tessera::kernels
