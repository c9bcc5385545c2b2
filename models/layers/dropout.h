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
  // Whether forward() drops anything now: training, with p above 0.
  bool drops() const { return p_ > 0.0 && is_training(); }

 private:
  double p_;
  Generator* gen_;
};

}  // namespace tessera
