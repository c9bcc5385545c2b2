#include "kernels/cross_entropy.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using tessera::testing::max_abs_diff;

using kernels::cross_entropy;
using kernels::cross_entropy_backward;

struct Reference {
  double loss = 0.0;
  std::vector<double> lse;
  std::vector<double> dlogits;  // for dloss = 1
};

// Loss, row log-sum-exps and gradient in double with naive loops.
Reference reference(const Tensor& logits, const std::vector<int64_t>& targets,
                    int64_t ignore_index) {
  const std::vector<double> x = logits.to_vector<double>();
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  Reference out;
  out.lse.resize(rows);
  out.dlogits.assign(x.size(), 0.0);
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double max = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) max = std::max(max, x[r * vocab + j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(x[r * vocab + j] - max);
    out.lse[r] = max + std::log(sum);
    if (targets[r] == ignore_index) continue;
    ++count;
    out.loss += out.lse[r] - x[r * vocab + targets[r]];
  }
  if (count == 0) return out;
  out.loss /= count;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == ignore_index) continue;
    for (int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(x[r * vocab + j] - out.lse[r]);
      out.dlogits[r * vocab + j] = (p - (j == targets[r] ? 1.0 : 0.0)) / count;
    }
  }
  return out;
}

std::vector<double> scaled(std::vector<double> v, double s) {
  for (double& x : v) x *= s;
  return v;
}

template <class I>
Tensor index_tensor(const std::vector<int64_t>& targets) {
  return from_vector(std::vector<I>(targets.begin(), targets.end()));
}

constexpr int64_t kIgnore = -100;

}  // namespace

TEST_CASE("cross_entropy matches naive loops for f32/f64 and i32/i64 targets", "[cross_entropy]") {
  Generator gen(1);
  const std::vector<int64_t> targets = {3, 0, kIgnore, 12, 7, kIgnore, 5};
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    const Tensor logits = randn({7, 13}, gen, {dtype}, 0.0, 2.0);
    const Reference want = reference(logits, targets, kIgnore);
    for (const Tensor& t : {index_tensor<int64_t>(targets), index_tensor<int32_t>(targets)}) {
      const kernels::CrossEntropyOutput out = cross_entropy(logits, t);
      REQUIRE(out.loss.dim() == 0);
      REQUIRE(out.loss.dtype() == dtype);
      REQUIRE(out.lse.shape() == Shape{7});
      REQUIRE(out.loss.item<double>() == Approx(want.loss).epsilon(tol));
      REQUIRE(max_abs_diff(out.lse.to_vector<double>(), want.lse) <= tol);
      const Tensor dloss = scalar_tensor(0.7, {dtype});
      const Tensor dlogits = cross_entropy_backward(dloss, logits, t, out.lse);
      REQUIRE(dlogits.shape() == logits.shape());
      REQUIRE(max_abs_diff(dlogits.to_vector<double>(), scaled(want.dlogits, 0.7)) <= tol);
    }
  }
}

TEST_CASE("cross_entropy backward matches finite differences", "[cross_entropy]") {
  Generator gen(2);
  const std::vector<int64_t> targets = {4, kIgnore, 0, 2};
  const Tensor t = index_tensor<int64_t>(targets);
  const Tensor logits = randn({4, 5}, gen, {DType::f64});
  std::vector<double> x = logits.to_vector<double>();
  const auto loss = [&]() { return cross_entropy(from_vector(x, {4, 5}), t).loss.item<double>(); };
  std::vector<double> fd(x.size());
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    fd[i] = (up - down) / (2 * h);
  }
  const Tensor lse = cross_entropy(logits, t).lse;
  const Tensor dlogits = cross_entropy_backward(scalar_tensor(1.0, {DType::f64}), logits, t, lse);
  REQUIRE(max_abs_diff(dlogits.to_vector<double>(), fd) <= 1e-8);
}

TEST_CASE("cross_entropy with a custom ignore_index and non-contiguous logits", "[cross_entropy]") {
  Generator gen(3);
  const std::vector<int64_t> targets = {-1, 2, 0, -1, 12, 1, 9};
  const Tensor logits = randn({13, 7}, gen, {DType::f64}).transpose(0, 1);  // (7, 13)
  REQUIRE_FALSE(logits.is_contiguous());
  const Reference want = reference(logits, targets, -1);
  const Tensor t = index_tensor<int32_t>(targets);
  const kernels::CrossEntropyOutput out = cross_entropy(logits, t, -1);
  REQUIRE(out.loss.item<double>() == Approx(want.loss).epsilon(1e-12));
  const Tensor dlogits =
      cross_entropy_backward(scalar_tensor(1.0, {DType::f64}), logits, t, out.lse, -1);
  REQUIRE(max_abs_diff(dlogits.to_vector<double>(), want.dlogits) <= 1e-12);
}

