// Dropout layer: active in training mode, identity in eval mode.
#pragma once

#include "autograd/module.h"
#include "core/philox.h"

namespace tessera {

class Dropout : public Module {
 public:
  // Masks are drawn from `gen`, which must outlive the layer (one stream per model, so
  // that activation checkpointing can rewind it).
  Dropout(double p, Generator& gen);
  Tensor forward(const Tensor& x) const;  // (*) -> (*)
  double p() const { return p_; }
  // The stream masks are drawn from, for ops that drop inside a fused kernel (the attention
  // probabilities' dropout, autograd/ops/nn.h).
  Generator& generator() const { return *gen_; }

 private:
  double p_;
  Generator* gen_;
};

}  // namespace tessera
