// The BERT encoder with a masked-LM head: config, parameter names and count, the
// initialization, bidirectionality, the loss, training, gradients and checkpointing.
#include "models/bert/bert.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/json.h"
#include "models/bert/masking.h"
#include "tests/models/bert/tiny_bert.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;

BertConfig tiny() { return testing::tiny_bert(12); }

Tensor ids_of(const std::vector<int64_t>& v, int64_t b, int64_t t) {
  return from_vector(v, {b, t});
}

// (B, T) token ids in [0, vocab) from a fixed formula.
Tensor some_ids(int64_t b, int64_t t, int64_t vocab) {
  std::vector<int64_t> v(static_cast<size_t>(b * t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 13 + 5) % vocab);
  return ids_of(v, b, t);
}

std::map<std::string, std::vector<double>> grads_of(const Bert& model) {
  std::map<std::string, std::vector<double>> out;
  for (const NamedParameter& p : model.named_parameters()) {
    REQUIRE(p.tensor.grad().defined());
    out[p.name] = p.tensor.grad().to_vector<double>();
  }
  return out;
}

TEST_CASE("BertConfig: vocabulary with [MASK], defaults and the JSON section") {
  const BertConfig d;
  CHECK(d.vocab_size == 30522);
  CHECK(d.mask_token_id() == 30522);
  CHECK(d.padded_vocab_size() == 30592);
  CHECK(d.intermediate_dim() == 3072);
  CHECK(d.block_size == 512);
  CHECK(d.layer_norm_eps == 1e-12);
  CHECK(d.mask_prob == 0.15);
  BertConfig exact = tiny();
  exact.vocab_size = 127;  // 127 + [MASK] fills 128 rows exactly
  CHECK(exact.padded_vocab_size() == 128);
  exact.vocab_size = 128;
  CHECK(exact.padded_vocab_size() == 256);

  const nlohmann::json doc = parse_json(
      R"({"type": "bert", "vocab_size": 100, "n_layer": 3, "n_head": 4, "n_embd": 32,
          "intermediate_size": 0, "mask_prob": 0.2, "dropout": 0.0})");
  const BertConfig c = BertConfig::from_json(JsonObjectReader(doc, "config", "$.model"));
  CHECK(c.vocab_size == 100);
  CHECK(c.n_layer == 3);
  CHECK(c.intermediate_dim() == 128);  // 0: 4 * n_embd of the section's n_embd
  CHECK(c.mask_prob == 0.2);
  CHECK(c.block_size == 512);
  // to_json writes the resolved width and reads back to the same config.
  const nlohmann::json back = c.to_json();
  CHECK(back.at("intermediate_size") == 128);
  const BertConfig again = BertConfig::from_json(JsonObjectReader(back, "config", "$.model"));
  CHECK(again.to_json() == back);

  auto read = [](const std::string& text) {
    const nlohmann::json j = parse_json(text);
    return BertConfig::from_json(JsonObjectReader(j, "config", "$.model"));
  };
  CHECK_THAT(error_of([&] { read(R"({"type": "gpt2"})"); }), Catch::Contains("\"bert\""));
  CHECK_THAT(error_of([&] { read(R"({"type": "bert", "n_embed": 8})"); }),
             Catch::Contains("n_embed") && Catch::Contains("n_embd"));
  CHECK_THAT(error_of([&] { read(R"({"type": "bert", "n_head": 5})"); }),
             Catch::Contains("$.model.n_embd: expected a positive multiple of n_head (5)"));
  CHECK_THAT(error_of([&] { read(R"({"type": "bert", "mask_prob": 1.5})"); }),
             Catch::Contains("mask_prob"));
}

