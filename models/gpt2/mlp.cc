#include "models/gpt2/mlp.h"

#include "autograd/ops.h"

namespace tessera {

Mlp::Mlp(const GptConfig& cfg, Generator& gen, parallel::Communicator& model_group,
         parallel::AsyncCollectives* async)
    : c_fc_(cfg.n_embd, 4 * cfg.n_embd, cfg.bias, model_group, /*gather_output=*/false,
            /*parts=*/1, DType::f32, async),
      c_proj_(4 * cfg.n_embd, cfg.n_embd, cfg.bias, model_group, /*input_is_parallel=*/true,
              DType::f32, async),
      dropout_(cfg.dropout, gen) {
  register_module("c_fc", c_fc_);
  register_module("c_proj", c_proj_);
  register_module("dropout", dropout_);
}

bool takes_fused_ops(const Tensor& x) { return x.device().is_cuda() && is_half(x.dtype()); }

Tensor Mlp::forward(const Tensor& x) const {
  const ModuleScope scope(*this);  // Note [Forward observers]
  if (takes_fused_ops(x))
    return dropout_.forward(c_proj_.reduce(parallel::gelu_mlp_partial(x, c_fc_, c_proj_)));
  return dropout_.forward(c_proj_(gelu(c_fc_(x))));
}

parallel::PendingSum Mlp::start(const Tensor& x) const {
  const ModuleScope scope(*this);
  if (takes_fused_ops(x))
    return c_proj_.start_reduce(parallel::gelu_mlp_partial(x, c_fc_, c_proj_));
  return c_proj_.start(gelu(c_fc_(x)));
}

Tensor Mlp::finish(const parallel::PendingSum& pending) const {
  const ModuleScope scope(*this);
  return dropout_.forward(c_proj_.finish(pending));
}

}  // namespace tessera
