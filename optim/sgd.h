// SGD with momentum, PyTorch torch.optim.SGD semantics (kernels/sgd.h).
#pragma once

#include "optim/optimizer.h"

namespace tessera::optim {

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, SgdOptions options);
  void step() override;
  bool supports_parts() const override { return true; }
  void update_part(const ParamSelection& selected) override;
  std::string name() const override { return "SGD"; }
  bool set_momentum(double momentum) override;

 protected:
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }

 private:
  SgdOptions options_;
};

}  // namespace tessera::optim