TEST_CASE("Bert: logits shape, block_size check, Hugging Face parameter names and count") {
  const BertConfig cfg = tiny();
  Bert model(cfg, 1);
  const Tensor logits = model.forward(some_ids(2, 7, cfg.vocab_size));
  CHECK(logits.shape() == Shape{2, 7, 128});
  // [MASK] is a valid input id; a sequence longer than block_size is not.
  CHECK(model.forward(ids_of({cfg.mask_token_id(), 3}, 1, 2)).shape() == Shape{1, 2, 128});
  CHECK_THAT(error_of([&] { model.forward(some_ids(1, 13, cfg.vocab_size)); }),
             Catch::Contains("[bert] expected at most block_size 12 positions, found") &&
                 Catch::Contains("13"));
  CHECK_THAT(error_of([&] { model.forward(some_ids(1, 4, cfg.vocab_size).reshape({4})); }),
             Catch::Contains("[bert] expected token ids of shape (B, T)"));

  const int64_t c = cfg.n_embd, i = 4 * c, vp = 128;
  std::map<std::string, Shape> want = {
      {"bert.embeddings.word_embeddings.weight", {vp, c}},
      {"bert.embeddings.position_embeddings.weight", {cfg.block_size, c}},
      {"bert.embeddings.LayerNorm.weight", {c}},
      {"bert.embeddings.LayerNorm.bias", {c}},
      {"cls.predictions.transform.dense.weight", {c, c}},
      {"cls.predictions.transform.dense.bias", {c}},
      {"cls.predictions.transform.LayerNorm.weight", {c}},
      {"cls.predictions.transform.LayerNorm.bias", {c}},
      {"cls.predictions.bias", {vp}},
  };
  for (int l = 0; l < 2; ++l) {
    const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
    want[p + "attention.self.qkv.weight"] = {3 * c, c};
    want[p + "attention.self.qkv.bias"] = {3 * c};
    want[p + "attention.output.dense.weight"] = {c, c};
    want[p + "attention.output.dense.bias"] = {c};
    want[p + "attention.output.LayerNorm.weight"] = {c};
    want[p + "attention.output.LayerNorm.bias"] = {c};
    want[p + "intermediate.dense.weight"] = {i, c};
    want[p + "intermediate.dense.bias"] = {i};
    want[p + "output.dense.weight"] = {c, i};
    want[p + "output.dense.bias"] = {c};
    want[p + "output.LayerNorm.weight"] = {c};
    want[p + "output.LayerNorm.bias"] = {c};
  }
  std::map<std::string, Shape> got;
  int64_t n = 0;
  for (const NamedParameter& p : model.named_parameters()) {
    CHECK(got.emplace(p.name, p.tensor.shape()).second);
    n += p.tensor.numel();
  }
  CHECK(got == want);
  CHECK(n == cfg.num_parameters());
  // The formula by hand: embeddings, 2 layers, head.
  CHECK(n == (vp * c + 12 * c + 2 * c) + 2 * (4 * c * c + 4 * c + 2 * c * i + i + c + 4 * c) +
                 (c * c + 3 * c + vp));
  // bert-base: Hugging Face BertForMaskedLM's 109,514,298 (no pooler) less the token-type
  // embedding (2 x 768), with 70 more vocabulary rows ([MASK] and padding) and bias entries.
  CHECK(BertConfig{}.num_parameters() == 109514298 - 2 * 768 + 70 * 768 + 70);
}

TEST_CASE("Bert init: a function of (seed, name); N(0, 0.02), LayerNorm 1, biases 0, padding 0") {
  BertConfig cfg = tiny();
  cfg.n_embd = 64;
  cfg.n_head = 4;
  Bert a(cfg, 7), b(cfg, 7), c(cfg, 8);
  const StateDict sa = a.state_dict(), sb = b.state_dict(), sc = c.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    CHECK(sa[i].second.to_vector<double>() == sb[i].second.to_vector<double>());
  }
  CHECK(sa[0].second.to_vector<double>() != sc[0].second.to_vector<double>());
  // A deeper model keeps every shared name's values: init depends on the name only.
  BertConfig deeper = cfg;
  deeper.n_layer = 3;
  Bert d(deeper, 7);
  std::map<std::string, Tensor> dp;
  for (const auto& [n, t] : d.state_dict()) dp[n] = t;
  for (const auto& [n, t] : sa) {
    INFO(n);
    CHECK(t.to_vector<double>() == dp.at(n).to_vector<double>());
  }

  for (const NamedParameter& p : a.named_parameters()) {
    INFO(p.name);
    const std::vector<double> v = p.tensor.detach().to_vector<double>();
    const bool is_bias = p.name.size() > 4 && p.name.substr(p.name.size() - 4) == "bias";
    if (is_bias) {
      CHECK(v == std::vector<double>(v.size(), 0.0));
    } else if (p.name.find("LayerNorm.weight") != std::string::npos) {
      CHECK(v == std::vector<double>(v.size(), 1.0));
    } else {
      std::vector<double> real = v;
      if (p.name == "bert.embeddings.word_embeddings.weight") {
        // Rows 0..37 ([MASK] included) are drawn; rows 38..127 are zero padding.
        const size_t drawn = static_cast<size_t>((cfg.vocab_size + 1) * cfg.n_embd);
        const std::vector<double> pad(v.begin() + drawn, v.end());
        CHECK(pad == std::vector<double>(pad.size(), 0.0));
        const std::vector<double> mask_row(v.begin() + drawn - cfg.n_embd, v.begin() + drawn);
        CHECK(mask_row != std::vector<double>(mask_row.size(), 0.0));
        real.resize(drawn);
      }
      double sq = 0;
      for (double x : real) sq += x * x;
      CHECK(std::sqrt(sq / static_cast<double>(real.size())) == Approx(0.02).epsilon(0.1));
    }
  }
}

