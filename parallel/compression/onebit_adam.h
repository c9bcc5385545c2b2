// 1-bit Adam (Tang et al., arXiv:2102.02888; DeepSpeed's OnebitAdam,
// deepspeed/runtime/fp16/onebit/adam.py).
//
// Step 1 initializes (Note [1-bit decisions]); steps 2..freeze_step are Adam without bias
// correction on gradients averaged in full precision; from freeze_step + 1 the variance is
// frozen and each step updates the momentum with this rank's local gradient, averages
// the momenta with the error-compensated 1-bit all-reduce (one buffer per parameter
// group), and applies p -= lr (m / (sqrt(v) + eps) + wd p). Every rank ends each step with
// the same momenta and parameters.
#pragma once

#include "parallel/compression/onebit_config.h"
#include "parallel/compression/onebit_optimizer.h"

namespace tessera::parallel {

class OneBitAdam final : public OneBitOptimizer {
 public:
  // adam: betas, eps (bias_correction is not applied); onebit: freeze_step.
  OneBitAdam(std::vector<optim::ParamGroup> groups, Communicator& dp,
             const optim::AdamOptions& adam, const OneBitOptions& onebit);
  void step() override;
  std::string name() const override { return "OneBitAdam"; }
  bool set_momentum(double beta1) override;
  bool reduce_gradients_next() const override;
  OneBitStep next_step_kind() const override;

 protected:
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  optim::AdamOptions adam_;
  int64_t freeze_step_;
};

}  // namespace tessera::parallel
