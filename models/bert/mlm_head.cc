#include "models/bert/mlm_head.h"

#include "autograd/ops.h"
#include "core/factories.h"

namespace tessera {

BertMlmHead::Transform::Transform(const BertConfig& cfg)
    : dense(cfg.n_embd, cfg.n_embd), layer_norm(cfg.n_embd, cfg.layer_norm_eps) {
  register_module("dense", dense);
  register_module("LayerNorm", layer_norm);
}

BertMlmHead::BertMlmHead(const BertConfig& cfg)
    : transform_(cfg), bias_(zeros({cfg.padded_vocab_size()})) {
  register_module("transform", transform_);
  register_parameter("bias", bias_);
}

Tensor BertMlmHead::forward(const Tensor& x, const Embedding& word_embeddings) const {
  const ModuleCall call(*this);                                       // reads bias_
  const Tensor h = transform_.layer_norm(gelu(transform_.dense(x)));  // (B, T, C)
  // The decoder reads the word embedding's weight: a call on that module (its hooks).
  const ModuleCall tied(word_embeddings);
  return call.output(tied.output(linear(h, word_embeddings.weight(), bias_)));  // (B, T, Vp)
}

}  // namespace tessera
