#include "models/moe/expert_mlp.h"

#include "autograd/ops.h"

namespace tessera::moe {

ExpertMlp::ExpertMlp(int64_t n_embd, int64_t hidden, bool bias, DType dtype)
    : c_fc_(n_embd, hidden, bias, dtype), c_proj_(hidden, n_embd, bias, dtype) {
  register_module("c_fc", c_fc_);
  register_module("c_proj", c_proj_);
}

Tensor ExpertMlp::forward(const Tensor& x) const { return c_proj_(gelu(c_fc_(x))); }

}  // namespace tessera::moe
