#include "models/gpt2/block.h"

#include "autograd/ops.h"

namespace tessera {

Block::Block(const GptConfig& cfg, parallel::DropoutStreams& streams,
             parallel::Communicator& model_group, parallel::AsyncCollectives* async)
    : ln_1_(cfg.n_embd, cfg.layer_norm_eps, cfg.bias),
      attn_(cfg, streams, model_group, async),
      ln_2_(cfg.n_embd, cfg.layer_norm_eps, cfg.bias),
      mlp_(cfg, streams.replicated(), model_group, async) {
  register_module("ln_1", ln_1_);
  register_module("attn", attn_);
  register_module("ln_2", ln_2_);
  register_module("mlp", mlp_);
}

Tensor Block::forward(const Tensor& x) const {
  const Tensor h = x + attn_.forward(ln_1_(x));
  return h + mlp_.forward(ln_2_(h));
}

Tensor Block::forward_cached(const Tensor& x, Tensor& cache_k, Tensor& cache_v,
                             int64_t start) const {
  const Tensor h = x + attn_.forward_cached(ln_1_(x), cache_k, cache_v, start);
  return h + mlp_.forward(ln_2_(h));
}

}  // namespace tessera
