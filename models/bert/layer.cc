#include "models/bert/layer.h"

#include "autograd/ops.h"

namespace tessera {

BertOutput::BertOutput(int64_t in_features, const BertConfig& cfg, Generator& gen)
    : dense_(in_features, cfg.n_embd),
      layer_norm_(cfg.n_embd, cfg.layer_norm_eps),
      dropout_(cfg.dropout, gen) {
  register_module("dense", dense_);
  register_module("LayerNorm", layer_norm_);
  register_module("dropout", dropout_);
}

Tensor BertOutput::forward(const Tensor& h, const Tensor& residual, double divisor) const {
  const Tensor branch = dropout_.forward(dense_(h));
  return layer_norm_(residual + (divisor == 1.0 ? branch : branch / divisor));
}

BertLayer::Attention::Attention(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse,
                                uint64_t layout_seed)
    : self(cfg, sparse, layout_seed), output(cfg.n_embd, cfg, gen) {
  register_module("self", self);
  register_module("output", output);
}

BertLayer::Intermediate::Intermediate(const BertConfig& cfg)
    : dense(cfg.n_embd, cfg.intermediate_dim()) {
  register_module("dense", dense);
}

BertLayer::BertLayer(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse,
                     uint64_t layout_seed)
    : attention_(cfg, gen, sparse, layout_seed),
      intermediate_(cfg),
      output_(cfg.intermediate_dim(), cfg, gen) {
  register_module("attention", attention_);
  register_module("intermediate", intermediate_);
  register_module("output", output_);
}

Tensor BertLayer::forward(const Tensor& x, double divisor) const {
  const ModuleScope scope(*this);  // Note [Forward observers]
  const Tensor h = attention_.output.forward(attention_.self.forward(x), x, divisor);  // (B, T, C)
  return output_.forward(gelu(intermediate_.dense(h)), h, divisor);
}

}  // namespace tessera
