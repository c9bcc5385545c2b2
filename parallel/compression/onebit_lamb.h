// 1-bit LAMB (Li et al., arXiv:2104.06069; DeepSpeed's OnebitLamb,
// deepspeed/runtime/fp16/onebit/lamb.py).
//
// Step 1 initializes (Note [1-bit decisions]). Steps 2..freeze_step are LAMB without bias
// correction on gradients averaged in full precision, keeping an EMA (coeff_beta) of the
// trust ratios, lamb_coeff_freeze; at freeze_step the variance is copied into a fresh
// variance v_f. Later steps are compressed: every parameter's momentum is updated with the
// local gradient and scaled by its scaling_coeff (fixed at the first compressed step so
// that all momenta have the same RMS), the momenta are averaged as one buffer by the 1-bit
// all-reduce and unscaled; the averaged gradient is reconstructed from the momentum's
// change and updates v_f only; the frozen trust ratio is rescaled by how much v_f has
// moved from v (the factor, clamped to [factor_min, factor_max] and to factor_threshold
// around the last one), and p -= lr lamb_coeff_freeze factor (m / (sqrt(v) + eps) + wd p).
//
// Tessera's choices beyond DeepSpeed's code: a parameter whose momentum RMS is zero at the
// first compressed step gets scaling_coeff 1 (DeepSpeed divides by zero), and the weight
// decay ratio min(1, |u_pre| / |u|) is 1 when |u| is zero.
#pragma once

#include "optim/lamb.h"
#include "parallel/compression/onebit_config.h"
#include "parallel/compression/onebit_optimizer.h"

namespace tessera::parallel {

class OneBitLamb final : public OneBitOptimizer {
 public:
  // lamb: betas, eps, max_coeff, min_coeff; onebit: freeze_step, coeff_beta, factor_max,
  // factor_min, factor_threshold.
  OneBitLamb(std::vector<optim::ParamGroup> groups, Communicator& dp,
             const optim::LambOptions& lamb, const OneBitOptions& onebit);
  void step() override;
  std::string name() const override { return "OneBitLamb"; }
  bool set_momentum(double beta1) override;
  bool reduce_gradients_next() const override;
  OneBitStep next_step_kind() const override;
  // The coefficient each parameter's update was scaled by at the last step, in group
  // order (DeepSpeed's get_lamb_coeffs()): the trust ratio during the warm-up,
  // lamb_coeff_freeze x factor once compressed.
  const std::vector<double>& lamb_coeffs() const { return coeffs_; }

 protected:
  std::vector<std::string> state_names() const override {
    return {"exp_avg",           "exp_avg_sq",  "exp_avg_sq_fresh",
            "lamb_coeff_freeze", "last_factor", "scaling_coeff"};
  }
  bool scalar_state(const std::string& kind) const override {
    return kind == "lamb_coeff_freeze" || kind == "last_factor" || kind == "scaling_coeff";
  }

 private:
  void warmup_step(const optim::ParamGroup& g, int64_t t);
  void compressed_step();
  // DeepSpeed's scaling_coeff: mean RMS over the parameters' momenta / each one's RMS.
  void set_scaling_coeffs();
  // A scalar state's value (its initial value when it does not exist yet).
  float scalar(const std::string& kind, const NamedParameter& p, float initial);

  optim::LambOptions lamb_;
  OneBitOptions onebit_;
  std::vector<double> coeffs_;
};

}  // namespace tessera::parallel
