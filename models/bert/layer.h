// One post-LayerNorm BERT encoder layer, with Hugging Face BertLayer's children:
//
//   attention.self.qkv            (C -> 3C; Note [Fused BERT QKV] in attention.h)
//   attention.output.dense        (C -> C)   attention.output.LayerNorm
//   intermediate.dense            (C -> I)
//   output.dense                  (I -> C)   output.LayerNorm
#pragma once

#include <cstdint>

#include "autograd/module.h"
#include "core/philox.h"
#include "models/bert/attention.h"
#include "models/bert/config.h"
#include "models/layers/dropout.h"
#include "models/layers/layer_norm.h"
#include "models/layers/linear.h"

namespace tessera {

// A residual branch's exit (Hugging Face's BertSelfOutput and BertOutput): children
// "dense" (in -> C), "LayerNorm" and "dropout" (draws from `gen`).
class BertOutput : public Module {
 public:
  BertOutput(int64_t in_features, const BertConfig& cfg, Generator& gen);
  // LayerNorm(residual + dropout(dense(h)) / divisor): post-LN, as in the original BERT;
  // `divisor` is progressive layer drop's (1: none).
  Tensor forward(const Tensor& h,  // (B, T, in)
                 const Tensor& residual,
                 double divisor = 1.0) const;  // (B, T, C) -> (B, T, C)

 private:
  Linear dense_;
  LayerNorm layer_norm_;
  Dropout dropout_;
};

class BertLayer : public Module {
 public:
  // Children "attention", "intermediate", "output"; dropout draws from `gen`. `sparse`
  // and `layout_seed` select the attention (see BertSelfAttention).
  BertLayer(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse,
            uint64_t layout_seed);
  // x = attention.output(attention.self(x), x); then output(gelu(intermediate(x)), x), each
  // branch's output divided by `divisor` before its residual sum (progressive layer drop,
  // Note [Progressive layer drop] in parallel/layer_drop.h; 1: none).
  Tensor forward(const Tensor& x, double divisor = 1.0) const;  // (B, T, C) -> (B, T, C)

  const BertSelfAttention& self_attention() const { return attention_.self; }

 private:
  // Hugging Face's BertAttention: "self" and "output".
  struct Attention : Module {
    Attention(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse,
              uint64_t layout_seed);
    BertSelfAttention self;
    BertOutput output;
  };
  // Hugging Face's BertIntermediate: "dense" (C -> I), the GELU applied by the layer.
  struct Intermediate : Module {
    explicit Intermediate(const BertConfig& cfg);
    Linear dense;
  };

  Attention attention_;
  Intermediate intermediate_;
  BertOutput output_;
};

}  // namespace tessera
