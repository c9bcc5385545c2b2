// Progressive layer drop in GPT (Note [Progressive layer drop] in parallel/layer_drop.h)
// against models built to compute what it should: a kept layer's sub-blocks divided by its
// divisor (the same model with those sub-blocks' output projections scaled), a dropped layer
// the identity (a model without it). Evaluation and theta 1 keep every layer unscaled.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "parallel/layer_drop.h"
#include "tests/testing.h"

namespace tessera {
namespace {

constexpr uint64_t kSeed = 5;
constexpr int64_t kStep = 3;

GptConfig config(int64_t layers) {
  GptConfig c;
  c.vocab_size = 29;
  c.block_size = 8;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.0;
  return c;
}

// `from`'s weights (those `to` has), with block b's attention and MLP output projections
// (weight and bias) divided by divisors[b].
void load_scaled(Gpt& to, const Gpt& from, const std::vector<double>& divisors) {
  StateDict state;
  for (const auto& [name, t] : from.state_dict()) {
    Tensor v = t.detach().clone();
    for (size_t b = 0; b < divisors.size(); ++b) {
      const std::string h = "transformer.h." + std::to_string(b) + ".";
      if (name.rfind(h + "attn.c_proj.", 0) == 0 || name.rfind(h + "mlp.c_proj.", 0) == 0) {
        v = (v / divisors[b]).detach();
      }
    }
    state.emplace_back(name, v);
  }
  to.load_state_dict(state, /*strict=*/false);
}

TEST_CASE("a kept layer is divided by its divisor, a dropped one skipped", "[gpt][layer_drop]") {
  Gpt model(config(2), kSeed);
  // theta 0.2, 2 layers: d = 0.4; layer 0 kept always, divided by 0.6; layer 1 kept with
  // probability 0.6, divided by 0.2.
  model.set_layer_drop(0.2, kStep);
  Gpt both(config(2), kSeed), first_only(config(1), kSeed);
  load_scaled(both, model, {0.6, 0.2});
  load_scaled(first_only, model, {0.6});
  const Tensor idx = from_vector(std::vector<int64_t>{1, 4, 9, 16, 25, 7, 3, 2}, {1, 8});
  int kept = 0, dropped = 0;
  for (int64_t forward = 0; forward < 12; ++forward) {
    const bool keep = parallel::layer_kept(kSeed, kStep, forward, 1, 0.6);
    const Tensor got = model.forward(idx);
    const Tensor want = keep ? both.forward(idx) : first_only.forward(idx);
    INFO("forward " << forward << (keep ? ": layer 1 kept" : ": layer 1 dropped"));
    CHECK(testing::max_abs_diff(got.to_vector<double>(), want.to_vector<double>()) < 1e-5);
    (keep ? kept : dropped) += 1;
  }
  CHECK(kept > 0);
  CHECK(dropped > 0);
}

TEST_CASE("evaluation and theta 1 keep every layer as it is", "[gpt][layer_drop]") {
  Gpt plain(config(2), kSeed), dropping(config(2), kSeed);
  const Tensor idx = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6}, {1, 8});
  const std::vector<float> want = plain.forward(idx).to_vector<float>();
  dropping.set_layer_drop(1.0, kStep);
  CHECK(dropping.forward(idx).to_vector<float>() == want);
  dropping.set_layer_drop(0.01, kStep);
  dropping.eval();
  CHECK(dropping.forward(idx).to_vector<float>() == want);
}

TEST_CASE("layer drop refuses activation checkpointing", "[gpt][layer_drop]") {
  Gpt model(config(2), kSeed);
  model.set_activation_checkpointing(1);
  CHECK_THAT(testing::error_of([&] { model.set_layer_drop(0.5, 0); }),
             Catch::Contains("expected a model without activation checkpointing"));
}

}  // namespace
}  // namespace tessera
