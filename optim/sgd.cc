#include "optim/sgd.h"

#include "kernels/sgd.h"

namespace tessera::optim {

Sgd::Sgd(std::vector<ParamGroup> groups, SgdOptions options)
    : Optimizer(std::move(groups)), options_(options) {}

bool Sgd::set_momentum(double momentum) {
  options_.momentum = momentum;
  return true;
}

void Sgd::step() {
  update_part([](const NamedParameter&) { return true; });
  advance();
}

void Sgd::update_part(const ParamSelection& selected) {
  for (const ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) {
      const Tensor grad = p.tensor.grad();
      if (!grad.defined() || !selected(p)) continue;
      kernels::SgdParams sp{g.lr,           options_.momentum, options_.dampening,
                            g.weight_decay, options_.nesterov, false};
      Tensor buffer;
      if (options_.momentum != 0.0) {
        sp.first_step = !has_state("momentum_buffer", p);
        buffer = state("momentum_buffer", p);
      }
      kernels::sgd_step(p.tensor, grad.contiguous(), buffer, sp);
    }
  }
}

}  // namespace tessera::optim
