// Megatron's vocab-parallel cross-entropy: each rank of the model group holds a slice of
// the vocabulary's logits, and no rank ever holds the full (N, V) logits.
//
// Note [Vocab-parallel cross-entropy]
// Rank r holds columns [r Vl, (r + 1) Vl) of the padded vocabulary; columns at or past
// the real vocabulary size are padding and take no part, as the dense loss reads only the
// first V columns. Per row: the global max (all-reduce max), the sum of exp(logit - max)
// (all-reduce sum) and the target's logit (all-reduce sum; one rank has it) give
// loss = log(sum) + max - logit[target], the dense softmax cross-entropy. Backward needs no
// communication: each rank writes softmax - one_hot for its own columns.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// The mean cross-entropy over rows whose target != ignore_index, equal to cross_entropy on
// the first `vocab` columns of the full logits. logits (N, Vl) float, this rank's columns;
// targets (N) i32|i64 global ids in [0, vocab) or ignore_index, the same on every rank.
// Collective over `group`, which must outlive backward.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                    Communicator& group, int64_t ignore_index = -100);

}  // namespace tessera::parallel
