#include "parallel/compression/onebit_lamb.h"

#include <algorithm>
#include <cmath>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"
#include "kernels/lamb.h"
#include "kernels/reduce.h"

namespace tessera::parallel {
namespace {

using kernels::BinaryOp;

double norm(const Tensor& t) { return std::sqrt(kernels::squared_norm(t)); }

}  // namespace

OneBitLamb::OneBitLamb(std::vector<optim::ParamGroup> groups, Communicator& dp,
                       const optim::LambOptions& lamb, const OneBitOptions& onebit)
    : OneBitOptimizer(groups, dp, numel_of_all(groups)), lamb_(lamb), onebit_(onebit) {}

bool OneBitLamb::set_momentum(double beta1) {
  lamb_.beta1 = beta1;
  return true;
}

OneBitStep OneBitLamb::next_step_kind() const {
  return onebit_adam_step(step_count() + 1, onebit_.freeze_step);
}

bool OneBitLamb::reduce_gradients_next() const {
  return next_step_kind() == OneBitStep::full_precision;
}

float OneBitLamb::scalar(const std::string& kind, const NamedParameter& p, float initial) {
  if (!has_state(kind, p)) state(kind, p).fill_(initial);
  return state(kind, p).item<float>();
}

void OneBitLamb::step() {
  NoGradGuard no_grad;
  const OneBitStep kind = next_step_kind();
  const int64_t t = step_count() + 1;
  coeffs_.clear();
  if (kind == OneBitStep::full_precision) {
    for (const optim::ParamGroup& g : groups_) warmup_step(g, t);
  } else if (kind == OneBitStep::compressed) {
    compressed_step();
  }
  advance();
}

void OneBitLamb::warmup_step(const optim::ParamGroup& g, int64_t t) {
  // No bias correction and eps outside the root, whatever the options say (Note [1-bit
  // decisions]).
  kernels::LambParams lp = optim::lamb_kernel_params(lamb_, g, t);
  lp.bias_correction = false;
  lp.eps_inside_sqrt = false;
  for (const NamedParameter& p : g.params) {
    const double c =
        kernels::lamb_step(p.tensor, grad_of(p), state("exp_avg", p), state("exp_avg_sq", p), lp);
    if (t == onebit_.freeze_step) state("exp_avg_sq_fresh", p).copy_(state("exp_avg_sq", p));
    if (c != 1.0) {
      const double ema = onebit_.coeff_beta * scalar("lamb_coeff_freeze", p, 0.0f) +
                         (1.0 - onebit_.coeff_beta) * c;
      state("lamb_coeff_freeze", p).fill_(ema);
    }
    coeffs_.push_back(c);
  }
}

void OneBitLamb::set_scaling_coeffs() {
  std::vector<double> rms;
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) {
      rms.push_back(norm(state("exp_avg", p)) / std::sqrt(static_cast<double>(p.tensor.numel())));
    }
  }
  double united = 0.0;
  for (const double r : rms) united += r;
  united /= static_cast<double>(std::max<size_t>(rms.size(), 1));
  size_t i = 0;
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) {
      const double r = rms[i++];
      state("scaling_coeff", p).fill_(r > 0.0 ? united / r : 1.0);
    }
  }
}

void OneBitLamb::compressed_step() {
  std::vector<const NamedParameter*> params;
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) params.push_back(&p);
  }
  if (!params.empty() && !has_state("scaling_coeff", *params.front())) set_scaling_coeffs();
  // Local momenta, scaled to a common RMS, averaged in 1 bit as one buffer.
  std::vector<Tensor> last, momenta;
  for (const NamedParameter* p : params) {
    const Tensor& m = state("exp_avg", *p);
    last.push_back(m.clone());
    momentum_update_(m, grad_of(*p), lamb_.beta1);
    kernels::scale_(m, scalar("scaling_coeff", *p, 1.0f));
    momenta.push_back(m);
  }
  const FlatView flat_momenta(momenta);
  const Tensor flat = flat_momenta.gather();
  compressor(0).run(flat);
  flat_momenta.scatter(flat);

  size_t i = 0;
  for (const optim::ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) {
      const Tensor& m = state("exp_avg", p);
      kernels::scale_(m, 1.0 / scalar("scaling_coeff", p, 1.0f));
      // The averaged gradient the momentum's change implies: (m - beta1 m_last) / (1 - beta1);
      // it updates the fresh variance only.
      const Tensor ghat = m.clone();
      kernels::axpy_(ghat, last[i++], -lamb_.beta1);
      kernels::scale_(ghat, 1.0 / (1.0 - lamb_.beta1));
      if (!has_state("exp_avg_sq_fresh", p)) {
        state("exp_avg_sq_fresh", p).copy_(state("exp_avg_sq", p));
      }
      const Tensor& v_fresh = state("exp_avg_sq_fresh", p);
      kernels::scale_(v_fresh, lamb_.beta2);
      kernels::axpy_(v_fresh, kernels::binary(BinaryOp::mul, ghat, ghat), 1.0 - lamb_.beta2);

      const Tensor denom = adam_denominator(state("exp_avg_sq", p), lamb_.eps);
      const Tensor update_pre = kernels::binary(BinaryOp::div, m, denom);
      const Tensor update = update_pre.clone();
      if (g.weight_decay != 0.0) kernels::axpy_(update, p.tensor, g.weight_decay);
      const Tensor ratio =
          kernels::binary(BinaryOp::div, denom, adam_denominator(v_fresh, lamb_.eps));
      double factor = kernels::max(ratio.view({ratio.numel()}), 0, false).values.item<float>();
      if (g.weight_decay > 0.0) {
        const double update_norm = norm(update);
        const double r = update_norm > 0.0 ? std::min(1.0, norm(update_pre) / update_norm) : 1.0;
        factor = factor * r + (1.0 - r);
      }
      const double last_factor = scalar("last_factor", p, 1.0f);
      factor = std::clamp(factor, onebit_.factor_min, onebit_.factor_max);
      factor = std::clamp(factor, last_factor * (1.0 - onebit_.factor_threshold),
                          last_factor * (1.0 + onebit_.factor_threshold));
      state("last_factor", p).fill_(factor);
      const double c = scalar("lamb_coeff_freeze", p, 0.0f) * factor;
      kernels::axpy_(p.tensor, update, -g.lr * c);
      coeffs_.push_back(c);
    }
  }
}

}  // namespace tessera::parallel
