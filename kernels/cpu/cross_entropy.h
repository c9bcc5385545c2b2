// CPU fused softmax cross-entropy (see kernels/cross_entropy.h).
#pragma once

#include <cstdint>

#include "kernels/cross_entropy.h"

namespace tessera::kernels::cpu {

// logits: (N, V); targets: (N) i32|i64. Throws naming the row of a target outside [0, V)
// that is not ignore_index.
CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index);
// dloss: one element; lse: (N) -> dlogits (N, cols), cols >= V, the columns past V zero.
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index, int64_t cols);

}  // namespace tessera::kernels::cpu
