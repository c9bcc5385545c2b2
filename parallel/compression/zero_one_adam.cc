#include "parallel/compression/zero_one_adam.h"

#include <map>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"

namespace tessera::parallel {
namespace {

ZeroOneAdamSchedule fresh_schedule(const OneBitOptions& o) {
  return ZeroOneAdamSchedule(o.var_freeze_step, o.var_update_scaler, o.local_step_scaler,
                             o.local_step_clipper);
}

}  // namespace

ZeroOneAdam::ZeroOneAdam(std::vector<optim::ParamGroup> groups, Communicator& dp,
                         const optim::AdamOptions& adam, const OneBitOptions& onebit)
    : OneBitOptimizer(groups, dp, numel_per_group(groups)),
      adam_(adam),
      onebit_(onebit),
      schedule_(fresh_schedule(onebit)),
      lrs_(zeros({static_cast<int64_t>(groups_.size())}, {DType::f64})) {
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) anchors_.push_back(p.tensor.detach().clone());
  }
}

bool ZeroOneAdam::set_momentum(double beta1) {
  adam_.beta1 = beta1;
  return true;
}

const ZeroOneAdamSchedule& ZeroOneAdam::schedule() const {
  if (schedule_.step() > step_count()) schedule_ = fresh_schedule(onebit_);
  while (schedule_.step() < step_count()) schedule_.next();
  return schedule_;
}

bool ZeroOneAdam::reduce_gradients_next() const { return schedule().next_is_full_precision(); }

OneBitStep ZeroOneAdam::next_step_kind() const {
  ZeroOneAdamSchedule s = schedule();
  return s.next();
}

void ZeroOneAdam::step() {
  NoGradGuard no_grad;
  const bool was_frozen = schedule().variance_frozen();
  const OneBitStep kind = schedule_.next();
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    switch (kind) {
      case OneBitStep::full_precision:
        adam_step(groups_[gi], schedule_.step(), adam_);
        break;
      case OneBitStep::onebit_gradient:
        onebit_gradient_step(gi);
        break;
      case OneBitStep::local:
      case OneBitStep::local_sync:
        local_step(gi, kind == OneBitStep::local_sync);
        break;
      default:
        break;  // init
    }
  }
  // From now on the errors are those of the accumulated update, not of the gradient.
  if (!was_frozen && schedule_.variance_frozen()) OneBitOptimizer::reset_rank_state();
  advance();
}

void ZeroOneAdam::onebit_gradient_step(size_t gi) {
  const optim::ParamGroup& g = groups_[gi];
  std::vector<Tensor> grads;
  for (const NamedParameter& p : g.params) grads.push_back(grad_of(p));
  const FlatView flat_grads(grads);
  const Tensor averaged = flat_grads.gather();
  compressor(gi).run(averaged);
  int64_t offset = 0;
  for (const NamedParameter& p : g.params) {
    const Tensor ghat = averaged.narrow(0, offset, p.tensor.numel()).view(p.tensor.shape());
    offset += p.tensor.numel();
    momentum_update_(state("exp_avg", p), ghat, adam_.beta1);
    adam_update_(p.tensor, state("exp_avg", p), adam_denominator(state("exp_avg_sq", p), adam_.eps),
                 g.lr, g.weight_decay);
  }
}

void ZeroOneAdam::local_step(size_t gi, bool sync) {
  const optim::ParamGroup& g = groups_[gi];
  size_t first = 0;  // this group's first parameter in group order
  for (size_t i = 0; i < gi; ++i) first += groups_[i].params.size();
  double* lrs = lrs_.data_ptr<double>() + gi;
  // The first local step after a sync (or the switch) anchors the parameters.
  if (*lrs == 0.0) {
    for (size_t i = 0; i < g.params.size(); ++i) anchors_[first + i].copy_(g.params[i].tensor);
  }
  std::vector<Tensor> denoms;
  for (const NamedParameter& p : g.params) {
    denoms.push_back(adam_denominator(state("exp_avg_sq", p), adam_.eps));
    momentum_update_(state("exp_avg", p), grad_of(p), adam_.beta1);
    adam_update_(p.tensor, state("exp_avg", p), denoms.back(), g.lr, g.weight_decay);
  }
  *lrs += g.lr;
  if (!sync) return;
  // u = (p - anchor) (sqrt(v) + eps): minus the lr-weighted momentum sum since the anchor.
  std::vector<Tensor> updates;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const Tensor moved =
        kernels::binary(kernels::BinaryOp::sub, g.params[i].tensor, anchors_[first + i]);
    updates.push_back(kernels::binary(kernels::BinaryOp::mul, moved, denoms[i]));
  }
  const FlatView flat_updates(updates);
  const Tensor u = flat_updates.gather();
  compressor(gi).run(u);
  flat_updates.scatter(u);
  for (size_t i = 0; i < g.params.size(); ++i) {
    const NamedParameter& p = g.params[i];
    // m = -u / lrs; p = anchor + u / (sqrt(v) + eps).
    const Tensor& m = state("exp_avg", p);
    m.copy_(updates[i]);
    kernels::scale_(m, -1.0 / *lrs);
    p.tensor.copy_(anchors_[first + i]);
    kernels::axpy_(p.tensor, kernels::binary(kernels::BinaryOp::div, updates[i], denoms[i]));
  }
  *lrs = 0.0;
}

StateDict ZeroOneAdam::rank_state() const {
  StateDict out = OneBitOptimizer::rank_state();
  if (!schedule().variance_frozen()) return out;
  std::vector<const NamedParameter*> params;
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) params.push_back(&p);
  }
  // state() creates on first use; after the switch every momentum exists.
  const StateDict shared = state_dict();
  const std::map<std::string, Tensor> by_key(shared.begin(), shared.end());
  for (const NamedParameter* p : params) {
    out.emplace_back("exp_avg." + p->name, by_key.at("exp_avg." + p->name));
  }
  for (const NamedParameter* p : params) out.emplace_back("param." + p->name, p->tensor);
  for (size_t i = 0; i < params.size(); ++i) {
    out.emplace_back("anchor." + params[i]->name, anchors_[i]);
  }
  out.emplace_back("lrs", lrs_);
  return out;
}

void ZeroOneAdam::load_extra_rank_state(const StateDict& extra) {
  if (!schedule().variance_frozen()) return;  // the error buffers are all there is
  const std::map<std::string, Tensor> by_key(extra.begin(), extra.end());
  size_t i = 0;
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) {
      state("exp_avg", p).copy_(by_key.at("exp_avg." + p.name));
      p.tensor.copy_(by_key.at("param." + p.name));
      anchors_[i++].copy_(by_key.at("anchor." + p.name));
    }
  }
  lrs_.copy_(by_key.at("lrs"));
}

void ZeroOneAdam::reset_rank_state() {
  OneBitOptimizer::reset_rank_state();
  NoGradGuard no_grad;
  size_t i = 0;
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) anchors_[i++].copy_(p.tensor);
  }
  lrs_.fill_(0.0);
}

}  // namespace tessera::parallel
