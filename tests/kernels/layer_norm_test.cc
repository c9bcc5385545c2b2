#include "kernels/layer_norm.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "core/factories.h"
#include "core/parallel.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using tessera::testing::max_abs_diff;

using kernels::layer_norm;
using kernels::layer_norm_backward;

struct Reference {
  std::vector<double> y, mean, rstd;
};

// Layer norm of each last-dim row in double; w and b may be empty (no affine).
Reference reference(const Tensor& x, const std::vector<double>& w, const std::vector<double>& b,
                    double eps) {
  const std::vector<double> v = x.to_vector<double>();
  const int64_t cols = x.size(-1);
  const int64_t rows = x.numel() / cols;
  Reference out{std::vector<double>(v.size()), std::vector<double>(rows),
                std::vector<double>(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0;
    for (int64_t j = 0; j < cols; ++j) mean += v[r * cols + j] / cols;
    double var = 0.0;
    for (int64_t j = 0; j < cols; ++j) var += std::pow(v[r * cols + j] - mean, 2) / cols;
    const double rstd = 1 / std::sqrt(var + eps);
    out.mean[r] = mean;
    out.rstd[r] = rstd;
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (v[r * cols + j] - mean) * rstd;
      out.y[r * cols + j] = xhat * (w.empty() ? 1.0 : w[j]) + (b.empty() ? 0.0 : b[j]);
    }
  }
  return out;
}

std::vector<double> values(const Tensor& t) {
  return t.defined() ? t.to_vector<double>() : std::vector<double>();
}

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-12; }

