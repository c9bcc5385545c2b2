// The op cases of op_cases.h.
#include "tests/autograd/op_cases.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <utility>

#include "autograd/engine.h"
#include "core/factories.h"
#include "kernels/block_sparse.h"

namespace tessera::testing {

Tensor Side::leaf(const Shape& shape, uint64_t seed) const {
  Tensor t = data(shape, seed);
  t.set_requires_grad(true);
  return t;
}

Tensor Side::nc_leaf(const Shape& shape, uint64_t seed) const {
  Shape stored = shape;
  std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
  Tensor t = data(stored, seed).transpose(-1, -2);
  REQUIRE_FALSE(t.is_contiguous());
  t.set_requires_grad(true);
  return t;
}

Tensor Side::leaf_in(const Shape& shape, uint64_t seed, double lo, double hi) const {
  Generator g(seed);
  Tensor t = place(rand(shape, g, {DType::f32}, lo, hi));
  t.set_requires_grad(true);
  return t;
}

Tensor Side::data(const Shape& shape, uint64_t seed) const {
  Generator g(seed);
  return place(randn(shape, g));
}

Tensor Side::ids(const std::vector<int64_t>& values, const Shape& shape) const {
  return from_vector(values, shape).to(device_);
}

Tensor Side::place(const Tensor& host_f32) const {
  return host_f32.to(value_dtype_).to(dtype_).to(device_);
}

OpResult run_op_case(const OpCase& c, const Side& side) {
  OpResult r;
  r.inputs = c.inputs(side);
  const Tensor out = c.fn(r.inputs);
  REQUIRE(out.requires_grad());
  Generator g(999);
  backward(out, side.place(randn(out.shape(), g)).to(out.dtype()));
  r.out = out.detach();
  for (const Tensor& t : r.inputs) r.grads.push_back(t.requires_grad() ? t.grad() : Tensor());
  return r;
}

double check_close(const Tensor& got, const Tensor& want, double tol, Device device) {
  REQUIRE(got.defined() == want.defined());
  if (!got.defined()) return 0.0;
  CHECK(got.device() == device);
  REQUIRE(shape_str(got.shape()) == shape_str(want.shape()));
  const std::vector<double> g = got.to_vector<double>();
  const std::vector<double> w = want.to_vector<double>();
  double rms = 0.0;
  for (double v : w) rms += v * v;
  rms = w.empty() ? 0.0 : std::sqrt(rms / static_cast<double>(w.size()));
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double err = std::abs(g[i] - w[i]);
    const double bound = std::abs(w[i]) + rms;
    if (bound > 0) worst = std::max(worst, err / bound);
    if (!(err <= tol * bound) && bad++ == 0) first = i;
  }
  INFO(bad << " of " << w.size() << " elements differ; first at " << first << ": got "
           << (bad ? g[first] : 0.0) << ", want " << (bad ? w[first] : 0.0) << " (tol " << tol
           << ", rms " << rms << ")");
  CHECK(bad == 0);
  return worst;
}

using Fn = std::function<Tensor(const TensorList&)>;
using Inputs = std::function<TensorList(const Side&)>;

