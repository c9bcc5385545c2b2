// GPT-2 causal self-attention: one fused QKV projection, heads, output projection.
#pragma once

#include "autograd/module.h"
#include "models/gpt2/config.h"
#include "models/layers/dropout.h"
#include "models/sparse/sparse_self_attention.h"
#include "parallel/comm/communicator.h"
#include "parallel/tensor/dropout_streams.h"
#include "parallel/tensor/layers.h"

namespace tessera {

// Note [Sparse GPT attention]
// With a sparsity config every block builds the same layout (random blocks from one seed
// derived from the model's), as DeepSpeed's class-wide op cache makes all its layers share
// the first layer's layout; queries also never see later keys inside a block. Generation
// with a KV cache applies the same layout as an element mask, so a model samples with the
// attention it was trained with. Under tensor slicing every rank holds heads of one
// shared layout (per-head layouts are refused by the run config).
// Note [Attention dropout]
// With cfg.attention_probs_dropout() above 0, training drops attention probabilities, as
// Hugging Face's GPT2Attention (attn_dropout) and Megatron's CoreAttention do. The fused
// attention kernels drop them inside their tiles, with the mask attn_dropout_ would draw
// for the (B, H, T, T) probabilities (Note [Attention-probability dropout] in
// kernels/attention.h), so no (B, H, T, T) tensor is kept for backward. The
// probabilities are of this rank's heads only, so their masks come from the sliced stream
// (Note [Model-parallel dropout] in parallel/tensor/dropout_streams.h); the output's
// dropout, after c_proj's all-reduce, from the replicated one.
class CausalSelfAttention : public Module {
 public:
  // Children "c_attn" (C -> 3C: q, k, v in that order), "attn_dropout", "c_proj" (C -> C)
  // and "resid_dropout" (Hugging Face's names). The heads are split over the
  // model-parallel group `model_group` (Note [Tensor-parallel GPT] in models/gpt2/gpt.h):
  // c_attn is column-parallel (each rank's q, k and v rows), c_proj row-parallel. With
  // cfg.sparse_attention the heads attend through its block-sparse layout (Note [Sparse GPT
  // attention]). Dropout draws from `streams` (Note [Attention dropout]). With `async`
  // (collectives over the group) c_attn's input gradient is summed under its weight
  // gradient's product (Note [Overlapped input gradients] in parallel/tensor/layers.h), and
  // start() and finish() may be used.
  CausalSelfAttention(const GptConfig& cfg, parallel::DropoutStreams& streams,
                      parallel::Communicator& model_group,
                      parallel::AsyncCollectives* async = nullptr);

  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)
  // forward() in two calls around c_proj's sum over the group (Note [Batch-split overlap]
  // in models/gpt2/batch_split.h): start() runs up to the sum, started; finish() waits for
  // it and applies c_proj's bias and the output's dropout. Needs `async`.
  parallel::PendingSum start(const Tensor& x) const;         // (B, T, C) -> pending (B, T, C)
  Tensor finish(const parallel::PendingSum& pending) const;  // -> (B, T, C)
  // Inference over new positions [cache_k/v length, + T): appends their keys and values
  // at `start` in the (B, H, capacity, D) buffers and attends over all cached positions.
  Tensor forward_cached(const Tensor& x, Tensor& cache_k, Tensor& cache_v,
                        int64_t start) const;  // (B, T, C) -> (B, T, C)

 private:
  // (B, T, C) -> q, k, v each (B, H, T, D), H this rank's heads.
  std::vector<Tensor> heads(const Tensor& x) const;
  Tensor merge_heads(const Tensor& y) const;  // (B, H, T, D) -> (B, T, H D)
  // The heads' attention over x, merged: what c_proj takes. (B, T, C) -> (B, T, H D)
  Tensor mixed(const Tensor& x) const;
  // Unfused attention (generation's, over cached keys): softmax(q k^T / sqrt(D)) over the
  // keys `visible` marks (undefined: all; else bool (heads or 1, T, S)), its probabilities
  // through attn_dropout_, times v. q (B, H, T, D), k and v (B, H, S, D) -> (B, H, T, D).
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& visible) const;
  // The keys new rows see, on `device`: row i sits at position start + i and sees keys
  // s <= start + i (and, sparse, those of its layout: Note [Sparse GPT attention]); bool
  // (heads or 1, t, start + t).
  Tensor visible_keys(int64_t t, int64_t start, Device device) const;

  int64_t n_head_;                               // this rank's heads
  std::unique_ptr<SparseSelfAttention> sparse_;  // null: dense causal attention
  parallel::ColumnParallelLinear c_attn_;
  Dropout attn_dropout_;
  parallel::RowParallelLinear c_proj_;
  Dropout resid_dropout_;
};

}  // namespace tessera