// Gradient of sum(dy * y(t)) with respect to t by central differences, where `y_of`
// rebuilds the forward output from a perturbed copy of t (f64).
std::vector<double> numeric_grad(const std::function<Tensor(const Tensor&)>& y_of, const Tensor& t,
                                 const Tensor& dy) {
  std::vector<double> tv = t.to_vector<double>();
  const std::vector<double> dyv = dy.to_vector<double>();
  const auto loss = [&]() {
    const std::vector<double> y = y_of(from_vector(tv, t.shape())).to_vector<double>();
    double l = 0.0;
    for (size_t i = 0; i < y.size(); ++i) l += dyv[i] * y[i];
    return l;
  };
  std::vector<double> grad(tv.size());
  const double h = 1e-6;
  for (size_t i = 0; i < tv.size(); ++i) {
    const double saved = tv[i];
    tv[i] = saved + h;
    const double up = loss();
    tv[i] = saved - h;
    const double down = loss();
    tv[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

constexpr double kEps = 1e-5;

}  // namespace

TEST_CASE("layer_norm matches naive loops, with and without affine", "[layer_norm]") {
  Generator gen(1);
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = randn({2, 7, 13}, gen, {dtype}, 0.5, 2.0);
    const Tensor w = randn({13}, gen, {dtype});
    const Tensor b = randn({13}, gen, {dtype});
    const double tol = tolerance(dtype);
    SECTION("weight and bias") {
      const kernels::LayerNormOutput out = layer_norm(x, w, b, kEps);
      const Reference want = reference(x, values(w), values(b), kEps);
      REQUIRE(out.y.shape() == x.shape());
      REQUIRE(out.mean.shape() == Shape{2, 7});
      REQUIRE(out.rstd.shape() == Shape{2, 7});
      REQUIRE(out.mean.dtype() == dtype);
      REQUIRE(max_abs_diff(values(out.y), want.y) <= tol);
      REQUIRE(max_abs_diff(values(out.mean), want.mean) <= tol);
      REQUIRE(max_abs_diff(values(out.rstd), want.rstd) <= tol);
    }
    SECTION("weight only") {
      const kernels::LayerNormOutput out = layer_norm(x, w, Tensor(), kEps);
      REQUIRE(max_abs_diff(values(out.y), reference(x, values(w), {}, kEps).y) <= tol);
    }
    SECTION("no affine, large eps") {
      const kernels::LayerNormOutput out = layer_norm(x, Tensor(), Tensor(), 0.5);
      REQUIRE(max_abs_diff(values(out.y), reference(x, {}, {}, 0.5).y) <= tol);
    }
    SECTION("non-contiguous x") {
      const Tensor xt = randn({13, 7}, gen, {dtype}).transpose(0, 1);  // (7, 13)
      const kernels::LayerNormOutput out = layer_norm(xt, w, b, kEps);
      REQUIRE(max_abs_diff(values(out.y), reference(xt, values(w), values(b), kEps).y) <= tol);
    }
  }
}

// The f32 forward has a vector path of its own that reads the next row while it writes this
// one (Note [Memory-bound kernels] in kernels/cpu/avx512_math.h): every width around a
// vector, one row and many per thread, with and without the affine parameters, and rows
// far from zero, where a one-pass variance would lose its digits.
TEST_CASE("f32 layer_norm matches naive loops at every width and row count", "[layer_norm]") {
  const tessera::testing::ScopedThreads threads(3);  // chunks starting at odd rows too
  Generator gen(5);
  // Rows centred at 1000 round their f32 sums at about 1e3 * cols * 2^-24, which the mean,
  // and so every xhat, carries; the two-pass variance keeps rstd within the same bound.
  for (const auto [centre, tol] : {std::pair{0.5, 1e-5}, std::pair{1000.0, 1e-3}}) {
    for (int64_t cols : {1, 15, 16, 17, 768, 1000}) {
      for (int64_t rows : {1, 3, 130}) {
        const Tensor x = randn({rows, cols}, gen, {DType::f32}, centre, 1.0);
        const Tensor w = randn({cols}, gen, {DType::f32});
        const Tensor b = randn({cols}, gen, {DType::f32});
        INFO(rows << " x " << cols << " centred at " << centre);
        const kernels::LayerNormOutput out = layer_norm(x, w, b, kEps);
        const Reference want = reference(x, values(w), values(b), kEps);
        CHECK(max_abs_diff(values(out.y), want.y) <= tol);
        CHECK(max_abs_diff(values(out.mean), want.mean) <= tol);
        CHECK(max_abs_diff(values(out.rstd), want.rstd) <= tol * want.rstd[0]);
        CHECK(max_abs_diff(values(layer_norm(x, Tensor(), Tensor(), kEps).y),
                           reference(x, {}, {}, kEps).y) <= tol);
      }
    }
  }
}

TEST_CASE("f32 layer_norm gives the same bits at any thread count", "[layer_norm]") {
  Generator gen(6);
  for (const Shape& shape : {Shape{130, 768}, Shape{131, 17}}) {
    const Tensor x = randn(shape, gen, {DType::f32});
    const Tensor w = randn({shape[1]}, gen, {DType::f32});
    const Tensor b = randn({shape[1]}, gen, {DType::f32});
    std::vector<std::vector<float>> bits;
    for (int n : {1, 2, 3}) {
      const tessera::testing::ScopedThreads threads(n);
      const kernels::LayerNormOutput out = layer_norm(x, w, b, kEps);
      std::vector<float> all = out.y.to_vector<float>();
      for (const Tensor& t : {out.mean, out.rstd}) {
        const std::vector<float> v = t.to_vector<float>();
        all.insert(all.end(), v.begin(), v.end());
      }
      bits.push_back(all);
    }
    CHECK(bits[1] == bits[0]);
    CHECK(bits[2] == bits[0]);
  }
}

TEST_CASE("layer_norm backward matches finite differences", "[layer_norm]") {
  Generator gen(2);
  const Tensor x = randn({3, 7}, gen, {DType::f64}, 0.3, 1.5);
  const Tensor w = randn({7}, gen, {DType::f64});
  const Tensor b = randn({7}, gen, {DType::f64});
  const Tensor dy = randn({3, 7}, gen, {DType::f64});
  const kernels::LayerNormOutput out = layer_norm(x, w, b, kEps);
  const kernels::LayerNormGrads grads = layer_norm_backward(dy, x, w, out.mean, out.rstd);
  const auto y = [&](const Tensor& xx, const Tensor& ww, const Tensor& bb) {
    return layer_norm(xx, ww, bb, kEps).y;
  };
  const std::vector<double> dx = numeric_grad([&](const Tensor& t) { return y(t, w, b); }, x, dy);
  const std::vector<double> dw = numeric_grad([&](const Tensor& t) { return y(x, t, b); }, w, dy);
  const std::vector<double> db = numeric_grad([&](const Tensor& t) { return y(x, w, t); }, b, dy);
  REQUIRE(max_abs_diff(values(grads.dx), dx) <= 1e-7);
  REQUIRE(max_abs_diff(values(grads.dweight), dw) <= 1e-7);
  REQUIRE(max_abs_diff(values(grads.dbias), db) <= 1e-7);

  SECTION("without weight") {
    const kernels::LayerNormOutput plain = layer_norm(x, Tensor(), Tensor(), kEps);
    const kernels::LayerNormGrads g = layer_norm_backward(dy, x, Tensor(), plain.mean, plain.rstd);
    REQUIRE_FALSE(g.dweight.defined());
    REQUIRE_FALSE(g.dbias.defined());
    const std::vector<double> want =
        numeric_grad([&](const Tensor& t) { return y(t, Tensor(), Tensor()); }, x, dy);
    REQUIRE(max_abs_diff(values(g.dx), want) <= 1e-7);
  }
  SECTION("f32 agrees with f64") {
    const Tensor x32 = x.to(DType::f32);
    const Tensor w32 = w.to(DType::f32);
    const kernels::LayerNormOutput o32 = layer_norm(x32, w32, b.to(DType::f32), kEps);
    const kernels::LayerNormGrads g32 =
        layer_norm_backward(dy.to(DType::f32), x32, w32, o32.mean, o32.rstd);
    REQUIRE(max_abs_diff(values(g32.dx), values(grads.dx)) <= 1e-5);
    REQUIRE(max_abs_diff(values(g32.dweight), values(grads.dweight)) <= 1e-5);
    REQUIRE(max_abs_diff(values(g32.dbias), values(grads.dbias)) <= 1e-5);
  }
}

TEST_CASE("layer_norm backward reduces many rows across threads", "[layer_norm]") {
  Generator gen(3);
  const int64_t rows = 96, cols = 1029;
  const Tensor x = randn({rows, cols}, gen, {DType::f64});
  const Tensor w = randn({cols}, gen, {DType::f64});
  const Tensor dy = randn({rows, cols}, gen, {DType::f64});
  const kernels::LayerNormOutput out = layer_norm(x, w, Tensor(), kEps);
  const kernels::LayerNormGrads grads = layer_norm_backward(dy, x, w, out.mean, out.rstd);
  // Naive dweight and dbias: sums over rows of dy * xhat and dy.
  const Reference ref = reference(x, {}, {}, kEps);  // y = xhat
  const std::vector<double> dyv = values(dy);
  std::vector<double> dw(cols, 0.0), db(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      dw[j] += dyv[r * cols + j] * ref.y[r * cols + j];
      db[j] += dyv[r * cols + j];
    }
  }
  REQUIRE(max_abs_diff(values(grads.dweight), dw) <= 1e-10);
  REQUIRE(max_abs_diff(values(grads.dbias), db) <= 1e-10);
}