std::vector<OpCase> all_op_cases() {
  std::vector<OpCase> c;
  auto add_case = [&](const std::string& op, const std::string& variant, Fn fn, Inputs inputs,
                      double tol = kTol) {
    c.push_back({op, variant, std::move(fn), std::move(inputs), tol});
  };
  auto unary = [&](const std::string& op, Tensor (*f)(const Tensor&), double lo, double hi) {
    add_case(
        op, lo < hi ? "positive inputs" : "non-contiguous",
        [f](const TensorList& x) { return f(x[0]); },
        [=](const Side& s) {
          return TensorList{lo < hi ? s.leaf_in({37, 29}, 11, lo, hi) : s.nc_leaf({37, 29}, 11)};
        });
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
    const Fn fn = [f](const TensorList& x) { return f(x[0], x[1]); };
    add_case(op, "broadcast (17, 33) x (33)", fn, [](const Side& s) {
      return TensorList{s.leaf({17, 33}, 1), s.leaf_in({33}, 2, 0.5, 1.5)};
    });
    add_case(op, "broadcast (17, 1) x (1, 33)", fn, [](const Side& s) {
      return TensorList{s.leaf_in({17, 1}, 3, 0.5, 1.5), s.leaf_in({1, 33}, 4, 0.5, 1.5)};
    });
    add_case(op, "non-contiguous", fn, [](const Side& s) {
      return TensorList{s.nc_leaf({17, 33}, 5), s.leaf_in({17, 33}, 6, 0.5, 1.5)};
    });
  };
  binary("add", add);
  binary("sub", sub);
  binary("mul", mul);
  binary("div", div);
  add_case(
      "pow", "tensor exponent, broadcast", [](const TensorList& x) { return pow(x[0], x[1]); },
      [](const Side& s) {
        return TensorList{s.leaf_in({17, 33}, 7, 0.5, 2.0), s.leaf({33}, 8)};
      });
  add_case(
      "pow", "scalar exponent", [](const TensorList& x) { return pow(x[0], 3.0); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 33}, 9)};
      });
  add_case(
      "where", "broadcast condition",
      [](const TensorList& x) { return where(gt(x[2], scalar_like(x[2], 0.0)), x[0], x[1]); },
      [](const Side& s) {
        return TensorList{s.leaf({17, 33}, 10), s.nc_leaf({17, 33}, 11), s.data({33}, 12)};
      });

  add_case(
      "sum", "dim 1 keepdim, non-contiguous",
      [](const TensorList& x) { return sum(x[0], {1}, true); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 33}, 13)};
      });
  add_case(
      "sum", "all dims", [](const TensorList& x) { return sum(x[0]); },
      [](const Side& s) {
        return TensorList{s.leaf({4, 17, 33}, 14)};
      });
  add_case(
      "sum", "long rows", [](const TensorList& x) { return sum(x[0], {-1}); },
      [](const Side& s) {
        return TensorList{s.leaf({2, 5000}, 15)};
      });
  add_case(
      "mean", "dims {0, 2}",
      [](const TensorList& x) {
        return mean(x[0], {0, 2});
      },
      [](const Side& s) {
        return TensorList{s.leaf({4, 17, 33}, 16)};
      });
  add_case(
      "var", "dim -1 unbiased, non-contiguous", [](const TensorList& x) { return var(x[0], {-1}); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 45}, 17)};
      });
  add_case(
      "var", "all dims biased", [](const TensorList& x) { return var(x[0], {}, 0); },
      [](const Side& s) {
        return TensorList{s.leaf({17, 33}, 18)};
      });
  add_case(
      "max", "dim 1, non-contiguous", [](const TensorList& x) { return max(x[0], 1); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 45}, 19)};
      });
  add_case(
      "max", "dim 0 keepdim", [](const TensorList& x) { return max(x[0], 0, true); },
      [](const Side& s) {
        return TensorList{s.leaf({45, 17}, 20)};
      });

  add_case(
      "matmul", "batched a, shared non-contiguous b",
      [](const TensorList& x) { return matmul(x[0], x[1]); },
      [](const Side& s) {
        return TensorList{s.leaf({2, 37, 64}, 21), s.nc_leaf({64, 45}, 22)};
      },
      kTf32Tol);
  add_case(
      "matmul", "batched a and b", [](const TensorList& x) { return matmul(x[0], x[1]); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({2, 37, 64}, 23), s.leaf({2, 64, 45}, 24)};
      },
      kTf32Tol);
  add_case(
      "linear", "3-D input with bias", [](const TensorList& x) { return linear(x[0], x[1], x[2]); },
      [](const Side& s) {
        return TensorList{s.leaf({2, 37, 64}, 25), s.nc_leaf({45, 64}, 26), s.leaf({45}, 27)};
      },
      kTf32Tol);
  add_case(
      "linear", "no bias", [](const TensorList& x) { return linear(x[0], x[1], Tensor()); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({37, 64}, 28), s.leaf({45, 64}, 29)};
      },
      kTf32Tol);
  add_case(
      "add_layer_norm", "affine, h used again",
      [](const TensorList& x) {
        const auto [h, y] = add_layer_norm(x[0], x[1], x[2], x[3]);
        return add(mul(h, y), y);
      },
      [](const Side& s) {
        return TensorList{s.leaf({4, 33, 768}, 102), s.leaf({4, 33, 768}, 103), s.leaf({768}, 104),
                          s.leaf({768}, 105)};
      });
  add_case(
      "dense_gelu_dense", "3-D input with biases",
      [](const TensorList& x) { return dense_gelu_dense(x[0], x[1], x[2], x[3], x[4]); },
      [](const Side& s) {
        return TensorList{s.leaf({2, 37, 64}, 90), s.leaf({128, 64}, 91), s.leaf({128}, 92),
                          s.nc_leaf({48, 128}, 93), s.leaf({48}, 94)};
      },
      kTf32Tol);

  add_case(
      "softmax", "non-contiguous", [](const TensorList& x) { return softmax(x[0]); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 129}, 30)};
      });
  add_case(
      "log_softmax", "non-contiguous", [](const TensorList& x) { return log_softmax(x[0]); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 129}, 31)};
      });
  add_case(
      "layer_norm", "affine, 3-D", [](const TensorList& x) { return layer_norm(x[0], x[1], x[2]); },
      [](const Side& s) {
        return TensorList{s.leaf({2, 17, 96}, 32), s.leaf({96}, 33), s.leaf({96}, 34)};
      });
  add_case(
      "layer_norm", "no affine, non-contiguous",
      [](const TensorList& x) { return layer_norm(x[0], Tensor(), Tensor()); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({33, 45}, 35)};
      });
  add_case(
      "embedding", "repeated ids", [](const TensorList& x) { return embedding(x[0], x[1]); },
      [](const Side& s) {
        return TensorList{s.leaf({50, 64}, 36),
                          s.ids({1, 4, 1, 0, 6, 4, 49, 4, 1, 1, 0, 9}, {3, 4})};
      });
  add_case(
      "cross_entropy", "with ignored rows",
      [](const TensorList& x) { return cross_entropy(x[0], x[1]); },
      [](const Side& s) {
        return TensorList{s.leaf({9, 1000}, 37), s.ids({2, -100, 6, 0, 3, -100, 999, 500, 1}, {9})};
      });
  add_case(
      "cross_entropy", "over the first 1000 of 1024 columns",
      [](const TensorList& x) { return cross_entropy(x[0], x[1], -100, 1000); },
      [](const Side& s) {
        return TensorList{s.leaf({9, 1024}, 91), s.ids({2, -100, 6, 0, 3, -100, 999, 500, 1}, {9})};
      });
  add_case(
      "dropout", "p = 0.3, fixed stream",
      [](const TensorList& x) {
        Generator g(77);
        return dropout(x[0], 0.3, g);
      },
      [](const Side& s) {
        return TensorList{s.nc_leaf({37, 45}, 38)};
      });
  add_case(
      "causal_attention", "B=2, H=3, T=100, D=64",
      [](const TensorList& x) { return causal_attention(x[0], x[1], x[2]); },
      [](const Side& s) {
        return TensorList{s.leaf({2, 3, 100, 64}, 39), s.leaf({2, 3, 100, 64}, 40),
                          s.nc_leaf({2, 3, 100, 64}, 41)};
      },
      kTf32Tol);
  add_case(
      "causal_attention", "B=1, H=2, T=77, D=32",
      [](const TensorList& x) { return causal_attention(x[0], x[1], x[2]); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({1, 2, 77, 32}, 42), s.leaf({1, 2, 77, 32}, 43),
                          s.leaf({1, 2, 77, 32}, 44)};
      },
      kTf32Tol);

  // Block-sparse ops: 2 heads of 3 blocks of 16 (T = 48) with an empty block row.
  const auto layout_on = [](Device device) {
    return kernels::make_block_layout(
        from_vector(std::vector<int64_t>{1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 1},
                    {2, 3, 3}),
        16, device);
  };
  constexpr int64_t kNnz = 9;  // nonzero blocks of that layout
  add_case(
      "sdd_matmul", "B=2, H=2, T=48, D=64",
      [layout_on](const TensorList& x) { return sdd_matmul(x[0], x[1], layout_on(x[0].device())); },
      [](const Side& s) {
        return TensorList{s.leaf({2, 2, 48, 64}, 64), s.nc_leaf({2, 2, 48, 64}, 65)};
      },
      kTf32Tol);
  add_case(
      "sparse_softmax", "scale 0.125, causal, additive key padding",
      [layout_on](const TensorList& x) {
        kernels::BlockSoftmaxOptions o;
        o.scale = 0.125;
        o.causal = true;
        o.key_padding_mask = x[1];
        return sparse_softmax(x[0], layout_on(x[0].device()), o);
      },
      [](const Side& s) {
        return TensorList{s.leaf({2, kNnz, 16, 16}, 66), s.data({2, 48}, 67)};
      });
  add_case(
      "dsd_matmul", "B=2, H=2, T=48, D=64",
      [layout_on](const TensorList& x) { return dsd_matmul(x[0], x[1], layout_on(x[0].device())); },
      [](const Side& s) {
        return TensorList{s.leaf({2, kNnz, 16, 16}, 68), s.nc_leaf({2, 2, 48, 64}, 69)};
      },
      kTf32Tol);

  add_case(
      "reshape", "non-contiguous (copies)",
      [](const TensorList& x) {
        return mul(reshape(x[0], {5, -1}), scalar_like(x[0], 3.0));
      },
      [](const Side& s) {
        return TensorList{s.nc_leaf({15, 16}, 45)};
      });
  add_case(
      "view", "contiguous",
      [](const TensorList& x) {
        return exp(view(x[0], {16, 15}));
      },
      [](const Side& s) {
        return TensorList{s.leaf({4, 60}, 46)};
      });
  add_case(
      "transpose", "3-D", [](const TensorList& x) { return exp(transpose(x[0], 0, 2)); },
      [](const Side& s) {
        return TensorList{s.leaf({4, 7, 9}, 47)};
      });
  add_case(
      "permute", "3-D",
      [](const TensorList& x) {
        return exp(permute(x[0], {2, 0, 1}));
      },
      [](const Side& s) {
        return TensorList{s.nc_leaf({4, 7, 9}, 48)};
      });
  add_case(
      "narrow", "dim 1", [](const TensorList& x) { return exp(narrow(x[0], 1, 3, 20)); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 33}, 49)};
      });
  add_case(
      "slice", "step 2", [](const TensorList& x) { return exp(slice(x[0], 0, 1, 30, 2)); },
      [](const Side& s) {
        return TensorList{s.leaf({33, 17}, 50)};
      });
  add_case(
      "select", "dim 0", [](const TensorList& x) { return exp(select(x[0], 0, -1)); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 33}, 51)};
      });
  add_case(
      "expand", "size-1 and new dims",
      [](const TensorList& x) {
        return exp(expand(x[0], {4, 17, 33}));
      },
      [](const Side& s) {
        return TensorList{s.leaf({17, 1}, 52)};
      });
  add_case(
      "squeeze", "dim 1", [](const TensorList& x) { return exp(squeeze(x[0], 1)); },
      [](const Side& s) {
        return TensorList{s.leaf({17, 1, 9}, 53)};
      });
  add_case(
      "unsqueeze", "dim -1", [](const TensorList& x) { return exp(unsqueeze(x[0], -1)); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 9}, 54)};
      });
  add_case(
      "contiguous", "non-contiguous", [](const TensorList& x) { return exp(contiguous(x[0])); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 33}, 55)};
      });
  add_case(
      "cast", "through f64",
      [](const TensorList& x) { return cast(exp(cast(x[0], DType::f64)), x[0].dtype()); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 33}, 56)};
      });
  // The gradient is rounded to bf16 on both sides, from f64 on one and f32 on the other:
  // one bf16 ulp (2^-8) apart at most.
  add_case(
      "cast", "through bf16",
      [](const TensorList& x) { return mul(cast(cast(x[0], DType::bf16), x[0].dtype()), x[1]); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 33}, 57), s.leaf({17, 33}, 58)};
      },
      1e-2);
  add_case(
      "cat", "three inputs, dim 1",
      [](const TensorList& x) {
        return exp(cat({x[0], x[1], x[2]}, 1));
      },
      [](const Side& s) {
        return TensorList{s.leaf({17, 30}, 59), s.nc_leaf({17, 20}, 60), s.leaf({17, 1}, 61)};
      });
  add_case(
      "split", "pieces used unevenly",
      [](const TensorList& x) {
        TensorList parts = split(x[0], {10, 30, 20}, 1);
        return cat({mul(parts[2], parts[2]), parts[0]}, 1);
      },
      [](const Side& s) {
        return TensorList{s.nc_leaf({17, 60}, 62)};
      });
  add_case(
      "index_select", "repeated indices",
      [](const TensorList& x) { return index_select(x[0], 0, x[1]); },
      [](const Side& s) {
        return TensorList{s.nc_leaf({50, 33}, 63), s.ids({4, 0, 4, 49, 4}, {5})};
      });
  return c;
}

}  // namespace tessera::testing