TEST_CASE("Bert is bidirectional: a later token changes earlier positions' logits") {
  const BertConfig cfg = tiny();
  Bert model(cfg, 3);
  model.eval();
  NoGradGuard no_grad;
  std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  const Tensor before = model.forward(ids_of(ids, 1, 8));
  ids[7] = 20;
  const Tensor after = model.forward(ids_of(ids, 1, 8));
  for (int64_t t = 0; t < 8; ++t) {
    INFO("position " << t);
    const std::vector<double> x = before.select(1, t).contiguous().to_vector<double>();
    const std::vector<double> y = after.select(1, t).contiguous().to_vector<double>();
    CHECK(testing::max_abs_diff(x, y) > 1e-6);
  }
  // Eval mode is deterministic; training mode draws dropout masks.
  CHECK(model.forward(ids_of(ids, 1, 8)).to_vector<double>() == after.to_vector<double>());
  BertConfig drop = cfg;
  drop.dropout = 0.1;
  Bert trained(drop, 3);
  const Tensor x = some_ids(1, 8, cfg.vocab_size);
  CHECK(trained.forward(x).to_vector<double>() != trained.forward(x).to_vector<double>());
}

TEST_CASE("Bert loss: mean cross-entropy over the first vocab_size logits at targets != -100") {
  const BertConfig cfg = tiny();
  Bert model(cfg, 5);
  model.eval();
  const Tensor logits = model.forward(some_ids(2, 6, cfg.vocab_size));  // (2, 6, 128)
  // One counted position: (row 1, position 3), target 5.
  std::vector<int64_t> t(12, kMlmIgnoreIndex);
  t[1 * 6 + 3] = 5;
  const Tensor loss = model.loss(logits, ids_of(t, 2, 6));
  const std::vector<double> row = logits.detach().select(0, 1).select(0, 3).to_vector<double>();
  double sum = 0;
  for (int64_t v = 0; v < cfg.vocab_size; ++v) sum += std::exp(row[v]);  // real tokens only
  const double want = std::log(sum) - row[5];
  CHECK(std::isfinite(loss.item<double>()));
  CHECK(loss.item<double>() == Approx(want).epsilon(1e-5));

  // Two counted positions: their mean. Untrained logits are near 0: loss near ln(37).
  t[0] = 36;
  const Tensor two = model.loss(logits, ids_of(t, 2, 6));
  const std::vector<double> row0 = logits.detach().select(0, 0).select(0, 0).to_vector<double>();
  double sum0 = 0;
  for (int64_t v = 0; v < cfg.vocab_size; ++v) sum0 += std::exp(row0[v]);
  CHECK(two.item<double>() == Approx((want + std::log(sum0) - row0[36]) / 2).epsilon(1e-5));
  CHECK(two.item<double>() == Approx(std::log(37.0)).epsilon(0.1));

  // [MASK] (id 37) is never a target.
  t[0] = cfg.mask_token_id();
  CHECK_THAT(error_of([&] { model.loss(logits, ids_of(t, 2, 6)); }), Catch::Contains("[0, 37)"));
  CHECK_THAT(error_of([&] { model.loss(logits, some_ids(2, 5, 37)); }),
             Catch::Contains("[bert] loss expects logits"));
}

TEST_CASE("Bert loss with no selected position is 0 with zero gradients, not NaN") {
  const BertConfig cfg = tiny();
  Bert model(cfg, 5);
  const Tensor loss = model.loss(model.forward(some_ids(1, 4, cfg.vocab_size)),
                                 ids_of(std::vector<int64_t>(4, kMlmIgnoreIndex), 1, 4));
  CHECK(loss.item<double>() == 0.0);
  backward(loss);
  for (const NamedParameter& p : model.named_parameters()) {
    if (!p.tensor.grad().defined()) continue;
    for (double g : p.tensor.grad().to_vector<double>()) REQUIRE(g == 0.0);
  }
}