TEST_CASE("layer_norm rejects bad inputs", "[layer_norm]") {
  const Tensor x = zeros({2, 13});
  REQUIRE_THROWS_WITH(layer_norm(x, zeros({12}), Tensor(), kEps),
                      Catch::Contains("[layer_norm] expected weight of shape (13), found (12)"));
  REQUIRE_THROWS_WITH(layer_norm(x, Tensor(), zeros({13}), kEps),
                      Catch::Contains("[layer_norm] expected a weight with the bias"));
  REQUIRE_THROWS_WITH(layer_norm(x, zeros({13}, {DType::f64}), Tensor(), kEps),
                      Catch::Contains("[layer_norm] dtypes differ: x f32 vs weight f64"));
  REQUIRE_THROWS_WITH(layer_norm(x, Tensor(), Tensor(), -1.0),
                      Catch::Contains("[layer_norm] expected eps >= 0, found -1"));
  REQUIRE_THROWS_WITH(
      layer_norm(zeros({2, 13}, {DType::i32}), Tensor(), Tensor(), kEps),
      Catch::Contains("[layer_norm] expected x of dtype f32, f64, f16 or bf16, found i32"));
  REQUIRE_THROWS_WITH(
      layer_norm_backward(x, x, Tensor(), zeros({3}), zeros({2})),
      Catch::Contains("[layer_norm_backward] expected mean of shape (2), found (3)"));
  REQUIRE_THROWS_WITH(
      layer_norm_backward(zeros({2, 12}), x, Tensor(), zeros({2}), zeros({2})),
      Catch::Contains("[layer_norm_backward] shapes differ: x (2, 13) vs dy (2, 12)"));
}

}  // namespace tessera
