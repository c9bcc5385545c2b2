// The part of a GPT that one pipeline stage holds, and the layer sequence a pipeline
// partitions (Note [Pipeline GPT] in models/gpt2/gpt.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/gpt2/config.h"
#include "parallel/pipeline/partition.h"

namespace tessera {

struct GptPart {
  bool embedding = true;  // wte, wpe and dropout: the stage takes token ids
  int64_t first_block = 0;
  int64_t end_block = -1;  // one past the last block; -1: n_layer
  bool final_norm = true;  // ln_f
  bool head = true;        // the LM head: the stage returns logits and computes the loss

  // True when this is every layer of a model of `cfg`.
  bool whole(const GptConfig& cfg) const;
  // "embedding, blocks 0-3" and the like, for errors and logs.
  std::string describe(const GptConfig& cfg) const;
};

// DeepSpeed's view of a GPT as a sequence of layers: "Embedding" (wte and wpe),
// n_layer x "Block", "LayerNorm" (ln_f) and "LmHead" (no parameters of its own when tied),
// n_layer + 3 in all.
std::vector<parallel::pipeline::LayerInfo> pipeline_layers(const GptConfig& cfg);

// The part stage `stage` owns under the partition `parts` (boundaries into
// pipeline_layers(cfg)). Throws when that stage holds no layer.
GptPart part_of_stage(const GptConfig& cfg, const std::vector<int>& parts, int stage);

}  // namespace tessera
