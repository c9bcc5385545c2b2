// The backward engine: accumulation, retain_graph, no-grad, hooks and seeds.
#include "autograd/engine.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "autograd/ops.h"
#include "autograd/record.h"
#include "core/allocator.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

Tensor leaf(std::vector<double> v) {
  Tensor t = from_vector(v);
  t.set_requires_grad(true);
  return t;
}

TEST_CASE("a leaf used twice gets the sum of both paths", "[engine]") {
  Tensor x = leaf({1.0, -2.0, 3.0});
  Tensor y = sum(add(mul(x, x), x));  // d/dx = 2x + 1
  backward(y);
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3.0, -3.0, 7.0});
}

TEST_CASE("gradients accumulate across backward calls until cleared", "[engine]") {
  Tensor x = leaf({2.0});
  backward(mul(x, x));
  backward(mul(x, x));
  CHECK(x.grad().item<double>() == 8.0);
  x.set_grad(Tensor());
  backward(mul(x, scalar_like(x, 5.0)));
  CHECK(x.grad().item<double>() == 5.0);
}

TEST_CASE("a leaf's gradient does not alias another leaf's", "[engine]") {
  Tensor a = leaf({1.0, 2.0});
  Tensor b = leaf({3.0, 4.0});
  backward(sum(add(a, b)));  // both receive the same incoming tensor
  a.grad().fill_(0.0);
  CHECK(b.grad().to_vector<double>() == std::vector<double>{1.0, 1.0});
}

TEST_CASE("summing into a gradient in place never changes one that is shared", "[engine]") {
  // Later nodes run first: s hands one tensor to both y and w; a then sums into y's
  // gradient while w still waits for b. Summing in place there would change w's too.
  Tensor x = leaf({0.5, -1.0});
  Tensor v = leaf({0.25, 0.75});
  const Tensor y = exp(x);
  const Tensor w = exp(v);
  const Tensor b = mul(w, w);
  const Tensor a = mul(y, y);
  const Tensor s = add(y, w);
  backward(add(add(sum(s), sum(a)), sum(b)));  // d/dy = 1 + 2y, d/dw = 1 + 2w
  for (const auto& [leaf_in, leaf_out] : {std::pair{x, y}, std::pair{v, w}}) {
    const std::vector<double> out = leaf_out.to_vector<double>();
    const std::vector<double> grad = leaf_in.grad().to_vector<double>();
    for (size_t i = 0; i < out.size(); ++i) {
      CHECK(grad[i] == Approx((1 + 2 * out[i]) * out[i]).epsilon(1e-12));
    }
  }
}

TEST_CASE("an embedding adds its rows into its weight's gradient unless that is shared",
          "[engine]") {
  // Note [Gradients added in place]. Later nodes run first. In the tied graph the head's
  // gradient reaches w first and the embedding adds its rows into it in place. In the
  // shared graph add hands one tensor to w and to exp's node, which runs after the
  // embedding: adding the rows in place there would change v's gradient too.
  const int64_t vocab = 6, channels = 3;
  Generator gen(3);
  const TensorOptions f64{DType::f64};
  Tensor w = randn({vocab, channels}, gen, f64);
  w.set_requires_grad(true);
  const Tensor ids = from_vector<int64_t>({1, 4, 1});
  const Tensor c_rows = randn({3, channels}, gen, f64);  // d loss / d embedding(w, ids)
  // The embedding's part of d loss / dw: c_rows scattered by id.
  std::vector<double> want(vocab * channels, 0.0);
  const std::vector<double> cr = c_rows.to_vector<double>();
  const std::vector<int64_t> iv = ids.to_vector<int64_t>();
  for (size_t n = 0; n < iv.size(); ++n) {
    for (int64_t c = 0; c < channels; ++c) want[iv[n] * channels + c] += cr[n * channels + c];
  }
  const auto check_grad = [](const Tensor& grad, const std::vector<double>& expected) {
    const std::vector<double> got = grad.to_vector<double>();
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expected[i]).epsilon(1e-12));
  };
  SECTION("tied head: summed in place") {
    const Tensor h = randn({2, channels}, gen, f64);
    const Tensor c_logits = randn({2, vocab}, gen, f64);
    const Tensor e = embedding(w, ids);
    const Tensor logits = linear(h, w, Tensor());  // (2, V), dw contiguous as GPT's head
    backward(add(sum(mul(logits, c_logits)), sum(mul(e, c_rows))));
    const std::vector<double> hv = h.to_vector<double>();
    const std::vector<double> cl = c_logits.to_vector<double>();
    for (int64_t v = 0; v < vocab; ++v) {
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t r = 0; r < 2; ++r) {
          want[v * channels + c] += cl[r * vocab + v] * hv[r * channels + c];
        }
      }
    }
    check_grad(w.grad(), want);
  }
  SECTION("shared gradient: never changed") {
    Tensor v = randn({vocab, channels}, gen, f64);
    v.set_requires_grad(true);
    const Tensor c_sum = randn({vocab, channels}, gen, f64);
    const Tensor y = exp(v);
    const Tensor e = embedding(w, ids);
    const Tensor u = add(w, y);
    backward(add(sum(mul(u, c_sum)), sum(mul(e, c_rows))));
    const std::vector<double> cs = c_sum.to_vector<double>();
    const std::vector<double> yv = y.to_vector<double>();
    std::vector<double> want_v(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) {
      want[i] += cs[i];
      want_v[i] = cs[i] * yv[i];
    }
    check_grad(w.grad(), want);
    check_grad(v.grad(), want_v);
  }
}

