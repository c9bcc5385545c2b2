// The fused ops of autograd/ops on the CPU run their parts' kernels in the same order, so
// they give the separate ops' output and gradients bit for bit: dense_gelu_dense (linear,
// gelu, linear; x's gradient handed to reduce_input_grad) with and without biases, and
// add_layer_norm (add, layer_norm) with h used again besides the norm. Their kernels name
// what they expected.
#include <catch2/catch.hpp>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/philox.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"

namespace tessera {
namespace {

Tensor leaf(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(shape, gen);
  t.set_requires_grad(true);
  return t;
}

TEST_CASE("dense_gelu_dense gives the three ops' bits", "[autograd]") {
  for (const bool biases : {true, false}) {
    DYNAMIC_SECTION((biases ? "with" : "without") << " biases") {
      const Tensor x = leaf({2, 5, 16}, 1), w1 = leaf({24, 16}, 2), w2 = leaf({8, 24}, 4);
      const Tensor b1 = biases ? leaf({24}, 3) : Tensor(), b2 = biases ? leaf({8}, 5) : Tensor();
      Generator gen(6);
      const Tensor seed = randn({2, 5, 8}, gen);
      const Tensor want = linear(gelu(linear(x, w1, b1)), w2, b2);
      backward(want, seed);
      std::vector<std::vector<float>> want_grads;
      for (const Tensor* t : {&x, &w1, &b1, &w2, &b2}) {
        if (!t->defined()) continue;
        want_grads.push_back(t->grad().to_vector<float>());
        t->set_grad(Tensor());
      }
      Tensor handed;
      const Tensor got =
          dense_gelu_dense(x, w1, b1, w2, b2, [&](const Tensor& dx) { handed = dx; });
      CHECK(got.to_vector<float>() == want.to_vector<float>());
      backward(got, seed);
      size_t i = 0;
      for (const Tensor* t : {&x, &w1, &b1, &w2, &b2}) {
        if (!t->defined()) continue;
        CHECK(t->grad().to_vector<float>() == want_grads[i++]);
      }
      REQUIRE(handed.defined());
      CHECK(handed.to_vector<float>() == x.grad().to_vector<float>());
    }
  }
}

TEST_CASE("dense_gelu_dense and its kernels name mismatched shapes", "[autograd]") {
  const Tensor x = zeros({3, 4}), w1 = zeros({6, 4}), w2 = zeros({2, 5});
  CHECK_THROWS_WITH(dense_gelu_dense(x, w1, Tensor(), w2, Tensor()),
                    "[dense_gelu_dense] expected x (..., in), w1 (hidden, in) and w2 (out, "
                    "hidden), found (3, 4), (6, 4) and (2, 5)");
  CHECK_THROWS_WITH(
      kernels::linear_gelu(zeros({2, 3, 4}), w1, Tensor()),
      "[linear_gelu] expected x (R, K) and weight (N, K), found (2, 3, 4) and (6, 4)");
  CHECK_THROWS_WITH(kernels::gelu_input_grads(zeros({3, 2}), w2, zeros({3, 4})),
                    "[gelu_input_grads] expected g (R, N), weight (N, K) and pre (R, K), found (3, "
                    "2), (2, 5) and (3, 4)");
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
