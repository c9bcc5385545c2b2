// Progressive layer drop's schedule and per-layer rule (Note [Progressive layer drop] in
// parallel/layer_drop.h) against DeepSpeed's formula (values worked in double precision,
// as tests/unit/runtime/test_pld.py checks them) and its BERT example's keep
// probabilities; the draws keep each layer at its probability.
#include "parallel/layer_drop.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "tests/testing.h"

namespace tessera::parallel {
namespace {

LayerDropConfig parse(const nlohmann::json& section) {
  const nlohmann::json doc = {{"progressive_layer_drop", section}};
  JsonObjectReader root(doc, "config");
  LayerDropConfig c = LayerDropConfig::from_json(root.object("progressive_layer_drop"));
  root.finish();
  return c;
}

TEST_CASE("theta follows DeepSpeed's schedule, one step behind", "[layer_drop]") {
  const LayerDropConfig c = parse({{"enabled", true}, {"theta", 0.5}, {"gamma", 0.001}});
  const std::vector<std::pair<int64_t, double>> want = {
      {0, 1.0},         {1, 0.9995},      {100, 0.952419},  {1000, 0.683940},
      {2000, 0.567668}, {5000, 0.503369}, {10000, 0.500023}};
  for (const auto& [t, theta] : want) {
    INFO("t " << t);
    CHECK(layer_drop_theta(c, t) == Approx(theta).margin(5e-7));
  }
  CHECK(layer_drop_theta_for_step(c, 0) == 1.0);
  CHECK(layer_drop_theta_for_step(c, 1) == 1.0);
  CHECK(layer_drop_theta_for_step(c, 2) == layer_drop_theta(c, 1));
}

TEST_CASE("layer i keeps with 1 - i d and divides by 1 - (i + 1) d", "[layer_drop]") {
  // DeepSpeed's BERT example at L = 12, theta 0.5: d = 1/24.
  CHECK(layer_keep(0, 12, 0.5).probability == 1.0);
  CHECK(layer_keep(0, 12, 0.5).divisor == Approx(23.0 / 24));
  CHECK(layer_keep(1, 12, 0.5).probability == Approx(0.9583).margin(5e-5));
  CHECK(layer_keep(11, 12, 0.5).probability == Approx(0.5417).margin(5e-5));
  CHECK(layer_keep(11, 12, 0.5).divisor == Approx(0.5));  // the last layer's: 1 / theta
  CHECK(layer_keep(5, 12, 1.0).probability == 1.0);
  CHECK(layer_keep(5, 12, 1.0).divisor == 1.0);
}

TEST_CASE("the draws keep each layer at its probability, the same for the same key",
          "[layer_drop]") {
  for (const double p : {0.9, 0.6, 0.25}) {
    int kept = 0;
    const int n = 20000;
    for (int f = 0; f < n; ++f) kept += layer_kept(7, f / 4, f % 4, 3, p);
    INFO("p " << p);
    CHECK(static_cast<double>(kept) / n == Approx(p).margin(0.01));  // 3 sigma is < 0.011
  }
  CHECK(layer_kept(7, 5, 2, 3, 0.5) == layer_kept(7, 5, 2, 3, 0.5));
  int differ = 0;
  for (int layer = 0; layer < 64; ++layer) {
    differ += layer_kept(7, 5, 2, layer, 0.5) != layer_kept(8, 5, 2, layer, 0.5);
  }
  CHECK(differ > 10);  // another seed draws otherwise
  CHECK(layer_kept(7, 5, 2, 3, 1.0));
}

TEST_CASE("theta and gamma are required and checked when enabled", "[layer_drop]") {
  CHECK(testing::error_of([] {
          parse({{"enabled", true}, {"theta", 0.5}});
        }) == "[config] $.progressive_layer_drop.gamma: required key missing");
  CHECK(testing::error_of([] {
          parse({{"enabled", true}, {"theta", 0.0}, {"gamma", 0.1}});
        }) ==
        "[config] $.progressive_layer_drop.theta: expected a keep probability in (0, 1], found 0");
  CHECK_FALSE(parse({{"enabled", false}, {"theta", 0.5}, {"gamma", 0.001}}).enabled);
}

}  // namespace
}  // namespace tessera::parallel
