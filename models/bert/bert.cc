#include "models/bert/bert.h"

#include <algorithm>
#include <memory>
#include <string>

#include "autograd/checkpoint.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "parallel/layer_drop.h"

namespace tessera {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `cfg`, after checking it (before any member is built from it).
const BertConfig& validated(const BertConfig& cfg) {
  cfg.validate("[bert] ");
  return cfg;
}

}  // namespace

Bert::Embeddings::Embeddings(const BertConfig& cfg, Generator& gen)
    : word_embeddings(cfg.padded_vocab_size(), cfg.n_embd),
      position_embeddings(cfg.block_size, cfg.n_embd),
      layer_norm(cfg.n_embd, cfg.layer_norm_eps),
      dropout(cfg.dropout, gen) {
  register_module("word_embeddings", word_embeddings);
  register_module("position_embeddings", position_embeddings);
  register_module("LayerNorm", layer_norm);
  register_module("dropout", dropout);
}

Bert::Encoder::Encoder(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse,
                       uint64_t seed) {
  // Every layer shares one layout (Note [Sparse GPT attention] in models/gpt2/attention.h).
  const uint64_t layout_seed = hash_name(seed, "sparse_attention");
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    layer.push_back(std::make_unique<BertLayer>(cfg, gen, sparse, layout_seed));
  }
  register_module("layer", layer);
}

Bert::Body::Body(const BertConfig& cfg, Generator& gen, const SparsityConfig* sparse, uint64_t seed)
    : embeddings(cfg, gen), encoder(cfg, gen, sparse, seed) {
  register_module("embeddings", embeddings);
  register_module("encoder", encoder);
}

Bert::Cls::Cls(const BertConfig& cfg) : predictions(cfg) {
  register_module("predictions", predictions);
}

Bert::Bert(const BertConfig& cfg, uint64_t seed, const SparsityConfig* sparse)
    : cfg_(validated(cfg)),
      seed_(seed),
      dropout_streams_(seed, "dropout", 0),
      body_(cfg_, dropout_streams_.replicated(), sparse, seed),
      cls_(cfg_),
      layer_drop_(seed) {
  register_module("bert", body_);
  register_module("cls", cls_);
  for (const NamedParameter& p : named_parameters()) {
    if (p.tensor.materialized()) init_value(p.name, p.tensor);
  }
}

void Bert::init_parameter(const std::string& name, const Tensor& out) const {
  const std::vector<NamedParameter> params = named_parameters();
  TS_CHECK(std::any_of(params.begin(), params.end(),
                       [&](const NamedParameter& p) { return p.name == name; }),
           "[bert] init_parameter: expected a parameter of this model, found \"", name, "\"");
  init_value(name, out);
}

void Bert::init_value(const std::string& name, const Tensor& out) const {
  NoGradGuard no_grad;
  if (ends_with(name, ".bias")) {  // Linear and LayerNorm biases, cls.predictions.bias
    out.fill_(0.0);
  } else if (ends_with(name, "LayerNorm.weight")) {
    out.fill_(1.0);
  } else {
    const double std = 0.02;  // BERT's initializer_range
    // Rows past [MASK] are padding: zero, and never predicted.
    const int64_t real_rows = cfg_.vocab_size + 1;
    const int64_t pad = cfg_.padded_vocab_size() - real_rows;
    Generator gen = Generator::for_name(seed_, name);
    const Tensor full = randn(out.shape(), gen, {out.dtype()}, 0.0, std);
    if (name == "bert.embeddings.word_embeddings.weight" && pad > 0) {
      full.narrow(0, real_rows, pad).fill_(0.0);
    }
    out.copy_(full);
  }
}

Tensor Bert::embed(const Tensor& ids) const {
  TS_CHECK(ids.dim() == 2, "[bert] expected token ids of shape (B, T), found ",
           shape_str(ids.shape()));
  const int64_t t = ids.size(1);
  TS_CHECK(t <= cfg_.block_size, "[bert] expected at most block_size ", cfg_.block_size,
           " positions, found a sequence of ", t);
  const Embeddings& e = body_.embeddings;
  const Tensor pos = arange(t, {DType::i64, ids.device()});
  const Tensor x = e.word_embeddings(ids) + e.position_embeddings(pos);  // (B, T, C)
  return e.dropout.forward(e.layer_norm(x));
}

void Bert::set_layer_drop(double theta, int64_t step) {
  TS_CHECK(checkpoint_interval_ == 0,
           "[bert] progressive_layer_drop: expected a model without activation checkpointing "
           "(a recomputation would draw again)");
  layer_drop_.set(theta, step);
}

Tensor Bert::layers(Tensor x) const {
  if (layer_drop_.active() && is_training()) {
    const int64_t forward = layer_drop_.next_forward();  // Note [Progressive layer drop]
    for (size_t i = 0; i < body_.encoder.layer.size(); ++i) {
      const int64_t l = static_cast<int64_t>(i);
      if (const std::optional<double> divisor = layer_drop_.keep(forward, l, cfg_.n_layer)) {
        x = layer(i).forward(x, *divisor);
      }
    }
    return x;
  }
  // The dropout stream is rewound for the recomputation: the same masks in backward.
  return checkpoint_sequential(
      std::move(x), body_.encoder.layer.size(), checkpoint_interval_,
      [this](size_t i, const Tensor& y) { return layer(i).forward(y); },
      dropout_streams_.generators(), checkpoint_policy_);
}

Tensor Bert::forward(const Tensor& ids) const {
  const Tensor x = layers(embed(ids));                                   // (B, T, C)
  return cls_.predictions.forward(x, body_.embeddings.word_embeddings);  // (B, T, Vp)
}

Tensor Bert::loss(const Tensor& logits, const Tensor& targets) const {
  TS_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
               logits.size(1) == targets.size(1) && logits.size(2) > cfg_.vocab_size,
           "[bert] loss expects logits (B, T, Vp > ", cfg_.vocab_size,
           ") and targets (B, T), found ", shape_str(logits.shape()), " and ",
           shape_str(targets.shape()));
  const int64_t rows = logits.size(0) * logits.size(1);
  // The padding columns are not classes (cross_entropy's `classes`). cross_entropy returns
  // 0 (and zero gradients) when every target is -100.
  return cross_entropy(reshape(logits, {rows, logits.size(2)}), reshape(targets, {rows}), -100,
                       cfg_.vocab_size);
}

}  // namespace tessera
