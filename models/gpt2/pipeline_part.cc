#include "models/gpt2/pipeline_part.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace tessera {

bool GptPart::whole(const GptConfig& cfg) const {
  return embedding && first_block == 0 && (end_block < 0 || end_block == cfg.n_layer) &&
         final_norm && head;
}

std::string GptPart::describe(const GptConfig& cfg) const {
  std::ostringstream s;
  const int64_t end = end_block < 0 ? cfg.n_layer : end_block;
  const char* sep = "";
  if (embedding) s << "embedding", sep = ", ";
  if (end > first_block) {
    s << sep << (end - first_block == 1 ? "block " : "blocks ") << first_block;
    if (end - first_block > 1) s << "-" << end - 1;
    sep = ", ";
  }
  if (final_norm) s << sep << "final norm", sep = ", ";
  if (head) s << sep << "LM head";
  return s.str();
}

std::vector<parallel::pipeline::LayerInfo> pipeline_layers(const GptConfig& cfg) {
  const int64_t c = cfg.n_embd, b = cfg.bias ? 1 : 0;
  const int64_t block = 2 * (c + b * c) + 3 * c * c + b * 3 * c + c * c + b * c + 4 * c * c +
                        b * 4 * c + 4 * c * c + b * c;
  std::vector<parallel::pipeline::LayerInfo> layers;
  layers.push_back({"Embedding", cfg.padded_vocab_size() * c + cfg.block_size * c});
  for (int64_t i = 0; i < cfg.n_layer; ++i) layers.push_back({"Block", block});
  layers.push_back({"LayerNorm", c + b * c});
  layers.push_back({"LmHead", cfg.tie_word_embeddings ? 0 : cfg.padded_vocab_size() * c});
  return layers;
}

GptPart part_of_stage(const GptConfig& cfg, const std::vector<int>& parts, int stage) {
  const int64_t layers = cfg.n_layer + 3;
  TS_CHECK(stage >= 0 && stage + 1 < static_cast<int>(parts.size()) && parts.front() == 0 &&
               parts.back() == layers,
           "[gpt2] expected a partition of ", layers, " layers with stage ", stage,
           " in it, found ", parts.size(), " boundaries");
  const int64_t begin = parts[stage], end = parts[stage + 1];
  TS_CHECK(end > begin, "[gpt2] pipeline stage ", stage, " holds no layer (", layers,
           " layers over ", parts.size() - 1, " stages); expected at least one layer per stage");
  auto holds = [&](int64_t layer) { return layer >= begin && layer < end; };
  GptPart p;
  p.embedding = holds(0);
  // Blocks are layers 1 .. n_layer.
  p.first_block = std::clamp<int64_t>(begin - 1, 0, cfg.n_layer);
  p.end_block = std::clamp<int64_t>(end - 1, 0, cfg.n_layer);
  p.final_norm = holds(cfg.n_layer + 1);
  p.head = holds(cfg.n_layer + 2);
  return p;
}

}  // namespace tessera
