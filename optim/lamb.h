// LAMB with DeepSpeed FusedLamb semantics (kernels/lamb.h): Adam's update scaled per
// parameter by the trust ratio |p| / |u|, clamped to [min_coeff, max_coeff].
#pragma once

#include "kernels/lamb.h"
#include "optim/optimizer.h"

namespace tessera::optim {

struct LambOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
};

// The fused kernel's parameters for step `step` (from 1) of group `g` under `options`.
kernels::LambParams lamb_kernel_params(const LambOptions& options, const ParamGroup& g,
                                       int64_t step);

class Lamb final : public Optimizer {
 public:
  Lamb(std::vector<ParamGroup> groups, LambOptions options);
  void step() override;
  std::string name() const override { return "Lamb"; }
  bool set_momentum(double beta1) override;
  // The trust ratio of each parameter at the last step, in group order (DeepSpeed's
  // get_lamb_coeffs()).
  const std::vector<double>& lamb_coeffs() const { return coeffs_; }

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  LambOptions options_;
  std::vector<double> coeffs_;
};

}  // namespace tessera::optim
