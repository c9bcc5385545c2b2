#include "models/bert/spec.h"

#include <fmt/format.h>

#include "core/error.h"
#include "models/bert/bert.h"
#include "models/bert/masking.h"

namespace tessera {

std::shared_ptr<const ModelSpec> BertSpec::parse(JsonObjectReader& model,
                                                 const std::optional<SparsityConfig>& sparse) {
  BertConfig cfg = BertConfig::from_json(model);
  TS_CHECK(!sparse || sparse->mode == SparsityMode::dense || !sparse->unidirectional,
           "[config] $.sparse_attention.attention: BERT is bidirectional; expected "
           "\"bidirectional\", found \"unidirectional\"");
  return std::make_shared<BertSpec>(std::move(cfg), sparse);
}

nlohmann::json BertSpec::to_json() const {
  nlohmann::json j = config_.to_json();
  if (sparse_) j["sparse_attention"] = sparse_->to_json();
  return j;
}

std::string BertSpec::describe() const {
  return fmt::format("BERT (masked LM) {} layers, {} heads, width {}, {} parameters, {} attention",
                     config_.n_layer, config_.n_head, config_.n_embd, num_parameters(),
                     attention_description(sparse_));
}

double BertSpec::flops_per_token(int64_t seq_len) const {
  return transformer_flops_per_token(num_parameters(), config_.n_layer, config_.n_embd,
                                     config_.n_head, seq_len, sparse_);
}

std::unique_ptr<LanguageModel> BertSpec::build(uint64_t seed, const ModelPlacement&) const {
  return std::make_unique<Bert>(config_, seed, sparse_ ? &*sparse_ : nullptr);
}

parallel::pipeline::MicroBatch BertSpec::example(const Tensor& window, const Tensor&, uint64_t seed,
                                                 uint64_t counter) const {
  const MaskedBatch m = mask_tokens(window, config_, seed, counter);
  return {m.inputs, m.targets};
}

}  // namespace tessera
