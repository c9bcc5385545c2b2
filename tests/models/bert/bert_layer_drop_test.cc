// Progressive layer drop in BERT (Note [Progressive layer drop] in parallel/layer_drop.h):
// a kept layer's two branches are divided by its divisor before their post-LN residual sums
// (the same model with those branches' output projections scaled), a dropped layer is the
// identity (a model without it); evaluation keeps every layer as it is.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/factories.h"
#include "models/bert/bert.h"
#include "parallel/layer_drop.h"
#include "tests/models/bert/tiny_bert.h"
#include "tests/testing.h"

namespace tessera {
namespace {

constexpr uint64_t kSeed = 4;
constexpr int64_t kStep = 7;

BertConfig config(int64_t layers) {
  BertConfig c = testing::tiny_bert(8);
  c.n_layer = layers;
  return c;
}

// `from`'s weights (those `to` has), with layer l's two output projections divided by
// divisors[l].
void load_scaled(Bert& to, const Bert& from, const std::vector<double>& divisors) {
  StateDict state;
  for (const auto& [name, t] : from.state_dict()) {
    Tensor v = t.detach().clone();
    for (size_t l = 0; l < divisors.size(); ++l) {
      const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
      if (name.rfind(p + "attention.output.dense.", 0) == 0 ||
          name.rfind(p + "output.dense.", 0) == 0) {
        v = (v / divisors[l]).detach();
      }
    }
    state.emplace_back(name, v);
  }
  to.load_state_dict(state, /*strict=*/false);
}

TEST_CASE("a kept BERT layer's branches are divided, a dropped layer skipped",
          "[bert][layer_drop]") {
  Bert model(config(2), kSeed);
  // theta 0.2, 2 layers: layer 0 always kept, divided by 0.6; layer 1 kept with
  // probability 0.6, divided by 0.2.
  model.set_layer_drop(0.2, kStep);
  Bert both(config(2), kSeed), first_only(config(1), kSeed);
  load_scaled(both, model, {0.6, 0.2});
  load_scaled(first_only, model, {0.6});
  const Tensor ids = from_vector(std::vector<int64_t>{1, 4, 9, 16, 25, 7, 3, 2}, {1, 8});
  int kept = 0, dropped = 0;
  for (int64_t forward = 0; forward < 12; ++forward) {
    const bool keep = parallel::layer_kept(kSeed, kStep, forward, 1, 0.6);
    const Tensor got = model.forward(ids);
    const Tensor want = keep ? both.forward(ids) : first_only.forward(ids);
    INFO("forward " << forward << (keep ? ": layer 1 kept" : ": layer 1 dropped"));
    CHECK(testing::max_abs_diff(got.to_vector<double>(), want.to_vector<double>()) < 1e-4);
    (keep ? kept : dropped) += 1;
  }
  CHECK(kept > 0);
  CHECK(dropped > 0);
  model.eval();
  Bert plain(config(2), kSeed);
  CHECK(model.forward(ids).to_vector<float>() == plain.forward(ids).to_vector<float>());
}

}  // namespace
}  // namespace tessera
