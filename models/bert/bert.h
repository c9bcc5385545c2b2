// A BERT-style encoder with a masked-LM head (Hugging Face BertForMaskedLM without the
// token-type embeddings and the pooler), dense or block-sparse attention.
//
//   Bert model(cfg, /*seed=*/1337);                   // or with &sparsity_config
//   MaskedBatch batch = mask_tokens(tokens, cfg, 1337, step);  // models/bert/masking.h
//   Tensor logits = model.forward(batch.inputs);        // (B, T) -> (B, T, Vp)
//   Tensor loss = model.loss(logits, batch.targets);    // mean over the selected positions
//
// Parameters (Hugging Face names; Linear weights (out, in) as in PyTorch):
//   bert.embeddings.{word_embeddings (Vp, C), position_embeddings (block_size, C)}.weight,
//   bert.embeddings.LayerNorm.*,
//   bert.encoder.layer.{i}.{attention.self.qkv, attention.output.dense,
//     attention.output.LayerNorm, intermediate.dense, output.dense, output.LayerNorm}.*
//     (qkv fuses Hugging Face's query, key and value: Note [Fused BERT QKV]),
//   cls.predictions.transform.{dense, LayerNorm}.*, cls.predictions.bias (Vp).
// The decoder is tied to the word embeddings. Differences from Hugging Face: no dropout on
// the attention probabilities (Note [BERT attention dropout]) and the tanh approximation
// of GELU (Tessera's gelu; BERT's erf form differs by < 1e-3).
#pragma once

#include <cstdint>

#include "autograd/module.h"
#include "core/philox.h"
#include "models/bert/config.h"
#include "models/bert/layer.h"
#include "models/bert/mlm_head.h"
#include "models/language_model.h"
#include "models/layers/dropout.h"
#include "models/layers/embedding.h"
#include "models/layers/layer_norm.h"
#include "models/sparse/sparsity_config.h"
#include "parallel/layer_drop.h"

namespace tessera {

class Bert : public LanguageModel {
 public:
  // Builds the model and initializes its materialized parameters (all of them, unless
  // built under a DeferredInitGuard) with init_parameter(); dropout masks come from a
  // Philox stream keyed by `seed` as well. With `sparse` (which must be bidirectional;
  // copied, need not outlive the model) every layer attends through a block-sparse layer
  // over that config's layout. All layers share one layout whose random blocks come from a
  // seed derived from `seed`, so every rank builds the same layout without communication.
  Bert(const BertConfig& cfg, uint64_t seed, const SparsityConfig* sparse = nullptr);

  // BERT initialization, a function of (seed, parameter name) only: N(0, 0.02) for
  // weights and embeddings, LayerNorm weight 1, biases 0, and zero rows for the vocabulary
  // padding (the [MASK] row is a trained row and drawn like the others).
  void init_parameter(const std::string& name, const Tensor& out) const override;

  // Token ids in [0, vocab_size] (vocab_size is [MASK]), T <= block_size, on the model's
  // device.
  Tensor forward(const Tensor& ids) const override;  // (B, T) i32|i64 -> logits (B, T, Vp)
  // Mean cross-entropy over the first vocab_size logits (the [MASK] and padding columns are
  // never predicted) at positions whose target != -100. When no position counts (a batch
  // where masking selected nothing) it is 0 with zero gradients, not NaN: such a batch
  // carries no signal, and a NaN would poison the gradient accumulated over micro-batches.
  Tensor loss(const Tensor& logits,                   // (B, T, Vp)
              const Tensor& targets) const override;  // (B, T) i32|i64 -> ()

  // Recompute layers in backward instead of storing their activations: every `interval`
  // consecutive layers form one checkpoint (0: none; 1: each layer).
  void set_activation_checkpointing(int64_t interval, CheckpointPolicy policy = {}) override {
    checkpoint_interval_ = interval;
    checkpoint_policy_ = std::move(policy);
  }

  const BertConfig& config() const { return cfg_; }
  // The dropout stream; the engine keys it per step (Note [Dropout per step] in
  // parallel/engine/engine.h).
  // BERT is not sliced: its masks all come from the replicated stream.
  parallel::DropoutStreams& dropout_streams() override { return dropout_streams_; }
  // Progressive layer drop in training forwards (Note [Progressive layer drop] in
  // parallel/layer_drop.h), keyed by the initialization seed; each branch's output is
  // divided before its post-LN residual sum (DeepSpeed's example is a pre-LN BERT). Not
  // with activation checkpointing (a recomputation would draw again).
  void set_layer_drop(double theta, int64_t step) override;
  // Encoder layer i (tests and tools inspect its attention, e.g. the sparse layout).
  const BertLayer& layer(size_t i) const {
    return static_cast<const BertLayer&>(body_.encoder.layer[i]);
  }

 private:
  // Hugging Face's BertEmbeddings, without token types.
  struct Embeddings : Module {
    Embeddings(const BertConfig& cfg, Generator& gen);
    Embedding word_embeddings;      // (Vp, C)
    Embedding position_embeddings;  // (block_size, C)
    LayerNorm layer_norm;
    Dropout dropout;
  };
  // Hugging Face's BertEncoder: "layer.{i}".
  struct Encoder : Module {
    Encoder(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse, uint64_t seed);
    ModuleList layer;
  };
  // The "bert" child: embeddings and encoder.
  struct Body : Module {
    Body(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse, uint64_t seed);
    Embeddings embeddings;
    Encoder encoder;
  };
  // The "cls" child: the masked-LM head.
  struct Cls : Module {
    explicit Cls(const BertConfig& cfg);
    BertMlmHead predictions;
  };

  // init_parameter() for a name known to be a parameter.
  void init_value(const std::string& name, const Tensor& out) const;
  Tensor embed(const Tensor& ids) const;  // (B, T) -> (B, T, C)
  Tensor layers(Tensor x) const;          // (B, T, C) -> (B, T, C)

  BertConfig cfg_;
  uint64_t seed_;  // of the initialization
  // Mutable: a forward pass in training draws dropout masks (the layers hold pointers).
  mutable parallel::DropoutStreams dropout_streams_;
  Body body_;
  Cls cls_;
  int64_t checkpoint_interval_ = 0;
  CheckpointPolicy checkpoint_policy_;
  // Progressive layer drop (mutable: a training forward counts itself).
  mutable parallel::LayerDropper layer_drop_;
};

}  // namespace tessera
