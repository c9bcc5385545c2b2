#include "optim/lamb.h"

#include "kernels/lamb.h"

namespace tessera::optim {

Lamb::Lamb(std::vector<ParamGroup> groups, LambOptions options)
    : Optimizer(std::move(groups)), options_(options) {}

bool Lamb::set_momentum(double beta1) {
  options_.beta1 = beta1;
  return true;
}

void Lamb::step() {
  const int64_t t = step_count() + 1;
  coeffs_.clear();
  for (const ParamGroup& g : groups_) {
    kernels::LambParams lp;
    lp.lr = g.lr;
    lp.beta1 = options_.beta1;
    lp.beta2 = options_.beta2;
    lp.eps = options_.eps;
    lp.weight_decay = g.weight_decay;
    lp.step = t;
    lp.bias_correction = options_.bias_correction;
    lp.eps_inside_sqrt = options_.eps_inside_sqrt;
    lp.max_coeff = options_.max_coeff;
    lp.min_coeff = options_.min_coeff;
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
