// One pre-LayerNorm GPT-2 transformer block.
#pragma once

#include "autograd/module.h"
#include "models/gpt2/attention.h"
#include "models/gpt2/config.h"
#include "models/gpt2/mlp.h"
#include "models/layers/layer_norm.h"
#include "models/moe/moe_layer.h"

namespace tessera {

class Block : public Module {
 public:
  // Children "ln_1", "attn", "ln_2", "mlp" (Hugging Face names); dropout draws from
  // `streams`; attention heads and the MLP's hidden features are split over `model_group`,
  // with `async` (collectives over it) for the column-parallel input gradients (Note
  // [Overlapped input gradients] in parallel/tensor/layers.h). Block `layer` of a model
  // with cfg.moe has a mixture of experts as its "mlp" where cfg.moe says so (Note
  // [GPT-MoE] in moe_config.h), routing with noise from streams.replicated().
  // An MoE block holds its share of the experts of `expert_group` (null: all of them).
  Block(const GptConfig& cfg, int64_t layer, parallel::DropoutStreams& streams,
        parallel::Communicator& model_group, parallel::AsyncCollectives* async = nullptr,
        parallel::Communicator* expert_group = nullptr);
  // x + attn(ln_1(x)), then + mlp(ln_2(.)) (on CUDA in 16 bits, the first sum and ln_2 as one
  // op: Note [Residual layer norm] in kernels/cuda/layer_norm.cu), each sub-block's output
  // divided by `divisor`
  // (progressive layer drop's scale; 1: none). An MoE block appends its gate's
  // load-balancing loss and routing to `moe_out` (when given; the output left undefined).
  Tensor forward(const Tensor& x, std::vector<moe::MoeOutput>* moe_out = nullptr,
                 double divisor = 1.0) const;  // (B, T, C) -> (B, T, C)
  // forward() cut around its two row-parallel sums over the model group, for Note
  // [Batch-split overlap] in models/gpt2/batch_split.h. Sub-layer 0 is the attention, 1 the
  // MLP: start_sublayer(s, x) runs its LayerNorm and its products on x up to the sum, which
  // it starts; finish_sublayer(s, x, pending, divisor) waits for the sum and returns
  // x + its output / divisor. forward(x, nullptr, d) is finish(1, h, start(1, h), d) of
  // h = finish(0, x, start(0, x), d). Needs a dense block built with `async`.
  parallel::PendingSum start_sublayer(int sublayer, const Tensor& x) const;  // (B, T, C) ->
  Tensor finish_sublayer(int sublayer, const Tensor& x, const parallel::PendingSum& pending,
                         double divisor) const;  // (B, T, C), pending (B, T, C) -> (B, T, C)
  // forward() for inference with a KV cache (see CausalSelfAttention::forward_cached).
  Tensor forward_cached(const Tensor& x, Tensor& cache_k, Tensor& cache_v,
                        int64_t start) const;  // (B, T, C) -> (B, T, C)
  // An MoE block's layer; null in a dense block.
  moe::MoeLayer* moe() { return moe_.get(); }

 private:
  LayerNorm ln_1_;
  CausalSelfAttention attn_;
  LayerNorm ln_2_;
  std::unique_ptr<Mlp> mlp_;            // a dense block's
  std::unique_ptr<moe::MoeLayer> moe_;  // an MoE block's

  // The MLP's output for h (B, T, C).
  Tensor feed_forward(const Tensor& h, std::vector<moe::MoeOutput>* moe_out) const;
};

}  // namespace tessera
