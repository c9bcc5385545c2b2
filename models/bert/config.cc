#include "models/bert/config.h"

#include "core/error.h"

namespace tessera {

int64_t BertConfig::num_parameters() const {
  const int64_t c = n_embd;
  const int64_t i = intermediate_dim();
  const int64_t vp = padded_vocab_size();
  const int64_t embeddings = vp * c + block_size * c + 2 * c;  // word, position, LayerNorm
  const int64_t per_layer = 3 * c * c + 3 * c                  // attention.self.qkv
                            + c * c + c                        // attention.output.dense
                            + 2 * c                            // attention.output.LayerNorm
                            + c * i + i                        // intermediate.dense
                            + i * c + c                        // output.dense
                            + 2 * c;                           // output.LayerNorm
  // cls.predictions: transform.dense, transform.LayerNorm, the output bias (the decoder
  // weight is the word embedding).
  const int64_t head = c * c + c + 2 * c + vp;
  return embeddings + n_layer * per_layer + head;
}

void BertConfig::validate(const std::string& where) const {
  // The [MASK] id vocab_size must fit in the int32 ids that data loaders may produce.
  TS_CHECK(vocab_size > 0 && vocab_size < (int64_t{1} << 31), where,
           "vocab_size: expected an integer in [1, 2^31 - 1], found ", vocab_size);
  TS_CHECK(block_size > 0, where, "block_size: expected an integer > 0, found ", block_size);
  TS_CHECK(n_layer > 0, where, "n_layer: expected an integer > 0, found ", n_layer);
  TS_CHECK(n_head > 0, where, "n_head: expected an integer > 0, found ", n_head);
  TS_CHECK(n_embd > 0 && n_embd % n_head == 0, where,
           "n_embd: expected a positive multiple of n_head (", n_head, "), found ", n_embd);
  TS_CHECK(intermediate_size >= 0, where,
           "intermediate_size: expected an integer >= 0 (0: 4 * n_embd), found ",
           intermediate_size);
  TS_CHECK(dropout >= 0.0 && dropout < 1.0, where, "dropout: expected a number in [0, 1), found ",
           dropout);
  TS_CHECK(layer_norm_eps > 0.0, where, "layer_norm_eps: expected a number > 0, found ",
           layer_norm_eps);
  TS_CHECK(mask_prob > 0.0 && mask_prob <= 1.0, where,
           "mask_prob: expected a number in (0, 1], found ", mask_prob);
}

BertConfig BertConfig::from_json(JsonObjectReader model) {
  model.required_one_of("type", {"bert"});
  BertConfig cfg;
  cfg.vocab_size =
      model.get_in_range<int64_t>("vocab_size", cfg.vocab_size, 1, (int64_t{1} << 31) - 1);
  cfg.block_size = model.get_in_range<int64_t>("block_size", cfg.block_size, 1, 1 << 20);
  cfg.n_layer = model.get_in_range<int64_t>("n_layer", cfg.n_layer, 1, 1024);
  cfg.n_head = model.get_in_range<int64_t>("n_head", cfg.n_head, 1, 1024);
  cfg.n_embd = model.get_in_range<int64_t>("n_embd", cfg.n_embd, 1, 1 << 16);
  cfg.intermediate_size =
      model.get_in_range<int64_t>("intermediate_size", cfg.intermediate_size, 0, 1 << 20);
  cfg.dropout = model.get_in_range<double>("dropout", cfg.dropout, 0.0, 0.99);
  cfg.layer_norm_eps = model.get_in_range<double>("layer_norm_eps", cfg.layer_norm_eps, 1e-12, 1.0);
  // A rate of 0 would leave nothing to predict; below 1e-6 it is surely a mistake.
  cfg.mask_prob = model.get_in_range<double>("mask_prob", cfg.mask_prob, 1e-6, 1.0);
  model.finish();
  cfg.validate("[config] " + model.path() + ".");
  return cfg;
}

nlohmann::json BertConfig::to_json() const {
  return {{"type", "bert"},
          {"vocab_size", vocab_size},
          {"block_size", block_size},
          {"n_layer", n_layer},
          {"n_head", n_head},
          {"n_embd", n_embd},
          {"intermediate_size", intermediate_dim()},
          {"dropout", dropout},
          {"layer_norm_eps", layer_norm_eps},
          {"mask_prob", mask_prob}};
}

}  // namespace tessera
