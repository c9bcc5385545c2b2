#include "parallel/compression/onebit_adam.h"

#include "core/grad_mode.h"

namespace tessera::parallel {

OneBitAdam::OneBitAdam(std::vector<optim::ParamGroup> groups, Communicator& dp,
                       const optim::AdamOptions& adam, const OneBitOptions& onebit)
    : OneBitOptimizer(groups, dp, numel_per_group(groups)),
      adam_(adam),
      freeze_step_(onebit.freeze_step) {}

bool OneBitAdam::set_momentum(double beta1) {
  adam_.beta1 = beta1;
  return true;
}

OneBitStep OneBitAdam::next_step_kind() const {
  return onebit_adam_step(step_count() + 1, freeze_step_);
}

bool OneBitAdam::reduce_gradients_next() const {
  return next_step_kind() == OneBitStep::full_precision;
}

void OneBitAdam::step() {
  NoGradGuard no_grad;
  const OneBitStep kind = next_step_kind();
  const int64_t t = step_count() + 1;
  for (size_t gi = 0; gi < groups_.size() && kind != OneBitStep::init; ++gi) {
    const optim::ParamGroup& g = groups_[gi];
    if (kind == OneBitStep::full_precision) {
      adam_step(g, t, adam_);
      continue;
    }
    // Compressed: local momenta, averaged in 1 bit as one buffer; the variance is frozen.
    std::vector<Tensor> momenta;
    for (const NamedParameter& p : g.params) {
      momentum_update_(state("exp_avg", p), grad_of(p), adam_.beta1);
      momenta.push_back(state("exp_avg", p));
    }
    const FlatView flat_momenta(momenta);
    const Tensor flat = flat_momenta.gather();
    compressor(gi).run(flat);
    flat_momenta.scatter(flat);
    for (const NamedParameter& p : g.params) {
      adam_update_(p.tensor, state("exp_avg", p),
                   adam_denominator(state("exp_avg_sq", p), adam_.eps), g.lr, g.weight_decay);
    }
  }
  advance();
}

}  // namespace tessera::parallel
