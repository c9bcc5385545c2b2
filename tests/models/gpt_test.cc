// GPT-2 model structure: presets, parameter count, name-keyed initialization, the KV cache.
#include "models/gpt2/gpt.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;

GptConfig tiny() {
  GptConfig c;
  c.vocab_size = 37;
  c.block_size = 12;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

TEST_CASE("the gpt2 preset has GPT-2 124M's parameter count") {
  const GptConfig c = GptConfig::preset("gpt2");
  CHECK(c.padded_vocab_size() == 50304);
  CHECK(c.num_parameters() == 124475904);  // llm.c's count with the padded vocabulary
  CHECK(GptConfig::preset("gpt2-xl").n_embd == 1600);
  CHECK_THAT(error_of([] { GptConfig::preset("gpt3"); }),
             Catch::Contains("unknown preset \"gpt3\""));
  Gpt model(tiny(), 1);
  int64_t n = 0;
  for (const Tensor& p : model.parameters()) n += p.numel();
  CHECK(n == tiny().num_parameters());
}

TEST_CASE("initialization is a function of (seed, parameter name)") {
  const GptConfig cfg = tiny();
  Gpt a(cfg, 7), b(cfg, 7), c(cfg, 8);
  const StateDict sa = a.state_dict(), sb = b.state_dict(), sc = c.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    CHECK(sa[i].second.to_vector<double>() == sb[i].second.to_vector<double>());
  }
  // A different seed changes the random tensors; a deeper model keeps the shared names' values
  // except the residual projections, whose std depends on the depth.
  CHECK(sa[0].second.to_vector<double>() != sc[0].second.to_vector<double>());
  GptConfig deeper = cfg;
  deeper.n_layer = 3;
  Gpt d(deeper, 7);
  std::map<std::string, Tensor> dp;
  for (const auto& [n, t] : d.state_dict()) dp[n] = t;
  for (const auto& [n, t] : sa) {
    const bool residual = n.find("c_proj.weight") != std::string::npos;
    CHECK((t.to_vector<double>() == dp.at(n).to_vector<double>()) == !residual);
  }
}

TEST_CASE("GPT-2 init statistics: std 0.02, residual projections 0.02/sqrt(2L), padding zero") {
  GptConfig cfg = tiny();
  cfg.n_embd = 64;
  cfg.n_head = 4;
  Gpt model(cfg, 3);
  for (const NamedParameter& p : model.named_parameters()) {
    const std::vector<double> v = p.tensor.detach().to_vector<double>();
    if (p.name == "transformer.wte.weight") {
      const std::vector<double> pad(v.begin() + cfg.vocab_size * cfg.n_embd, v.end());
      CHECK(pad == std::vector<double>(pad.size(), 0.0));
      continue;
    }
    if (p.tensor.dim() < 2) continue;
    double sq = 0;
    for (double x : v) sq += x * x;
    const double std = std::sqrt(sq / static_cast<double>(v.size()));
    const bool residual = p.name.find("c_proj.weight") != std::string::npos;
    INFO(p.name);
    CHECK(std == Approx(residual ? 0.02 / std::sqrt(4.0) : 0.02).epsilon(0.1));
  }
}

// Prefills 4 positions, then 3, then one at a time, and compares each chunk's logits with
// the full forward's.
void check_cached_equals_full(const GptConfig& cfg) {
  Gpt model(cfg, 11);
  model.eval();
  NoGradGuard no_grad;
  std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const int64_t t = static_cast<int64_t>(ids.size());
  const Tensor full = model.forward(from_vector(ids, {1, t}));  // (1, T, Vp)
  // Prefill 4 positions, then 3, then one at a time.
  KvCache cache(cfg, 1, cfg.block_size);
  std::vector<Tensor> parts;
  int64_t pos = 0;
  for (const int64_t n : {4, 3, 1, 1, 1}) {
    std::vector<int32_t> chunk(ids.begin() + pos, ids.begin() + pos + n);
    parts.push_back(model.forward_cached(from_vector(chunk, {1, n}), cache));
    pos += n;
  }
  CHECK(cache.length == t);
  int64_t row = 0;
  for (const Tensor& p : parts) {
    for (int64_t i = 0; i < p.size(1); ++i, ++row) {
      testing::require_close(p.select(1, i).contiguous(),
                             full.select(1, row).contiguous().to_vector<double>(), 2e-5);
    }
  }
  CHECK_THAT(error_of([&] {
               model.forward_cached(from_vector(ids, {1, t}), cache);
             }),
             Catch::Contains("exceeds block_size 12"));
}

TEST_CASE("forward_cached with a KV cache gives the full forward's logits") {
  check_cached_equals_full(tiny());
}

TEST_CASE("a block-sparse GPT generates with the layout it was trained with") {
  GptConfig cfg = tiny();
  SparsityConfig s;
  s.mode = SparsityMode::bigbird;
  s.block = 2;
  s.num_random_blocks = 1;
  s.num_sliding_window_blocks = 1;
  s.unidirectional = true;
  s.different_layout_per_head = true;
  cfg.sparse_attention = s;
  check_cached_equals_full(cfg);
  // The layout matters: the sparse model's logits are not the dense one's.
  NoGradGuard no_grad;
  const Tensor ids = from_vector(std::vector<int32_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {1, 10});
  const std::vector<double> sparse = Gpt(cfg, 11).forward(ids).to_vector<double>();
  const std::vector<double> dense = Gpt(tiny(), 11).forward(ids).to_vector<double>();
  CHECK(testing::max_abs_diff(sparse, dense) > 1e-3);
  // GPT refuses a bidirectional layout.
  s.unidirectional = false;
  cfg.sparse_attention = s;
  CHECK_THAT(error_of([&] { cfg.validate(); }),
             Catch::Contains("sparse_attention.attention: GPT is causal"));
}

TEST_CASE("the loss ignores the vocabulary padding") {
  const GptConfig cfg = tiny();
  Gpt model(cfg, 5);
  const Tensor idx = from_vector(std::vector<int32_t>{1, 2, 3, 4}, {1, 4});
  const Tensor targets = from_vector(std::vector<int32_t>{2, 3, 4, 5}, {1, 4});
  const Tensor logits = model.forward(idx);
  REQUIRE(logits.size(2) == 128);
  // Untrained logits are near 0, so the loss is near ln(V) over the 37 real tokens only.
  CHECK(model.loss(logits, targets).to_vector<double>()[0] == Approx(std::log(37.0)).epsilon(0.05));
}

}  // namespace
}  // namespace tessera
