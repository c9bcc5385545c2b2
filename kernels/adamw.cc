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

// Entry i's model copy: present when the first entry's is, f16 or bf16 like it, shaped like
// the f32 parameter, contiguous, on its device.
void check_model_copy(const AdamWTensors& t, const Tensor& first_copy, size_t i) {
  const Tensor& copy = t.model_copy;
  TS_CHECK(copy.defined() == first_copy.defined(), "[adamw_step] expected ",
           first_copy.defined() ? "a model copy for every tensor" : "no model copies",
           ", found tensor ", i, (copy.defined() ? " with one" : " without one"));
  if (!copy.defined()) return;
  TS_CHECK(is_half(copy.dtype()) && copy.dtype() == first_copy.dtype() &&
               t.param.dtype() == DType::f32 && copy.shape() == t.param.shape() &&
               copy.device() == t.param.device() && copy.is_contiguous(),
           "[adamw_step] expected tensor ", i, "'s model copy a contiguous ",
           dtype_name(first_copy.dtype()), " tensor of its f32 parameter's shape ",
           shape_str(t.param.shape()), " on ", t.param.device().str(), ", found ", copy.str(),
           " for a ", dtype_name(t.param.dtype()), " parameter");
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

void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& p,
                const Tensor& grad_scale) {
  check_step(p);
  if (tensors.empty()) return;
  const Tensor& first = tensors.front().param;
  const Tensor& first_copy = tensors.front().model_copy;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensors& t = tensors[i];
    check_operands(t.param, t.grad, t.exp_avg, t.exp_avg_sq);
    TS_CHECK(t.param.device() == first.device() && t.param.dtype() == first.dtype(),
             "[adamw_step] expected every tensor on ", first.device(), " in ",
             dtype_name(first.dtype()), ", found tensor ", i, " on ", t.param.device(), " in ",
             dtype_name(t.param.dtype()));
    check_model_copy(t, first_copy, i);
  }
  if (grad_scale.defined()) {
    TS_CHECK(grad_scale.numel() == 1 && grad_scale.dtype() == DType::f64 &&
                 grad_scale.device() == first.device() &&
                 (first.dtype() == DType::f32 || first.dtype() == DType::f64),
             "[adamw_step] expected grad_scale one f64 element on ", first.device().str(),
             " with f32 or f64 parameters, found ", grad_scale.str(), " with ",
             dtype_name(first.dtype()), " parameters");
  }
  if (first.device().is_cuda()) return cuda::adamw_step(tensors, p, grad_scale);
  cpu::adamw_step(tensors, p, grad_scale);
}

}  // namespace tessera::kernels
