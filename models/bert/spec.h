// The bert model kind (Note [Model kinds] in models/model_spec.h): a BERT-style encoder
// trained as a masked LM (Note [Masked-LM runs] in tools/trainer/trainer.h), dense or
// block-sparse bidirectional attention, data parallel with ZeRO.
#pragma once

#include <memory>
#include <optional>

#include "models/bert/config.h"
#include "models/model_spec.h"

namespace tessera {

class BertSpec : public ModelSpec {
 public:
  BertSpec(BertConfig config, std::optional<SparsityConfig> sparse)
      : config_(std::move(config)), sparse_(std::move(sparse)) {}
  // Reads a bert model section; a top-level `sparse_attention` must be bidirectional.
  static std::shared_ptr<const ModelSpec> parse(JsonObjectReader& model,
                                                const std::optional<SparsityConfig>& sparse);

  // The hyperparameters, and the layout its attention goes through (none: dense).
  const BertConfig& config() const { return config_; }
  const std::optional<SparsityConfig>& sparse_attention() const { return sparse_; }

  std::string type() const override { return "bert"; }
  nlohmann::json to_json() const override;
  std::string describe() const override;
  int64_t num_parameters() const override { return config_.num_parameters(); }
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t block_size() const override { return config_.block_size; }
  int64_t hidden_size() const override { return config_.n_embd; }
  // Data-parallel only; progressive layer drop.
  ModelFeatures features() const override { return {{}, false, false, true}; }
  void check_layout(int64_t, int64_t) const override {}
  std::unique_ptr<LanguageModel> build(uint64_t seed,
                                       const ModelPlacement& placement) const override;
  // The window masked by BERT's 80/10/10 rule (Note [BERT masking] in
  // models/bert/masking.h); `next` is not used.
  parallel::pipeline::MicroBatch example(const Tensor& window, const Tensor& next, uint64_t seed,
                                         uint64_t counter) const override;

 private:
  BertConfig config_;
  std::optional<SparsityConfig> sparse_;
};

}  // namespace tessera
