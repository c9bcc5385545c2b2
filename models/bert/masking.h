// BERT's masked-LM input corruption (the 80/10/10 rule), deterministic and resumable.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "models/bert/config.h"

namespace tessera {

// The target of a position that is not predicted (cross_entropy's ignore_index).
inline constexpr int64_t kMlmIgnoreIndex = -100;

struct MaskedBatch {
  Tensor inputs;   // (B, T) i64 on the CPU: the tokens, selected positions corrupted
  Tensor targets;  // (B, T) i64 on the CPU: the original token where selected, else -100
};

// Note [BERT masking]
// Each position is selected with probability cfg.mask_prob; a selected position's target
// is its original token, and its input becomes [MASK] (cfg.mask_token_id()) with
// probability 0.8, a uniformly random real token in [0, vocab_size) with probability 0.1,
// and stays unchanged otherwise (Devlin et al. 2019, 3.1). Positions not selected have
// target -100 and their input unchanged.
// The draws for flat element i of the batch are one Philox block at counter (i, `counter`)
// under a key derived from (`seed`, "bert.mlm_masking"): word 0 selects, word 1 picks the
// action, words 2-3 the random token. So a mask is a pure function of (seed, counter,
// tokens), the same on every machine; a trainer passes a counter that advances per
// micro-batch and resumes by restoring it. A row, or even the whole batch, may end up with
// no selected position (plain BERT semantics; likely only for tiny batches): Bert::loss
// then returns 0 with zero gradients instead of NaN.
//
// tokens: (B, T) of an integer dtype, ids in [0, vocab_size), on any device.
MaskedBatch mask_tokens(const Tensor& tokens, const BertConfig& cfg, uint64_t seed,
                        uint64_t counter);

}  // namespace tessera
