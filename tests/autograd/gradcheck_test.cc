// Every differentiable op in autograd/op_list.h against f64 central differences, on
// broadcasting and non-contiguous inputs.
#include "autograd/gradcheck.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "autograd/op_list.h"
#include "autograd/ops.h"
#include "autograd/record.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

struct Case {
  std::string op;
  std::string variant;
  std::function<Tensor(const TensorList&)> fn;
  std::function<TensorList()> inputs;
  GradcheckOptions options = {};
};

Tensor leaf_of(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// A contiguous f64 leaf with N(0, 1) entries.
Tensor leaf(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return leaf_of(randn(shape, g, {DType::f64}));
}

// A non-contiguous f64 leaf: the transpose of a contiguous tensor (last two dims).
Tensor nc_leaf(const Shape& shape, uint64_t seed) {
  Shape swapped = shape;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  Generator g(seed);
  Tensor base = randn(swapped, g, {DType::f64});
  Tensor t = base.transpose(-1, -2);
  REQUIRE_FALSE(t.is_contiguous());
  return leaf_of(t);
}

// A leaf with entries in [lo, hi), for ops defined on positive inputs.
Tensor leaf_in(const Shape& shape, uint64_t seed, double lo, double hi) {
  Generator g(seed);
  return leaf_of(rand(shape, g, {DType::f64}, lo, hi));
}

Tensor ids(const std::vector<int64_t>& v, const Shape& shape) { return from_vector(v, shape); }

std::vector<Case> all_cases() {
  std::vector<Case> c;
  auto unary = [&](const std::string& op, Tensor (*f)(const Tensor&), double lo, double hi) {
    c.push_back({op, "non-contiguous", [f](const TensorList& x) { return f(x[0]); },
                 [=] {
                   Tensor t = lo < hi ? leaf_in({4, 3}, 11, lo, hi) : nc_leaf({3, 5}, 11);
                   return TensorList{t};
                 }});
  };
  unary("neg", neg, 0, 0);
  unary("exp", exp, 0, 0);
  unary("log", log, 0.5, 2.0);
  unary("sqrt", sqrt, 0.5, 2.0);
  unary("rsqrt", rsqrt, 0.5, 2.0);
  unary("tanh", tanh, 0, 0);
  unary("relu", relu, 0, 0);
  unary("gelu", gelu, 0, 0);
  unary("sigmoid", sigmoid, 0, 0);

  auto binary = [&](const std::string& op, Tensor (*f)(const Tensor&, const Tensor&)) {
    c.push_back({op, "broadcast (3,4) x (4)", [f](const TensorList& x) { return f(x[0], x[1]); },
                 [] {
                   return TensorList{leaf({3, 4}, 1), leaf_in({4}, 2, 0.5, 1.5)};
                 }});
    c.push_back({op, "broadcast (3,1) x (1,4)", [f](const TensorList& x) { return f(x[0], x[1]); },
                 [] {
                   return TensorList{leaf_in({3, 1}, 3, 0.5, 1.5), leaf_in({1, 4}, 4, 0.5, 1.5)};
                 }});
    c.push_back({op, "non-contiguous", [f](const TensorList& x) { return f(x[0], x[1]); },
                 [] {
                   return TensorList{nc_leaf({3, 4}, 5), leaf_in({3, 4}, 6, 0.5, 1.5)};
                 }});
  };
  binary("add", add);
  binary("sub", sub);
  binary("mul", mul);
  binary("div", div);
  c.push_back({"pow", "tensor exponent, broadcast",
               [](const TensorList& x) { return pow(x[0], x[1]); },
               [] {
                 return TensorList{leaf_in({3, 4}, 7, 0.5, 2.0), leaf({4}, 8)};
               }});
  c.push_back({"pow", "scalar exponent", [](const TensorList& x) { return pow(x[0], 3.0); },
               [] {
                 return TensorList{nc_leaf({3, 4}, 9)};
               }});
  c.push_back(
      {"where", "broadcast condition",
       [](const TensorList& x) {
         Tensor cond = gt(x[2], scalar_like(x[2], 0.0));
         return where(cond, x[0], x[1]);
       },
       [] {
         Generator g(10);
         return TensorList{leaf({3, 4}, 11), nc_leaf({3, 4}, 12), randn({4}, g, {DType::f64})};
       }});

  c.push_back({"sum", "dim 1 keepdim, non-contiguous",
               [](const TensorList& x) { return sum(x[0], {1}, true); },
               [] {
                 return TensorList{nc_leaf({3, 4}, 13)};
               }});
  c.push_back({"sum", "all dims", [](const TensorList& x) { return sum(x[0]); },
               [] {
                 return TensorList{leaf({2, 3, 4}, 14)};
               }});
  c.push_back({"mean", "dims {0, 2}",
               [](const TensorList& x) {
                 return mean(x[0], {0, 2});
               },
               [] {
                 return TensorList{leaf({2, 3, 4}, 15)};
               }});
  c.push_back({"var", "dim -1 unbiased, non-contiguous",
               [](const TensorList& x) { return var(x[0], {-1}); },
               [] {
                 return TensorList{nc_leaf({3, 5}, 16)};
               }});
  c.push_back({"var", "all dims biased", [](const TensorList& x) { return var(x[0], {}, 0); },
               [] {
                 return TensorList{leaf({2, 3}, 17)};
               }});
  c.push_back({"max", "dim 1", [](const TensorList& x) { return max(x[0], 1); },
               [] {
                 return TensorList{nc_leaf({3, 5}, 18)};
               }});
  c.push_back({"max", "dim 0 keepdim", [](const TensorList& x) { return max(x[0], 0, true); },
               [] {
                 return TensorList{leaf({4, 3}, 19)};
               }});

  c.push_back({"matmul", "batched a, shared b",
               [](const TensorList& x) { return matmul(x[0], x[1]); },
               [] {
                 return TensorList{leaf({2, 3, 4}, 20), nc_leaf({4, 5}, 21)};
               }});
  c.push_back({"matmul", "batched a and b", [](const TensorList& x) { return matmul(x[0], x[1]); },
               [] {
                 return TensorList{nc_leaf({2, 3, 4}, 22), leaf({2, 4, 5}, 23)};
               }});
  c.push_back({"linear", "3-D input with bias",
               [](const TensorList& x) { return linear(x[0], x[1], x[2]); },
               [] {
                 return TensorList{leaf({2, 3, 4}, 24), nc_leaf({5, 4}, 25), leaf({5}, 26)};
               }});
  c.push_back({"linear", "no bias",
               [](const TensorList& x) { return linear(x[0], x[1], Tensor()); },
               [] {
                 return TensorList{nc_leaf({3, 4}, 27), leaf({2, 4}, 28)};
               }});
  // h feeds a second use (h * 3) besides the norm: its gradient comes from both.
  c.push_back({"add_layer_norm", "affine, h used again",
               [](const TensorList& x) {
                 const auto [h, y] = add_layer_norm(x[0], x[1], x[2], x[3]);
                 return add(mul(h, y), y);
               },
               [] {
                 return TensorList{leaf({2, 3, 5}, 98), nc_leaf({2, 3, 5}, 99), leaf({5}, 100),
                                   leaf({5}, 101)};
               }});
  c.push_back({"dense_gelu_dense", "3-D input with biases",
               [](const TensorList& x) { return dense_gelu_dense(x[0], x[1], x[2], x[3], x[4]); },
               [] {
                 return TensorList{leaf({2, 3, 4}, 90), nc_leaf({6, 4}, 91), leaf({6}, 92),
                                   leaf({5, 6}, 93), leaf({5}, 94)};
               }});
  c.push_back(
      {"dense_gelu_dense", "no biases",
       [](const TensorList& x) { return dense_gelu_dense(x[0], x[1], Tensor(), x[2], Tensor()); },
       [] {
         return TensorList{nc_leaf({3, 4}, 95), leaf({6, 4}, 96), nc_leaf({2, 6}, 97)};
       }});

  c.push_back({"softmax", "non-contiguous", [](const TensorList& x) { return softmax(x[0]); },
               [] {
                 return TensorList{nc_leaf({3, 7}, 29)};
               }});
  c.push_back({"log_softmax", "non-contiguous",
               [](const TensorList& x) { return log_softmax(x[0]); },
               [] {
                 return TensorList{nc_leaf({3, 7}, 30)};
               }});
  c.push_back({"layer_norm", "affine, 3-D",
               [](const TensorList& x) { return layer_norm(x[0], x[1], x[2]); },
               [] {
                 return TensorList{leaf({2, 3, 6}, 31), leaf({6}, 32), leaf({6}, 33)};
               }});
  c.push_back({"layer_norm", "no affine, non-contiguous",
               [](const TensorList& x) { return layer_norm(x[0], Tensor(), Tensor()); },
               [] {
                 return TensorList{nc_leaf({4, 5}, 34)};
               }});
  c.push_back({"embedding", "repeated ids",
               [](const TensorList& x) {
                 return embedding(x[0], ids({1, 4, 1, 0, 6, 4}, {2, 3}));
               },
               [] {
                 return TensorList{leaf({7, 4}, 35)};
               }});
  c.push_back({"cross_entropy", "with an ignored row",
               [](const TensorList& x) {
                 return cross_entropy(x[0], ids({2, -100, 6, 0, 3}, {5}));
               },
               [] {
                 return TensorList{leaf({5, 7}, 36)};
               }});
  c.push_back({"cross_entropy", "over the first 5 of 7 columns (a padded vocabulary)",
               [](const TensorList& x) {
                 return cross_entropy(x[0], ids({2, -100, 4, 0, 3}, {5}), -100, 5);
               },
               [] {
                 return TensorList{leaf({5, 7}, 37)};
               }});
  c.push_back({"dropout", "p = 0.3, fixed stream",
               [](const TensorList& x) {
                 Generator g(77);
                 return dropout(x[0], 0.3, g);
               },
               [] {
                 return TensorList{nc_leaf({4, 6}, 37)};
               }});
  c.push_back({"causal_attention", "B=1, H=2, T=5, D=3",
               [](const TensorList& x) { return causal_attention(x[0], x[1], x[2]); },
               [] {
                 return TensorList{leaf({1, 2, 5, 3}, 38), leaf({1, 2, 5, 3}, 39),
                                   nc_leaf({1, 2, 5, 3}, 40)};
               }});

  // Block-sparse ops over 2 heads of 3 blocks of 2 positions; head 1 has an empty block
  // row and an empty block column (T = 6).
  const kernels::BlockLayout layout = kernels::make_block_layout(
      ids({1, 0, 1, 1, 1, 0, 0, 1, 1, /**/ 1, 0, 0, 0, 0, 0, 1, 0, 1}, {2, 3, 3}), 2,
      Device::cpu());
  c.push_back({"sdd_matmul", "B=2, H=2, T=6, D=3",
               [layout](const TensorList& x) { return sdd_matmul(x[0], x[1], layout); },
               [] {
                 return TensorList{leaf({2, 2, 6, 3}, 58), nc_leaf({2, 2, 6, 3}, 59)};
               }});
  c.push_back({"sparse_softmax", "scale 0.7, causal, additive key padding",
               [layout](const TensorList& x) {
                 kernels::BlockSoftmaxOptions o;
                 o.scale = 0.7;
                 o.causal = true;
                 Generator g(60);
                 o.key_padding_mask = randn({2, 6}, g, {DType::f64});
                 return sparse_softmax(x[0], layout, o);
               },
               [layout] {
                 return TensorList{leaf({2, layout.nnz, 2, 2}, 61)};
               }});
  c.push_back({"dsd_matmul", "B=2, H=2, T=6, D=3",
               [layout](const TensorList& x) { return dsd_matmul(x[0], x[1], layout); },
               [layout] {
                 return TensorList{leaf({2, layout.nnz, 2, 2}, 62), nc_leaf({2, 2, 6, 3}, 63)};
               }});

  c.push_back({"reshape", "non-contiguous (copies)",
               [](const TensorList& x) {
                 return mul(reshape(x[0], {2, -1}), scalar_like(x[0], 3.0));
               },
               [] {
                 return TensorList{nc_leaf({3, 4}, 41)};
               }});
  c.push_back({"view", "contiguous",
               [](const TensorList& x) {
                 return exp(view(x[0], {4, 3}));
               },
               [] {
                 return TensorList{leaf({2, 6}, 42)};
               }});
  c.push_back({"transpose", "3-D", [](const TensorList& x) { return exp(transpose(x[0], 0, 2)); },
               [] {
                 return TensorList{leaf({2, 3, 4}, 43)};
               }});
  c.push_back({"permute", "3-D",
               [](const TensorList& x) {
                 return exp(permute(x[0], {2, 0, 1}));
               },
               [] {
                 return TensorList{nc_leaf({2, 3, 4}, 44)};
               }});
  c.push_back({"narrow", "dim 1", [](const TensorList& x) { return exp(narrow(x[0], 1, 1, 2)); },
               [] {
                 return TensorList{nc_leaf({3, 4}, 45)};
               }});
  c.push_back({"narrow", "dim -1 from 0 (padded logits)",
               [](const TensorList& x) { return exp(narrow(x[0], -1, 0, 3)); },
               [] {
                 return TensorList{leaf({3, 5}, 147)};
               }});
  c.push_back({"slice", "step 2", [](const TensorList& x) { return exp(slice(x[0], 0, 1, 5, 2)); },
               [] {
                 return TensorList{leaf({5, 3}, 46)};
               }});
  c.push_back({"select", "dim 0", [](const TensorList& x) { return exp(select(x[0], 0, -1)); },
               [] {
                 return TensorList{nc_leaf({3, 4}, 47)};
               }});
  c.push_back({"expand", "size-1 and new dims",
               [](const TensorList& x) {
                 return exp(expand(x[0], {2, 3, 4}));
               },
               [] {
                 return TensorList{leaf({3, 1}, 48)};
               }});
  c.push_back({"squeeze", "dim 1", [](const TensorList& x) { return exp(squeeze(x[0], 1)); },
               [] {
                 return TensorList{leaf({3, 1, 2}, 49)};
               }});
  c.push_back({"unsqueeze", "dim -1", [](const TensorList& x) { return exp(unsqueeze(x[0], -1)); },
               [] {
                 return TensorList{nc_leaf({3, 2}, 50)};
               }});
  c.push_back({"contiguous", "non-contiguous",
               [](const TensorList& x) { return exp(contiguous(x[0])); },
               [] {
                 return TensorList{nc_leaf({3, 4}, 51)};
               }});
  GradcheckOptions loose;  // through f32: rounding noise of ~1e-7 relative
  loose.eps = 1e-3;
  loose.atol = 1e-4;
  loose.rtol = 1e-3;
  c.push_back({"cast", "f64 -> f32 -> f64",
               [](const TensorList& x) { return cast(exp(cast(x[0], DType::f32)), DType::f64); },
               [] {
                 return TensorList{nc_leaf({3, 4}, 52)};
               },
               loose});
  c.push_back({"cat", "three inputs, dim 1",
               [](const TensorList& x) {
                 return exp(cat({x[0], x[1], x[2]}, 1));
               },
               [] {
                 return TensorList{leaf({2, 3}, 53), nc_leaf({2, 2}, 54), leaf({2, 1}, 55)};
               }});
  c.push_back({"split", "pieces used unevenly",
               [](const TensorList& x) {
                 TensorList parts = split(x[0], {1, 3, 2}, 1);
                 return cat({mul(parts[2], parts[2]), parts[0]}, 1);
               },
               [] {
                 return TensorList{nc_leaf({3, 6}, 56)};
               }});
  // cat's gradients are adjacent views of one buffer, which split's backward joins without a
  // copy (Note [Split gradients without a copy]); swapped, they are not adjacent in order.
  c.push_back({"split", "gradients that are adjacent views, dim 1",
               [](const TensorList& x) {
                 return exp(cat(split(x[0], {1, 3, 2}, 1), 1));
               },
               [] {
                 return TensorList{nc_leaf({3, 6}, 58)};
               }});
  c.push_back({"split", "gradients that are adjacent views, dim 0",
               [](const TensorList& x) {
                 return exp(cat(split(x[0], {2, 2}, 0), 0));
               },
               [] {
                 return TensorList{leaf({4, 3}, 59)};
               }});
  c.push_back({"split", "gradients that are views out of order",
               [](const TensorList& x) {
                 TensorList parts = split(x[0], {2, 4}, 1);
                 return exp(cat({parts[1], parts[0]}, 1));
               },
               [] {
                 return TensorList{leaf({3, 6}, 60)};
               }});
  c.push_back({"index_select", "repeated indices",
               [](const TensorList& x) {
                 return index_select(x[0], 0, ids({4, 0, 4}, {3}));
               },
               [] {
                 return TensorList{nc_leaf({5, 3}, 57)};
               }});
  return c;
}

TEST_CASE("every listed differentiable op has a gradcheck case", "[gradcheck]") {
  std::set<std::string> covered;
  for (const Case& c : all_cases()) covered.insert(c.op);
  for (std::string_view op : kDifferentiableOps) {
    INFO("op without a gradcheck case: " << op);
    CHECK(covered.count(std::string(op)) == 1);
  }
}

TEST_CASE("gradients match f64 central differences", "[gradcheck]") {
  for (const Case& c : all_cases()) {
    DYNAMIC_SECTION(c.op << " / " << c.variant) {
      GradcheckResult r = gradcheck(c.fn, c.inputs(), c.options);
      INFO(r.message);
      CHECK(r.ok);
    }
  }
}

TEST_CASE("gradcheck catches a wrong gradient", "[gradcheck]") {
  // A deliberately wrong backward: y = x^2 recorded with gradient x instead of 2x.
  auto wrong = [](const TensorList& x) {
    Tensor y = mul(x[0].detach(), x[0].detach());
    y = y.detach();
    record_function("wrong_square", {x[0]}, {&y},
                    [x = x[0].detach()](const TensorList& g) { return TensorList{mul(g[0], x)}; });
    return y;
  };
  GradcheckResult r = gradcheck(wrong, {leaf({3}, 60)});
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.message, Catch::Contains("analytic"));
}

}  // namespace
TEST_CASE("cross_entropy rejects a class count outside [1, C]", "[gradcheck]") {
  const Tensor logits = leaf({3, 6}, 38);
  const Tensor targets = ids({0, 1, 2}, {3});
  for (const int64_t classes : {0, 7}) {
    REQUIRE_THROWS_WITH(cross_entropy(logits, targets, -100, classes),
                        Catch::Contains("[cross_entropy] expected classes in [1, 6] for logits of "
                                        "shape (3, 6), found " +
                                        std::to_string(classes)));
  }
}

}  // namespace tessera
