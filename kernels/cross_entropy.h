// Fused softmax cross-entropy: the probability tensor is never materialized in forward.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessera::kernels {

struct CrossEntropyOutput {
  // Both f32 for f16/bf16 logits, the logits' dtype otherwise (checks.h stat_dtype).
  Tensor loss;  // ()  mean over rows whose target != ignore_index (0 when none count)
  Tensor lse;   // (N) log-sum-exp of each row, saved for backward
};

CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index = -100);  // (N, V), (N) i32|i64

// dlogits = (softmax(logits) - onehot(target)) * dloss / count; ignored rows get 0. With
// padded_cols > V the result has padded_cols columns, those past V zero: the gradient of a
// padded (N, padded_cols) tensor whose first V columns are the logits (a vocabulary padded
// for speed), written without a separate padding pass.
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index = -100,
                              int64_t padded_cols = 0);  // -> (N, max(V, padded_cols))

}  // namespace tessera::kernels