TEST_CASE("a few SGD steps on a fixed masked batch reduce the loss") {
  BertConfig cfg = tiny();
  cfg.mask_prob = 0.3;
  Bert model(cfg, 11);
  const MaskedBatch batch = mask_tokens(some_ids(4, 12, cfg.vocab_size), cfg, 11, 0);
  std::vector<double> losses;
  for (int step = 0; step < 15; ++step) {
    model.zero_grad();
    const Tensor loss = model.loss(model.forward(batch.inputs), batch.targets);
    losses.push_back(loss.item<double>());
    backward(loss);
    NoGradGuard no_grad;
    for (const Tensor& p : model.parameters()) p.copy_(p.detach() - p.grad() * 0.5);
  }
  INFO("first " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < 0.5 * losses.front());
}

TEST_CASE("Bert gradients match f64 central differences") {
  const BertConfig cfg = tiny();
  Bert model(cfg, 13);
  model.to(Device::cpu(), DType::f64);
  model.eval();
  // Scale the small init up so that every path carries a visible gradient.
  {
    NoGradGuard no_grad;
    for (const Tensor& p : model.parameters()) {
      if (p.dim() == 2) p.copy_(p.detach() * 10.0);
    }
  }
  const Tensor ids = ids_of({1, 5, cfg.mask_token_id(), 7, 2, cfg.mask_token_id(), 0, 36}, 2, 4);
  const Tensor targets = ids_of({-100, -100, 4, -100, 2, 30, -100, -100}, 2, 4);
  std::map<std::string, Tensor> params;
  for (const NamedParameter& p : model.named_parameters()) params[p.name] = p.tensor;
  const auto fn = [&](const TensorList&) { return model.loss(model.forward(ids), targets); };
  // The tied word embedding (input and decoder), position embeddings, the fused QKV, both
  // residual exits, the MLP and the MLM head (whole parameters: gradcheck perturbs leaves).
  TensorList leaves;
  for (const char* name :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
        "bert.encoder.layer.0.attention.self.qkv.bias",
        "bert.encoder.layer.0.attention.output.LayerNorm.weight",
        "bert.encoder.layer.1.intermediate.dense.bias", "bert.encoder.layer.1.output.dense.bias",
        "cls.predictions.transform.dense.weight", "cls.predictions.bias"}) {
    leaves.push_back(params.at(name));
  }
  const GradcheckResult r = gradcheck(fn, leaves, {1e-6, 1e-7, 1e-5});
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("activation checkpointing gives identical loss, gradients and dropout stream") {
  BertConfig cfg = tiny();
  cfg.n_layer = 3;
  cfg.dropout = 0.1;  // the recomputation must redraw the same masks
  const MaskedBatch batch = mask_tokens(some_ids(2, 10, cfg.vocab_size), cfg, 4, 0);
  auto run = [&](int64_t interval, std::map<std::string, std::vector<double>>* grads,
                 uint64_t* offset) {
    Bert model(cfg, 21);
    model.set_activation_checkpointing(interval);
    const Tensor loss = model.loss(model.forward(batch.inputs), batch.targets);
    backward(loss);
    *grads = grads_of(model);
    *offset = model.dropout_streams().replicated().offset();
    return loss.item<double>();
  };
  std::map<std::string, std::vector<double>> g0, g1, g2;
  uint64_t o0 = 0, o1 = 0, o2 = 0;
  const double l0 = run(0, &g0, &o0);
  const double l1 = run(1, &g1, &o1);
  const double l2 = run(2, &g2, &o2);
  CHECK(l1 == l0);
  CHECK(l2 == l0);
  CHECK(o1 == o0);
  CHECK(o2 == o0);
  CHECK(g1 == g0);
  CHECK(g2 == g0);
}

TEST_CASE("Bert: init_parameter gives each parameter its constructed value, by name") {
  const Bert model(tiny(), 5);
  for (const NamedParameter& p : model.named_parameters()) {
    INFO(p.name);
    const Tensor out = empty(p.tensor.shape());
    model.init_parameter(p.name, out);
    CHECK(out.to_vector<float>() == p.tensor.to_vector<float>());
  }
  CHECK(error_of([&] { model.init_parameter("bert.nope", empty({2})); }) ==
        "[bert] init_parameter: expected a parameter of this model, found \"bert.nope\"");
}

}  // namespace
}  // namespace tessera
