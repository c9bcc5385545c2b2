// add_layer_norm (autograd/ops/nn.h) on the CPU runs the add's and layer_norm's kernels: the
// same h, norm and gradients, bit for bit, as x + delta then layer_norm, with h used again
// besides the norm (its gradient is the sum of both uses); and its kernels name what they
// expected.
#include <catch2/catch.hpp>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "kernels/layer_norm.h"

namespace tessera {
namespace {

Tensor leaf(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(shape, gen);
  t.set_requires_grad(true);
  return t;
}

TEST_CASE("add_layer_norm gives the add's and layer_norm's bits", "[autograd]") {
  for (const bool affine : {true, false}) {
    DYNAMIC_SECTION((affine ? "affine" : "no affine")) {
      const Tensor x = leaf({3, 4, 20}, 1), delta = leaf({3, 4, 20}, 2);
      const Tensor w = affine ? leaf({20}, 3) : Tensor(), b = affine ? leaf({20}, 4) : Tensor();
      const auto use = [](const Tensor& h, const Tensor& y) { return sum(mul(add(h, y), y)); };
      const Tensor h_want = add(x, delta);
      const Tensor y_want = layer_norm(h_want, w, b);
      backward(use(h_want, y_want));
      std::vector<std::vector<float>> want;
      for (const Tensor* t : {&x, &delta, &w, &b}) {
        if (!t->defined()) continue;
        want.push_back(t->grad().to_vector<float>());
        t->set_grad(Tensor());
      }
      const auto [h, y] = add_layer_norm(x, delta, w, b);
      CHECK(h.to_vector<float>() == h_want.to_vector<float>());
      CHECK(y.to_vector<float>() == y_want.to_vector<float>());
      backward(use(h, y));
      size_t i = 0;
      for (const Tensor* t : {&x, &delta, &w, &b}) {
        if (!t->defined()) continue;
        CHECK(t->grad().to_vector<float>() == want[i++]);
      }
    }
  }
}

TEST_CASE("add_layer_norm's kernels name mismatched operands", "[autograd]") {
  CHECK_THROWS_WITH(kernels::add_layer_norm(zeros({2, 4}), zeros({2, 5}), Tensor(), Tensor(), 1e-5),
                    Catch::Contains("add_layer_norm"));
  const kernels::AddLayerNormOutput f =
      kernels::add_layer_norm(zeros({2, 4}), zeros({2, 4}), Tensor(), Tensor(), 1e-5);
  CHECK_THROWS_WITH(kernels::add_layer_norm_backward(zeros({2, 4}), zeros({2, 3}), f.h, Tensor(),
                                                     f.norm.mean, f.norm.rstd),
                    Catch::Contains("add_layer_norm_backward"));
}

}  // namespace
}  // namespace tessera