// Note [Gradients accumulated into leaves] in autograd/grad_slot.h.
TEST_CASE("gradients sum into a leaf's existing buffer, and the hook sees the total once",
          "[engine]") {
  const int64_t vocab = 5, channels = 3;
  Generator gen(8);
  const TensorOptions f64{DType::f64};
  Tensor w = randn({vocab, channels}, gen, f64);
  w.set_requires_grad(true);
  // The gradient a view into a larger flat buffer, as ZeRO's are, holding earlier sums.
  const Tensor flat = randn({vocab * channels + 4}, gen, f64);
  const std::vector<double> before = flat.narrow(0, 2, vocab * channels).to_vector<double>();
  w.set_grad(flat.narrow(0, 2, vocab * channels).view({vocab, channels}));
  int hooks = 0;
  std::vector<double> seen;
  register_post_accumulate_hook(w, [&](Tensor& g) {
    ++hooks;
    seen = g.to_vector<double>();
  });
  // A tied head and embedding and a third use, summed in the buffer.
  const Tensor ids = from_vector<int64_t>({1, 4, 1});
  const Tensor h = randn({2, channels}, gen, f64);
  const Tensor c_logits = randn({2, vocab}, gen, f64);
  const Tensor c_rows = randn({3, channels}, gen, f64);
  const Tensor logits = linear(h, w, Tensor());  // (2, V)
  const Tensor e = embedding(w, ids);            // (3, C)
  backward(add(add(sum(mul(logits, c_logits)), sum(mul(e, c_rows))), sum(w)));
  // Expected: the buffer's earlier values + c_logits^T h + the rows scattered + 1.
  std::vector<double> want = before;
  const std::vector<double> hv = h.to_vector<double>(), cl = c_logits.to_vector<double>(),
                            cr = c_rows.to_vector<double>();
  const std::vector<int64_t> iv = ids.to_vector<int64_t>();
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t c = 0; c < channels; ++c) {
      double& x = want[v * channels + c];
      x += 1.0;
      for (int64_t r = 0; r < 2; ++r) x += cl[r * vocab + v] * hv[r * channels + c];
    }
  }
  for (size_t n = 0; n < iv.size(); ++n) {
    for (int64_t c = 0; c < channels; ++c) want[iv[n] * channels + c] += cr[n * channels + c];
  }
  // Still the view of the flat buffer, which holds the total; the hook ran once on it.
  CHECK(w.grad().raw_data() == flat.narrow(0, 2, 1).raw_data());
  const std::vector<double> got = flat.narrow(0, 2, vocab * channels).to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-12));
  CHECK(hooks == 1);
  CHECK(seen == got);
}

