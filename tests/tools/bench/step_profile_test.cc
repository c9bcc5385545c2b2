// The step profile (tools/bench/step_profile.h) on a tiny GPT on the CPU, with a clock that
// ticks one millisecond per mark, so every self time is an exact count: the labels, the
// calls per label, and the rows adding up to the phases' lengths.
#include "tools/bench/step_profile.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "tests/tiny_gpt.h"

namespace tessera {
namespace {

// Mark i is at i milliseconds.
class TickClock final : public bench::MarkClock {
 public:
  size_t mark() override { return count_++; }
  std::vector<double> read() override {
    std::vector<double> ms;
    for (size_t i = 0; i < count_; ++i) ms.push_back(static_cast<double>(i));
    return ms;
  }
  size_t count() const { return count_; }

 private:
  size_t count_ = 0;
};

TEST_CASE("the step profile times every module forward and backward node once", "[bench]") {
  const GptConfig cfg = testing::tiny_gpt_config(37);
  Gpt model(cfg, 5);
  Generator gen(6);
  const Tensor idx = rand({2, 16}, gen, {DType::f32}, 0.0, 37.0).to(DType::i64);
  const Tensor targets = rand({2, 16}, gen, {DType::f32}, 0.0, 37.0).to(DType::i64);
  TickClock clock;
  bench::StepProfile profile(clock, model);
  Tensor loss;
  profile.phase("forward", [&] { loss = model.loss(model.forward(idx), targets); });
  profile.phase("backward", [&] { backward(loss); });

  std::map<std::string, bench::ProfileRow> forward, backward_rows;
  double total = 0;
  for (const bench::ProfileRow& r : profile.rows()) {
    (r.phase == "forward" ? forward : backward_rows)[r.label] = r;
    CHECK(r.ms > 0);
    total += r.ms;
  }
  // Each phase runs from its first mark to its last: all marks but one per phase.
  CHECK(total == static_cast<double>(clock.count() - 2));
  CHECK(forward.at("(outside)").calls == 1);
  CHECK(forward.at("(Gpt)").calls == 1);
  CHECK(forward.at("transformer.h.*.attn.c_attn (ColumnParallelLinear)").calls == cfg.n_layer);
  CHECK(forward.at("transformer.h.*.attn (CausalSelfAttention)").calls == cfg.n_layer);
  CHECK(forward.at("transformer.h.*.mlp (Mlp)").calls == cfg.n_layer);
  CHECK(forward.at("transformer.h.* (Block)").calls == cfg.n_layer);
  CHECK(forward.at("transformer.ln_f (LayerNorm)").calls == 1);
  // A leaf module with one op: enter, exit and nothing inside, one tick.
  CHECK(forward.at("transformer.ln_f (LayerNorm)").ms == 1.0);
  // Each node under the module whose forward recorded it.
  CHECK(backward_rows.at("causal_attention in transformer.h.*.attn (CausalSelfAttention)").calls ==
        cfg.n_layer);
  CHECK(backward_rows.at("layer_norm in transformer.h.*.ln_1 (LayerNorm)").calls == cfg.n_layer);
  CHECK(backward_rows.at("layer_norm in transformer.ln_f (LayerNorm)").calls == 1);
  CHECK(backward_rows.at("linear in transformer.h.*.mlp.c_fc (ColumnParallelLinear)").calls ==
        cfg.n_layer);
  CHECK(backward_rows.at("linear in transformer.wte (VocabParallelEmbedding)").calls ==
        1);                                          // the tied head
  CHECK(backward_rows.count("cross_entropy") == 1);  // the loss: outside every module
}

TEST_CASE("the step profile refuses spans outside a phase and unclosed spans", "[bench]") {
  const Gpt model(testing::tiny_gpt_config(37), 5);
  TickClock clock;
  bench::StepProfile profile(clock, model);
  CHECK_THROWS_WITH(profile.enter(model), Catch::Contains("outside any phase"));
  profile.begin_phase("forward");
  CHECK_THROWS_WITH(profile.begin_phase("backward"), Catch::Contains("inside another phase"));
  profile.enter(model);
  CHECK_THROWS_WITH(profile.rows(), Catch::Contains("still open"));
}

}  // namespace
}  // namespace tessera
