// One expert of a mixture-of-experts layer: GPT-2's feed-forward block, C -> hidden, GELU
// (tanh approximation), hidden -> C, without tensor slicing or dropout.
#pragma once

#include "autograd/module.h"
#include "models/layers/linear.h"

namespace tessera::moe {

class ExpertMlp : public Layer {
 public:
  // Children "c_fc" (C -> hidden) and "c_proj" (hidden -> C), zero-initialized like Linear.
  ExpertMlp(int64_t n_embd, int64_t hidden, bool bias, DType dtype = DType::f32);

 protected:
  Tensor forward(const Tensor& x) const override;  // (..., C) -> (..., C)

 private:
  Linear c_fc_;
  Linear c_proj_;
};

}  // namespace tessera::moe
