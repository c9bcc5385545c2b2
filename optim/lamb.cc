#include "optim/lamb.h"

namespace tessera::optim {

Lamb::Lamb(std::vector<ParamGroup> groups, LambOptions options)
    : Optimizer(std::move(groups)), options_(options) {}

bool Lamb::set_momentum(double beta1) {
  options_.beta1 = beta1;
  return true;
}

kernels::LambParams lamb_kernel_params(const LambOptions& options, const ParamGroup& g,
                                       int64_t step) {
  kernels::LambParams lp;
  lp.lr = g.lr;
  lp.beta1 = options.beta1;
  lp.beta2 = options.beta2;
  lp.eps = options.eps;
  lp.weight_decay = g.weight_decay;
  lp.step = step;
  lp.bias_correction = options.bias_correction;
  lp.eps_inside_sqrt = options.eps_inside_sqrt;
  lp.max_coeff = options.max_coeff;
  lp.min_coeff = options.min_coeff;
  return lp;
}

void Lamb::step() {
  const int64_t t = step_count() + 1;
  coeffs_.clear();
  for (const ParamGroup& g : groups_) {
    const kernels::LambParams lp = lamb_kernel_params(options_, g, t);
    for (const NamedParameter& p : g.params) {
      const Tensor grad = p.tensor.grad();
      if (!grad.defined()) continue;
      coeffs_.push_back(kernels::lamb_step(p.tensor, grad.contiguous(), state("exp_avg", p),
                                           state("exp_avg_sq", p), lp));
    }
  }
  advance();
}

}  // namespace tessera::optim