TEST_CASE("cross_entropy over many rows spread across threads", "[cross_entropy]") {
  Generator gen(4);
  const int64_t rows = 64, vocab = 1031;
  std::vector<int64_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 5 == 0 ? kIgnore : (r * 37) % vocab;
  const Tensor logits = randn({rows, vocab}, gen, {DType::f32});
  const Tensor t = index_tensor<int64_t>(targets);
  const Reference want = reference(logits, targets, kIgnore);
  const kernels::CrossEntropyOutput out = cross_entropy(logits, t);
  REQUIRE(out.loss.item<double>() == Approx(want.loss).epsilon(1e-5));
  const Tensor dlogits = cross_entropy_backward(scalar_tensor(1.0), logits, t, out.lse);
  REQUIRE(max_abs_diff(dlogits.to_vector<double>(), want.dlogits) <= 1e-7);
}

TEST_CASE("cross_entropy with every row ignored is zero with zero gradient", "[cross_entropy]") {
  Generator gen(5);
  const Tensor logits = randn({3, 13}, gen);
  const Tensor t = index_tensor<int64_t>({kIgnore, kIgnore, kIgnore});
  const kernels::CrossEntropyOutput out = cross_entropy(logits, t);
  REQUIRE(out.loss.item<double>() == 0.0);
  const Tensor dlogits = cross_entropy_backward(scalar_tensor(1.0), logits, t, out.lse);
  for (double v : dlogits.to_vector<double>()) REQUIRE(v == 0.0);
  const kernels::CrossEntropyOutput none = cross_entropy(zeros({0, 13}), zeros({0}, {DType::i64}));
  REQUIRE(none.loss.item<double>() == 0.0);
  REQUIRE(none.lse.shape() == Shape{0});
}

TEST_CASE("cross_entropy rejects bad inputs", "[cross_entropy]") {
  const Tensor logits = zeros({4, 13});
  REQUIRE_THROWS_WITH(
      cross_entropy(logits, index_tensor<int64_t>({0, 1, 13, 2})),
      Catch::Contains("[cross_entropy] expected targets in [0, 13) or ignore_index -100, found "
                      "13 at row 2"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, index_tensor<int32_t>({0, -5, 1, 2})),
                      Catch::Contains("found -5 at row 1"));
  REQUIRE_THROWS_WITH(cross_entropy_backward(scalar_tensor(1.0), logits,
                                             index_tensor<int64_t>({0, 1, 2, 99}), zeros({4})),
                      Catch::Contains("[cross_entropy_backward] expected targets in [0, 13)"));
  REQUIRE_THROWS_WITH(
      cross_entropy(logits, zeros({4})),
      Catch::Contains("[cross_entropy] expected index dtype i32 or i64, found f32"));
  REQUIRE_THROWS_WITH(cross_entropy(logits, zeros({5}, {DType::i64})),
                      Catch::Contains("[cross_entropy] expected targets of shape (4), found (5)"));
  REQUIRE_THROWS_WITH(cross_entropy(zeros({2, 3, 4}), zeros({2}, {DType::i64})),
                      Catch::Contains("[cross_entropy] expected logits of shape (N, V), found "
                                      "(2, 3, 4)"));
  REQUIRE_THROWS_WITH(
      cross_entropy_backward(zeros({2}), logits, zeros({4}, {DType::i64}), zeros({4})),
      Catch::Contains("[cross_entropy_backward] expected a one-element dloss, found (2)"));
  REQUIRE_THROWS_WITH(
      cross_entropy_backward(scalar_tensor(1.0), logits, zeros({4}, {DType::i64}), zeros({3})),
      Catch::Contains("[cross_entropy_backward] expected lse of shape (4), found (3)"));
}

TEST_CASE("cross_entropy reads the first V columns of padded logits in place", "[cross_entropy]") {
  Generator gen(17);
  const Tensor padded = randn({6, 16}, gen, {DType::f64}, 0.0, 3.0);  // (N, Vp)
  const Tensor view = padded.narrow(1, 0, 11);                        // (N, V), row stride 16
  const Tensor dense = view.contiguous();
  const Tensor targets = index_tensor<int64_t>({0, 10, 3, -100, 7, 1});
  const auto a = cross_entropy(view, targets);
  const auto b = cross_entropy(dense, targets);
  CHECK(a.loss.item<double>() == b.loss.item<double>());
  CHECK(a.lse.to_vector<double>() == b.lse.to_vector<double>());
  const Tensor da = cross_entropy_backward(scalar_tensor(1.0, {DType::f64}), view, targets, a.lse);
  const Tensor db = cross_entropy_backward(scalar_tensor(1.0, {DType::f64}), dense, targets, b.lse);
  CHECK(da.to_vector<double>() == db.to_vector<double>());
  // The gradient of the padded tensor: the same columns (up to rounding: its rows start
  // aligned, so Eigen vectorizes other elements of each row), then zeros.
  const Tensor dp =
      cross_entropy_backward(scalar_tensor(1.0, {DType::f64}), view, targets, a.lse, -100, 16);
  REQUIRE(dp.shape() == Shape{6, 16});
  CHECK(max_abs_diff(dp.narrow(1, 0, 11).contiguous().to_vector<double>(),
                     db.to_vector<double>()) <= 1e-15);
  CHECK(dp.narrow(1, 11, 5).contiguous().to_vector<double>() == std::vector<double>(30, 0.0));
}

}  // namespace tessera
