// DropoutStreams: the dropout masks' random streams of one model (or pipeline stage),
// Megatron-LM's RNG tracker (megatron/core/tensor_parallel/random.py) as two Philox
// generators.
//
//   DropoutStreams streams(seed, "dropout", model_group.rank());
//   Dropout resid(p, streams.replicated());   // on activations every rank holds whole
//   Dropout probs(p, streams.sliced());       // on this rank's heads only
//
// Note [Model-parallel dropout]
// Dropout on an activation that every rank of a tensor-parallel group holds whole (the
// embeddings' sum, a row-parallel layer's output after its all-reduce) must draw the same
// mask on every rank, or the replicas would differ from then on. Dropout on an activation
// the group splits (the attention probabilities of each rank's own heads) must draw
// independent masks per rank, or every slice would repeat one pattern. Megatron keeps the
// default CUDA generator seeded alike over the group for the first kind, and forks to its
// "model-parallel-rng" state, seeded with seed + 2718 + tensor-parallel rank, for the
// second (`with get_cuda_rng_tracker().fork():` around the attention dropout). Here the two
// are Philox generators: replicated(), keyed by (seed, name), and sliced(), keyed by (seed,
// name, tensor-parallel rank). A tensor-sliced run therefore draws the single process's
// masks where activations are replicated and masks of its own where they are split, as
// Megatron's does. The engine keys both for each step (Note [Dropout per step] in
// parallel/engine/engine.h), and activation checkpointing rewinds both (generators()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/philox.h"

namespace tessera::parallel {

class DropoutStreams {
 public:
  // The streams named `name` (a pipeline stage's own name: Note [Pipeline GPT] in
  // models/gpt2/gpt.h) of tensor-parallel rank `model_rank` (0 without slicing).
  DropoutStreams(uint64_t seed, const std::string& name, int model_rank);

  // Masks of activations every rank of the model group holds whole.
  Generator& replicated() { return replicated_; }
  // Masks of activations split over the model group.
  Generator& sliced() { return sliced_; }
  // Both streams keyed for optimizer step `step` (Generator(hash_name(key, "step <step>"))
  // at offset 0, each from its own key), whatever they drew before.
  void key_for_step(int64_t step);
  // Both generators, for activation checkpointing to save and rewind.
  std::vector<Generator*> generators() { return {&replicated_, &sliced_}; }

 private:
  uint64_t replicated_key_;
  uint64_t sliced_key_;
  Generator replicated_;
  Generator sliced_;
};

}  // namespace tessera::parallel
