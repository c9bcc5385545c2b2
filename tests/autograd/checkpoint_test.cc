// Activation checkpointing recomputes a segment and gives the same gradients.
#include "autograd/checkpoint.h"

#include <catch2/catch.hpp>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/factories.h"

namespace tessera {
namespace {

struct Mlp {
  Tensor w1, w2;
  explicit Mlp(uint64_t seed) {
    Generator g(seed);
    w1 = randn({6, 4}, g, {DType::f64}, 0.0, 0.5);
    w2 = randn({4, 6}, g, {DType::f64}, 0.0, 0.5);
    w1.set_requires_grad(true);
    w2.set_requires_grad(true);
  }
  // Dropout between the layers draws from `gen`.
  Tensor forward(const Tensor& x, Generator& gen, int* calls) const {
    ++*calls;
    return linear(dropout(gelu(linear(x, w1, Tensor())), 0.25, gen), w2, Tensor());
  }
};

TEST_CASE("checkpointed segment: same loss and gradients, one recomputation", "[checkpoint]") {
  Generator data(5);
  Tensor x0 = randn({3, 5, 4}, data, {DType::f64});

  // Reference: no checkpointing.
  Mlp ref(1);
  Generator ref_gen(99);
  int ref_calls = 0;
  Tensor xr = x0.clone();
  xr.set_requires_grad(true);
  Tensor ref_loss =
      sum(mul(ref.forward(xr, ref_gen, &ref_calls), ref.forward(xr, ref_gen, &ref_calls)));
  backward(ref_loss);

  // Checkpointed: the first segment is recomputed in backward with the same dropout mask.
  Mlp ck(1);
  Generator ck_gen(99);
  int calls = 0;
  Tensor xc = x0.clone();
  xc.set_requires_grad(true);
  TensorList first = checkpoint(
      [&](const TensorList& in) { return TensorList{ck.forward(in[0], ck_gen, &calls)}; }, {xc},
      {&ck_gen});
  Tensor ck_loss = sum(mul(first[0], ck.forward(xc, ck_gen, &calls)));
  CHECK(calls == 2);
  backward(ck_loss);
  CHECK(calls == 3);                           // exactly one recomputation
  CHECK(ck_gen.offset() == ref_gen.offset());  // the stream resumes where it was

  CHECK(ck_loss.item<double>() == Approx(ref_loss.item<double>()).epsilon(1e-12));
  auto same = [](const Tensor& a, const Tensor& b) {
    std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
    REQUIRE(va.size() == vb.size());
    for (size_t i = 0; i < va.size(); ++i) CHECK(va[i] == Approx(vb[i]).margin(1e-12));
  };
  same(xc.grad(), xr.grad());
  same(ck.w1.grad(), ref.w1.grad());
  same(ck.w2.grad(), ref.w2.grad());
}

TEST_CASE("checkpoint reaches parameters even when no input requires grad", "[checkpoint]") {
  Mlp m(2);
  Generator gen(3);
  int calls = 0;
  Generator data(6);
  Tensor x = randn({2, 4}, data, {DType::f64});
  TensorList out = checkpoint(
      [&](const TensorList& in) { return TensorList{m.forward(in[0], gen, &calls)}; }, {x}, {&gen});
  backward(sum(out[0]));
  REQUIRE(m.w1.grad().defined());
  REQUIRE(m.w2.grad().defined());
}

}  // namespace
}  // namespace tessera
