// BERT's bidirectional multi-head self-attention core: fused QKV projection, heads, dense
// or block-sparse attention. The output projection, dropout, residual and LayerNorm are
// the layer's (models/bert/layer.h), as in Hugging Face's BertSelfAttention.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/module.h"
#include "models/bert/config.h"
#include "models/layers/linear.h"
#include "models/sparse/sparse_self_attention.h"
#include "models/sparse/sparsity_config.h"

namespace tessera {

// Note [Fused BERT QKV]
// Hugging Face's BertSelfAttention has three Linears, query, key and value (C -> C each).
// Tessera fuses them into one "qkv" Linear (C -> 3C, rows q, k, v in that order; one GEMM
// instead of three), so the parameter is attention.self.qkv.{weight,bias}: a Hugging Face
// checkpoint maps onto it by concatenating query, key and value along dim 0.
//
// Note [BERT attention dropout]
// Hugging Face also drops attention probabilities (attention_probs_dropout_prob). Tessera
// does not: the block-sparse path never materializes the probabilities, and keeping the
// two paths the same function lets a dense-mode sparsity config be checked against the
// dense model. Dropout still acts on the embeddings and on both residual branches.
class BertSelfAttention : public Module {
 public:
  // Child "qkv" (Note [Fused BERT QKV]). With `sparse` (not null; bidirectional), the
  // attention runs through a block-sparse layer whose master layout is built at
  // cfg.block_size positions with random blocks drawn from `layout_seed`; otherwise it is
  // the dense softmax(q k^T / sqrt(D)) v over all positions.
  BertSelfAttention(const BertConfig& cfg, const SparsityConfig* sparse, uint64_t layout_seed);

  // Every position attends to every position (no causal mask).
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C), heads merged

  // The block-sparse layer, or null on the dense path.
  const SparseSelfAttention* sparse() const { return sparse_.get(); }

 private:
  int64_t n_head_;
  Linear qkv_;
  std::unique_ptr<SparseSelfAttention> sparse_;  // null: dense attention
};

}  // namespace tessera
