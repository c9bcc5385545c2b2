// BERT's masked-LM prediction head (Hugging Face's BertLMPredictionHead, the
// "cls.predictions" of BertForMaskedLM): transform, then a decoder tied to the word
// embeddings plus an output bias.
#pragma once

#include "autograd/module.h"
#include "models/bert/config.h"
#include "models/layers/embedding.h"
#include "models/layers/layer_norm.h"
#include "models/layers/linear.h"

namespace tessera {

class BertMlmHead : public Module {
 public:
  // Children "transform" ({"dense" C -> C, "LayerNorm"}) and the parameter "bias" (Vp).
  // The decoder has no weight of its own: it is the word embedding's (Hugging Face ties
  // cls.predictions.decoder.weight to it, and decoder.bias is this bias).
  explicit BertMlmHead(const BertConfig& cfg);

  // LayerNorm(gelu(dense(x))) @ word_embeddings.weight^T + bias. Every padded row of the
  // vocabulary gets a logit too; the loss ignores all but the first vocab_size.
  Tensor forward(const Tensor& x,  // (B, T, C) -> (B, T, Vp)
                 const Embedding& word_embeddings) const;

  Tensor& bias() { return bias_; }

 private:
  // Hugging Face's BertPredictionHeadTransform.
  struct Transform : Module {
    explicit Transform(const BertConfig& cfg);
    Linear dense;
    LayerNorm layer_norm;
  };

  Transform transform_;
  Tensor bias_;  // (Vp)
};

}  // namespace tessera
