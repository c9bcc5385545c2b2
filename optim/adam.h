// Adam/AdamW with DeepSpeed FusedAdam semantics (kernels/adamw.h).
#pragma once

#include "optim/optimizer.h"

namespace tessera::optim {

struct AdamOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool bias_correction = true;
  // DeepSpeed's default: "Adam" decays decoupled from the moments (AdamW) unless false,
  // which adds weight_decay * p to the gradient (classic L2 Adam).
  bool adam_w_mode = true;
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, AdamOptions options);
  void step() override;
  bool supports_parts() const override { return true; }
  void update_part(const ParamSelection& selected) override;
  bool supports_scaled_step() const override { return true; }
  void scaled_update(const ScaledStep& s) override;
  std::string name() const override { return options_.adam_w_mode ? "AdamW" : "Adam"; }
  bool set_momentum(double beta1) override;
  const AdamOptions& options() const { return options_; }

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  // The parameters `selected` accepts, updated with s's scale and copies.
  void update(const ParamSelection& selected, const ScaledStep& s);

  AdamOptions options_;
};

}  // namespace tessera::optim
