#include "models/gpt2/config.h"

#include <array>
#include <map>
#include <optional>

#include "core/error.h"

namespace tessera {

namespace {

// Parameters of `cfg`'s model when each MoE block counts `experts(layer)` experts.
template <class Experts>
int64_t count_parameters(const GptConfig& cfg, const Experts& experts) {
  const int64_t c = cfg.n_embd;
  const int64_t b = cfg.bias ? 1 : 0;
  const int64_t mlp = 4 * c * c + b * 4 * c          // c_fc
                      + 4 * c * c + b * c;           // c_proj
  const int64_t attention = 2 * (c + b * c)          // ln_1, ln_2
                            + 3 * c * c + b * 3 * c  // c_attn
                            + c * c + b * c;         // attn.c_proj
  int64_t blocks = 0;
  for (int64_t layer = 0; layer < cfg.n_layer; ++layer) {
    blocks += attention;
    if (!cfg.moe || !cfg.moe->is_moe_block(layer)) {
      blocks += mlp;
      continue;
    }
    const int64_t residual = cfg.moe->use_residual ? mlp + 2 * c + 2 : 0;        // + coefficient
    blocks += c * cfg.moe->experts_at(layer) + experts(layer) * mlp + residual;  // + gate
  }
  const int64_t head = cfg.tie_word_embeddings ? 0 : cfg.padded_vocab_size() * c;
  return cfg.padded_vocab_size() * c + cfg.block_size * c + blocks + (c + b * c) + head;
}

}  // namespace

int64_t GptConfig::num_parameters() const {
  return count_parameters(*this, [&](int64_t layer) { return moe->experts_at(layer); });
}

int64_t GptConfig::active_parameters() const {
  return count_parameters(*this, [&](int64_t) { return int64_t{moe->gate.k}; });
}

int64_t GptConfig::expert_parameters() const {
  if (!moe) return 0;
  return num_parameters() - count_parameters(*this, [](int64_t) { return int64_t{0}; });
}

double GptConfig::attention_probs_dropout() const {
  if (attention_dropout) return *attention_dropout;
  return sparse_attention ? 0.0 : dropout;
}

void GptConfig::validate(const std::string& where) const {
  TS_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 31), where,
           "vocab_size: expected an integer in [1, 2^31], found ", vocab_size);
  TS_CHECK(block_size > 0, where, "block_size: expected an integer > 0, found ", block_size);
  TS_CHECK(n_layer > 0, where, "n_layer: expected an integer > 0, found ", n_layer);
  TS_CHECK(n_head > 0, where, "n_head: expected an integer > 0, found ", n_head);
  TS_CHECK(n_embd > 0 && n_embd % n_head == 0, where,
           "n_embd: expected a positive multiple of n_head (", n_head, "), found ", n_embd);
  TS_CHECK(dropout >= 0.0 && dropout < 1.0, where, "dropout: expected a number in [0, 1), found ",
           dropout);
  TS_CHECK(!attention_dropout || (*attention_dropout >= 0.0 && *attention_dropout < 1.0), where,
           "attention_dropout: expected a number in [0, 1), found ", attention_dropout.value_or(0));
  TS_CHECK(!sparse_attention || attention_probs_dropout() == 0.0, where,
           "attention_dropout: block-sparse attention drops none of its probabilities (as "
           "DeepSpeed's SparseSelfAttention); expected 0 with sparse_attention, found ",
           attention_probs_dropout());
  TS_CHECK(layer_norm_eps > 0.0, where, "layer_norm_eps: expected a number > 0, found ",
           layer_norm_eps);
  if (moe) moe->validate(n_layer, where + "moe.");
  if (sparse_attention) {
    const SparsityConfig& s = *sparse_attention;
    TS_CHECK(s.mode == SparsityMode::dense || s.unidirectional, where,
             "sparse_attention.attention: GPT is causal; expected \"unidirectional\" for mode \"",
             sparsity_mode_name(s.mode), "\", found \"bidirectional\"");
    s.validate(where + "sparse_attention: ");
  }
}

GptConfig GptConfig::preset(const std::string& name) {
  // (n_layer, n_head, n_embd) of the released GPT-2 checkpoints.
  static const std::map<std::string, std::array<int64_t, 3>> kPresets = {
      {"gpt2", {12, 12, 768}},
      {"gpt2-medium", {24, 16, 1024}},
      {"gpt2-large", {36, 20, 1280}},
      {"gpt2-xl", {48, 25, 1600}},
  };
  const auto it = kPresets.find(name);
  TS_CHECK(it != kPresets.end(), "[gpt2] unknown preset \"", name,
           "\"; expected one of gpt2, gpt2-medium, gpt2-large, gpt2-xl");
  GptConfig cfg;
  cfg.n_layer = it->second[0];
  cfg.n_head = it->second[1];
  cfg.n_embd = it->second[2];
  return cfg;
}

GptConfig GptConfig::from_json(JsonObjectReader model) {
  model.required_one_of("type", {"gpt2"});
  const std::optional<std::string> preset_name = model.optional<std::string>("preset");
  GptConfig cfg = preset_name ? preset(*preset_name) : GptConfig{};
  cfg.vocab_size = model.get_in_range<int64_t>("vocab_size", cfg.vocab_size, 1, int64_t{1} << 31);
  cfg.block_size = model.get_in_range<int64_t>("block_size", cfg.block_size, 1, 1 << 20);
  cfg.n_layer = model.get_in_range<int64_t>("n_layer", cfg.n_layer, 1, 1024);
  cfg.n_head = model.get_in_range<int64_t>("n_head", cfg.n_head, 1, 1024);
  cfg.n_embd = model.get_in_range<int64_t>("n_embd", cfg.n_embd, 1, 1 << 16);
  cfg.dropout = model.get_in_range<double>("dropout", cfg.dropout, 0.0, 0.99);
  if (model.has("attention_dropout")) {
    cfg.attention_dropout = model.get_in_range<double>("attention_dropout", 0.0, 0.0, 0.99);
  }
  cfg.bias = model.get<bool>("bias", cfg.bias);
  cfg.tie_word_embeddings = model.get<bool>("tie_word_embeddings", cfg.tie_word_embeddings);
  cfg.layer_norm_eps = model.get_in_range<double>("layer_norm_eps", cfg.layer_norm_eps, 1e-12, 1.0);
  if (model.has("sparse_attention")) {
    cfg.sparse_attention = SparsityConfig::from_json(model.object("sparse_attention"));
  }
  if (model.has("moe")) cfg.moe = GptMoeConfig::from_json(model.object("moe"));
  model.finish();
  cfg.validate("[config] " + model.path() + ".");
  return cfg;
}

nlohmann::json GptConfig::to_json() const {
  nlohmann::json j = {{"type", "gpt2"},
                      {"vocab_size", vocab_size},
                      {"block_size", block_size},
                      {"n_layer", n_layer},
                      {"n_head", n_head},
                      {"n_embd", n_embd},
                      {"dropout", dropout},
                      {"bias", bias},
                      {"tie_word_embeddings", tie_word_embeddings},
                      {"layer_norm_eps", layer_norm_eps}};
  if (attention_dropout) j["attention_dropout"] = *attention_dropout;
  if (sparse_attention) j["sparse_attention"] = sparse_attention->to_json();
  if (moe) j["moe"] = moe->to_json();
  return j;
}

}  // namespace tessera
