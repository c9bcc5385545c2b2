// The user-defined fused op is gradchecked and matches the framework's composed ops.
#include "examples/custom_op/fused_bias_gelu.h"

#include <catch2/catch.hpp>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/factories.h"

namespace tessera {
namespace {

TEST_CASE("a custom fused op passes gradcheck", "[custom_op]") {
  Generator g(3);
  Tensor x = randn({2, 3, 5}, g, {DType::f64});
  Tensor b = randn({5}, g, {DType::f64});
  x.set_requires_grad(true);
  b.set_requires_grad(true);
  GradcheckResult r = gradcheck(
      [](const TensorList& in) { return example::fused_bias_gelu(in[0], in[1]); }, {x, b});
  INFO(r.message);
  CHECK(r.ok);
}

TEST_CASE("the custom op equals gelu(x + bias) from built-in ops", "[custom_op]") {
  Generator g(4);
  Tensor x = randn({4, 7}, g);
  Tensor b = randn({7}, g);
  const std::vector<float> fused = example::fused_bias_gelu(x, b).to_vector<float>();
  const std::vector<float> composed = gelu(add(x, b)).to_vector<float>();
  REQUIRE(fused.size() == composed.size());
  for (size_t i = 0; i < fused.size(); ++i) CHECK(fused[i] == Approx(composed[i]).margin(1e-5));
  REQUIRE_THROWS_WITH(example::fused_bias_gelu(x, randn({6}, g)),
                      Catch::Contains("[fused_bias_gelu] expected bias of shape (7), found (6)"));
}

}  // namespace
}  // namespace tessera
