// dense_gelu_dense (autograd/ops/linalg.h) on the CPU runs the kernels of linear, gelu and
// linear in the same order: the same output and gradients, bit for bit, with and without
// biases, and x's gradient handed to reduce_input_grad.
#include <catch2/catch.hpp>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/philox.h"
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

}  // namespace
}  // namespace tessera
