// GPT-2 feed-forward block: C -> 4C, GELU (tanh approximation), 4C -> C.
#pragma once

#include "autograd/module.h"
#include "models/gpt2/config.h"
#include "models/layers/dropout.h"
#include "models/layers/linear.h"

namespace tessera {

class Mlp : public Module {
 public:
  // Children "c_fc" and "c_proj"; dropout on the output draws from `gen`.
  Mlp(const GptConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)

 private:
  Linear c_fc_;
  Linear c_proj_;
  Dropout dropout_;
};

}  // namespace tessera
