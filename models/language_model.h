// What the trainer needs of a model it trains on token windows: GPT (next-token) and BERT
// (masked-LM) both provide it.
#pragma once

#include <cstdint>

#include "autograd/module.h"
#include "core/philox.h"

namespace tessera {

class LanguageModel : public Module {
 public:
  // Token ids (B, T) i32|i64 -> logits (B, T, Vp), Vp the padded vocabulary (this rank's
  // slice of it under tensor slicing).
  virtual Tensor forward(const Tensor& ids) const = 0;
  // The mean cross-entropy of forward()'s logits against targets (B, T); positions whose
  // target is -100 do not count.
  virtual Tensor loss(const Tensor& logits, const Tensor& targets) const = 0;
  // The dropout stream; its key is the model's (and pipeline stage's) own until a trainer
  // keys it per step (Note [Exact resume] in tools/trainer/trainer.h).
  virtual Generator& dropout_generator() = 0;
  // Recompute layers in backward instead of storing their activations: every `interval`
  // consecutive layers form one checkpoint (0: none).
  virtual void set_activation_checkpointing(int64_t interval) = 0;
};

}  // namespace tessera
