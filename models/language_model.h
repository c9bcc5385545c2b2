// What the trainer trains on token windows: a TrainableModel (parallel/engine/
// trainable_model.h) whose inputs are token ids. GPT (next-token) and BERT (masked-LM)
// both are one.
#pragma once

#include "parallel/engine/trainable_model.h"

namespace tessera {

class LanguageModel : public parallel::TrainableModel {
 public:
  // Token ids (B, T) i32|i64 -> logits (B, T, Vp), Vp the padded vocabulary (this rank's
  // slice of it under tensor slicing).
  Tensor forward(const Tensor& ids) const override = 0;
  // The mean cross-entropy of forward()'s logits against targets (B, T); positions whose
  // target is -100 do not count.
  Tensor loss(const Tensor& logits, const Tensor& targets) const override = 0;
};

}  // namespace tessera