TEST_CASE("an embedding's rows go straight into its weight's existing gradient", "[engine]") {
  // With a gradient buffer in place no dense (V, C) gradient is made: 6.4 MB here.
  const int64_t vocab = 100000, channels = 8;
  const TensorOptions f64{DType::f64};
  Tensor w = zeros({vocab, channels}, f64);
  w.set_requires_grad(true);
  w.set_grad(zeros({vocab, channels}, f64));
  const Tensor ids = from_vector<int64_t>({3, 7, 3});
  const Tensor loss = sum(embedding(w, ids));
  Allocator& cpu = allocator_for(Device::cpu());
  cpu.reset_peak();
  const int64_t start = cpu.stats().allocated;
  backward(loss);
  CHECK(cpu.stats().peak_allocated - start < vocab * channels * 8 / 4);
  const std::vector<double> g = w.grad().narrow(0, 3, 5).to_vector<double>();
  CHECK(g == std::vector<double>{2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
}

TEST_CASE("a leaf's gradient replaced while backward sums into it is an error", "[engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = leaf({3.0, 4.0});
  x.set_grad(from_vector<double>({0.0, 0.0}));  // summed into from the start
  // y is used last, so its hook runs before x's gradients are all added.
  register_post_accumulate_hook(y, [&](Tensor&) { x.set_grad(from_vector<double>({9.0, 9.0})); });
  const Tensor loss = add(sum(mul(x, x)), sum(mul(exp(x), y)));
  REQUIRE_THROWS_WITH(backward(loss), Catch::Contains("was replaced while backward summed into "
                                                      "it; expected it unchanged"));
}

TEST_CASE("a leaf that no gradient reaches keeps its buffer and runs no hook", "[engine]") {
  Tensor x = leaf({1.0, 2.0});
  x.set_grad(from_vector<double>({5.0, 6.0}));
  int hooks = 0;
  register_post_accumulate_hook(x, [&](Tensor&) { ++hooks; });
  Tensor y = mul(x, x).detach().clone();  // a value from x, then a node giving x nothing
  record_function("no_gradient", {x}, {&y}, [](const TensorList&) { return TensorList{Tensor()}; });
  backward(sum(y));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{5.0, 6.0});
  CHECK(hooks == 0);
}

TEST_CASE("the graph is freed after backward unless retained", "[engine]") {
  Tensor x = leaf({0.5});
  Tensor y = exp(x);
  backward(y, Tensor(), /*retain_graph=*/true);
  backward(y);  // allowed: the first call retained the graph
  CHECK(x.grad().item<double>() == Approx(2.0 * std::exp(0.5)));
  REQUIRE_THROWS_WITH(backward(y),
                      Catch::Contains("already freed") && Catch::Contains("retain_graph"));
}

TEST_CASE("no-grad mode records nothing", "[engine]") {
  Tensor x = leaf({1.0});
  Tensor y;
  {
    NoGradGuard guard;
    y = exp(x);
  }
  CHECK_FALSE(y.requires_grad());
  CHECK(y.is_leaf());
  Tensor z = exp(x);
  CHECK(z.requires_grad());
  CHECK_FALSE(z.is_leaf());
}

TEST_CASE("implicit seeds need one-element roots; explicit seeds must match", "[engine]") {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = mul(x, scalar_like(x, 3.0));
  REQUIRE_THROWS_WITH(backward(y), Catch::Contains("one-element root") && Catch::Contains("(2)"));
  REQUIRE_THROWS_WITH(backward(y, from_vector<double>({1.0})),
                      Catch::Contains("does not match root"));
  backward(y, from_vector<double>({1.0, -1.0}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{3.0, -3.0});
  REQUIRE_THROWS_WITH(backward(from_vector<double>({1.0})),
                      Catch::Contains("does not require grad"));
}

TEST_CASE("post-accumulate hooks run once per backward with the summed gradient", "[engine]") {
  Tensor x = leaf({1.0, 2.0});
  int calls = 0;
  std::vector<double> seen;
  register_post_accumulate_hook(x, [&](Tensor& g) {
    ++calls;
    seen = g.to_vector<double>();
  });
  backward(sum(add(mul(x, x), x)));
  CHECK(calls == 1);
  CHECK(seen == std::vector<double>{3.0, 5.0});
  Tensor y = exp(x);
  REQUIRE_THROWS_WITH(register_post_accumulate_hook(y, [](Tensor&) {}),
                      Catch::Contains("expected a leaf"));
}

TEST_CASE("later nodes run first: hooks fire in reverse order of use", "[engine]") {
  Tensor a = leaf({1.0});
  Tensor b = leaf({2.0});
  std::vector<char> order;
  register_post_accumulate_hook(a, [&](Tensor&) { order.push_back('a'); });
  register_post_accumulate_hook(b, [&](Tensor&) { order.push_back('b'); });
  Tensor h = exp(mul(a, a));    // a is used first
  Tensor out = sum(mul(h, b));  // b last: its gradient is ready first
  backward(out);
  CHECK(order == std::vector<char>{'b', 'a'});
}

TEST_CASE("raw views of a tensor that requires grad are refused under grad mode", "[engine]") {
  Tensor x = leaf({1.0, 2.0, 3.0, 4.0});
  REQUIRE_THROWS_WITH(x.view({2, 2}),
                      Catch::Contains("[view]") && Catch::Contains("tessera::view"));
  Tensor v = view(x, {2, 2});  // the differentiable view
  backward(sum(mul(v, v)));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2.0, 4.0, 6.0, 8.0});
  NoGradGuard guard;
  CHECK(x.view({2, 2}).shape() == Shape{2, 2});
}

TEST_CASE("a view shares storage with its base and its gradient flows back", "[engine]") {
  Tensor x = leaf({1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
  Tensor m = view(x, {2, 3});
  Tensor t = transpose(m, 0, 1);
  CHECK(t.storage().data() == x.storage().data());
  backward(sum(mul(t, from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2}))));
  // t[j][i] = m[i][j]; weight of m[i][j] is w[j][i] = 1 + 2 j + i.
  CHECK(x.grad().to_vector<double>() == std::vector<double>{1, 3, 5, 2, 4, 6});
}

}  // namespace
}  // namespace tessera
