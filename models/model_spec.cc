#include "models/model_spec.h"

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

double sparse_layout_density(const SparsityConfig& s, int64_t heads, int64_t seq_len) {
  const int64_t padded = (seq_len + s.block - 1) / s.block * s.block;
  const Tensor layout = make_sparsity_layout(s, heads, padded, /*seed=*/0);
  const std::vector<int64_t> bits = layout.to_vector<int64_t>();
  int64_t on = 0;
  for (const int64_t b : bits) on += b != 0;
  return static_cast<double>(on) / static_cast<double>(bits.size());
}

}  // namespace tessera
