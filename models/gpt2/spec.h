// The gpt2 model kind (Note [Model kinds] in models/model_spec.h): a GPT-2 of any size,
// dense or block-sparse causal attention, pipelined and tensor-sliced, from its own
// initialization or pretrained weights, and generating text.
#pragma once

#include <memory>
#include <optional>

#include "models/gpt2/config.h"
#include "models/gpt2/gpt.h"
#include "models/model_spec.h"

namespace tessera {

class GptSpec : public ModelSpec {
 public:
  explicit GptSpec(GptConfig config) : config_(std::move(config)) {}
  // Reads a gpt2 model section; a top-level `sparse_attention` becomes the model's
  // attention (it must be causal, and not also given in the section).
  static std::shared_ptr<const ModelSpec> parse(JsonObjectReader& model,
                                                const std::optional<SparsityConfig>& sparse);

  // The hyperparameters, the top-level sparse_attention included.
  const GptConfig& config() const { return config_; }

  std::string type() const override { return "gpt2"; }
  nlohmann::json to_json() const override { return config_.to_json(); }
  // Drops model.moe.ep_size.
  nlohmann::json without_placement(nlohmann::json model) const override;
  int64_t expert_parameters() const override { return config_.expert_parameters(); }
  int64_t expert_parallel_size() const override { return config_.moe ? config_.moe->ep_size : 1; }
  std::string describe() const override;
  int64_t num_parameters() const override { return config_.num_parameters(); }
  double flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t block_size() const override { return config_.block_size; }
  int64_t hidden_size() const override { return config_.n_embd; }
  // Layer drop only without MoE blocks (a skipped block would leave its gate out).
  ModelFeatures features() const override { return {Gpt::kCapabilities, true, true, !config_.moe}; }
  void check_layout(int64_t stages, int64_t tp) const override;
  std::unique_ptr<LanguageModel> build(uint64_t seed,
                                       const ModelPlacement& placement) const override;
  void load_pretrained(LanguageModel& model, const std::string& path) const override;
  std::vector<int32_t> generate(const LanguageModel& model, const std::vector<int32_t>& prompt,
                                int64_t tokens, const SamplingOptions& options) const override;

 private:
  GptConfig config_;
};

}  // namespace tessera
