#include "optim/adam.h"

#include <vector>

#include "kernels/adamw.h"

namespace tessera::optim {

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options)
    : Optimizer(std::move(groups)), options_(options) {}

bool Adam::set_momentum(double beta1) {
  options_.beta1 = beta1;
  return true;
}

void Adam::step() {
  update_part([](const NamedParameter&) { return true; });
  advance();
}

void Adam::update_part(const ParamSelection& selected) { update(selected, ScaledStep{}); }

void Adam::scaled_update(const ScaledStep& s) {
  update([](const NamedParameter&) { return true; }, s);
}

void Adam::update(const ParamSelection& selected, const ScaledStep& s) {
  const int64_t t = step_count() + 1;
  for (const ParamGroup& g : groups_) {
    const kernels::AdamWParams ap{
        g.lr, options_.beta1,           options_.beta2,      options_.eps, g.weight_decay,
        t,    options_.bias_correction, options_.adam_w_mode};
    // One multi-tensor step per group: a few launches for all its parameters on CUDA.
    std::vector<kernels::AdamWTensors> tensors;
    for (const NamedParameter& p : g.params) {
      const Tensor grad = p.tensor.grad();
      if (!grad.defined() || !selected(p)) continue;
      tensors.push_back({p.tensor, grad.contiguous(), state("exp_avg", p), state("exp_avg_sq", p),
                         s.model_copy ? s.model_copy(p) : Tensor()});
    }
    if (!tensors.empty()) kernels::adamw_step(tensors, ap, s.grad_scale);
  }
}

}  // namespace tessera::optim
