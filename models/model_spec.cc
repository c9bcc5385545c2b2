#include "models/model_spec.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tessera {

parallel::pipeline::MicroBatch ModelSpec::example(const Tensor& window, const Tensor& next,
                                                  uint64_t, uint64_t) const {
  return {window, next};
}

void ModelSpec::load_pretrained(LanguageModel&, const std::string& path) const {
  TS_FAIL("[config] $.model.init_from: the ", type(),
          " model starts from its own initialization; expected no init_from, found \"", path, "\"");
}

std::vector<int32_t> ModelSpec::generate(const LanguageModel&, const std::vector<int32_t>&, int64_t,
                                         const SamplingOptions&) const {
  TS_FAIL("[config] $.trainer.sample.tokens: the ", type(),
          " model does not generate text; expected 0, found a request for text");
}

double transformer_flops_per_token(int64_t params, int64_t layers, int64_t width, int64_t heads,
                                   int64_t seq_len, const std::optional<SparsityConfig>& sparse) {
  double density = 1.0;
  if (sparse) {
    const int64_t padded = (seq_len + sparse->block - 1) / sparse->block * sparse->block;
    const Tensor layout = make_sparsity_layout(*sparse, heads, padded, /*seed=*/0);
    const std::vector<int64_t> bits = layout.to_vector<int64_t>();
    int64_t on = 0;
    for (const int64_t bit : bits) on += bit != 0;
    density = static_cast<double>(on) / static_cast<double>(bits.size());
  }
  return 6.0 * static_cast<double>(params) +
         12.0 * density * static_cast<double>(layers * width * seq_len);
}

std::string attention_description(const std::optional<SparsityConfig>& sparse) {
  if (!sparse) return "dense";
  return fmt::format("block-sparse ({}, block {})", sparsity_mode_name(sparse->mode),
                     sparse->block);
}

}  // namespace tessera
