#include "models/gpt2/spec.h"

#include <fmt/format.h>

#include "core/error.h"
#include "models/gpt2/gpt.h"
#include "models/gpt2/pretrained.h"
#include "models/gpt2/sampler.h"
#include "parallel/pipeline/partition.h"

namespace tessera {

std::shared_ptr<const ModelSpec> GptSpec::parse(JsonObjectReader& model,
                                                const std::optional<SparsityConfig>& sparse) {
  GptConfig cfg = GptConfig::from_json(model);
  if (sparse) {
    TS_CHECK(!cfg.sparse_attention, "[config] $.model.sparse_attention: the run has a ",
             "top-level sparse_attention section; expected the layout once, found it twice");
    TS_CHECK(sparse->mode == SparsityMode::dense || sparse->unidirectional,
             "[config] $.sparse_attention.attention: GPT is causal; expected \"unidirectional\" "
             "for mode \"",
             sparsity_mode_name(sparse->mode), "\", found \"bidirectional\"");
    cfg.sparse_attention = *sparse;
    cfg.validate("[config] $.model.");
  }
  return std::make_shared<GptSpec>(std::move(cfg));
}

std::string GptSpec::describe() const {
  std::string moe;
  if (const std::optional<GptMoeConfig>& m = config_.moe) {
    std::string experts;
    for (const int64_t n : m->num_experts)
      experts += (experts.empty() ? "" : "/") + std::to_string(n);
    moe = fmt::format(", mixture of {} experts in every {} block(s), top-{}, {} active per token",
                      experts, m->moe_every, m->gate.k, config_.active_parameters());
  }
  return fmt::format("GPT-2 {} layers, {} heads, width {}, {} parameters{}, {} attention",
                     config_.n_layer, config_.n_head, config_.n_embd, num_parameters(), moe,
                     attention_description(config_.sparse_attention));
}

double GptSpec::flops_per_token(int64_t seq_len) const {
  // A token's products use the active parameters only (k experts of each MoE block).
  return transformer_flops_per_token(config_.active_parameters(), config_.n_layer, config_.n_embd,
                                     config_.n_head, seq_len, config_.sparse_attention);
}

nlohmann::json GptSpec::without_placement(nlohmann::json model) const {
  if (model.contains("moe") && model["moe"].is_object()) model["moe"].erase("ep_size");
  return model;
}

void GptSpec::check_layout(int64_t stages, int64_t tp) const {
  TS_CHECK(expert_parallel_size() == 1 || (stages == 1 && tp == 1),
           "[config] $.model.moe.ep_size: expert parallelism with pipeline stages or tensor "
           "slicing is not supported by Tessera yet; expected ep_size 1 with pipeline.stages ",
           stages, " and tensor_parallel.tp_size ", tp, ", found ", expert_parallel_size());
  TS_CHECK(config_.n_head % tp == 0, "[config] $.tensor_parallel.tp_size: ", tp,
           " does not divide model.n_head ", config_.n_head, "; expected a divisor of it");
  TS_CHECK(config_.padded_vocab_size() % tp == 0, "[config] $.tensor_parallel.tp_size: ", tp,
           " does not divide the padded vocabulary ", config_.padded_vocab_size(),
           "; expected a divisor of it");
  const int64_t layers = config_.n_layer + 3;
  TS_CHECK(stages <= layers, "[config] $.pipeline.stages: ", stages, " stages for the model's ",
           layers, " layers (embedding, blocks, final norm, head); expected at most ", layers);
  const std::optional<SparsityConfig>& s = config_.sparse_attention;
  TS_CHECK(!s || !s->different_layout_per_head || tp == 1,
           "[config] $.sparse_attention.different_layout_per_head: per-head layouts under ",
           "tensor slicing are not implemented; expected false with tensor_parallel.tp_size ", tp);
}

std::unique_ptr<LanguageModel> GptSpec::build(uint64_t seed,
                                              const ModelPlacement& placement) const {
  GptPart part;
  if (placement.stages > 1) {
    const std::vector<int> parts = parallel::pipeline::partition_layers(
        pipeline_layers(config_), static_cast<int>(placement.stages), placement.partition_method);
    part = part_of_stage(config_, parts, static_cast<int>(placement.stage));
  }
  auto model = std::make_unique<Gpt>(config_, seed, placement.model_group, part,
                                     placement.overlap_model_comm, placement.expert_group);
  model->set_batch_split(placement.model_batch_split);
  return model;
}

void GptSpec::load_pretrained(LanguageModel& model, const std::string& path) const {
  tessera::load_pretrained(dynamic_cast<Gpt&>(model), path);
}

std::vector<int32_t> GptSpec::generate(const LanguageModel& model,
                                       const std::vector<int32_t>& prompt, int64_t tokens,
                                       const SamplingOptions& options) const {
  return sample(dynamic_cast<const Gpt&>(model), prompt, tokens, options);
}

}  // namespace tessera
