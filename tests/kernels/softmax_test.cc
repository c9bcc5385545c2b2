#include "kernels/softmax.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using tessera::testing::max_abs_diff;

using kernels::log_softmax;
using kernels::log_softmax_backward;
using kernels::softmax;
using kernels::softmax_backward;

// Softmax (or log-softmax) of each last-dim row of x, in double with naive loops.
std::vector<double> reference(const Tensor& x, bool log) {
  const std::vector<double> v = x.to_vector<double>();
  const int64_t cols = x.size(-1);
  std::vector<double> out(v.size());
  for (size_t r = 0; r * cols < v.size(); ++r) {
    double max = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) max = std::max(max, v[r * cols + j]);
    double sum = 0.0;
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(v[r * cols + j] - max);
    for (int64_t j = 0; j < cols; ++j) {
      const double z = v[r * cols + j] - max - std::log(sum);
      out[r * cols + j] = log ? z : std::exp(z);
    }
  }
  return out;
}

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-13; }

// d/dx of sum(dy * f(x)) by central differences in f64; f maps (..., V) to (..., V).
template <class F>
std::vector<double> numeric_grad(F f, const Tensor& x, const Tensor& dy) {
  std::vector<double> xv = x.to_vector<double>();
  const std::vector<double> dyv = dy.to_vector<double>();
  const auto loss = [&](const std::vector<double>& v) {
    const std::vector<double> y = f(from_vector(v, x.shape())).template to_vector<double>();
    double l = 0.0;
    for (size_t i = 0; i < y.size(); ++i) l += dyv[i] * y[i];
    return l;
  };
  std::vector<double> grad(xv.size());
  const double h = 1e-6;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double saved = xv[i];
    xv[i] = saved + h;
    const double up = loss(xv);
    xv[i] = saved - h;
    const double down = loss(xv);
    xv[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

}  // namespace

TEST_CASE("softmax and log_softmax match naive loops", "[softmax]") {
  Generator gen(1);
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = randn({3, 4, 13}, gen, {dtype}, 0.0, 3.0);
    const Tensor y = softmax(x);
    REQUIRE(y.shape() == x.shape());
    REQUIRE(y.dtype() == dtype);
    REQUIRE(max_abs_diff(y.to_vector<double>(), reference(x, false)) <= tolerance(dtype));
    REQUIRE(max_abs_diff(log_softmax(x).to_vector<double>(), reference(x, true)) <=
            10 * tolerance(dtype));
  }
}

TEST_CASE("softmax over rows spread across threads", "[softmax]") {
  Generator gen(2);
  const Tensor x = randn({64, 1031}, gen, {DType::f32});
  REQUIRE(max_abs_diff(softmax(x).to_vector<double>(), reference(x, false)) <= 1e-6);
  REQUIRE(max_abs_diff(log_softmax(x).to_vector<double>(), reference(x, true)) <= 1e-4);
}

TEST_CASE("softmax of non-contiguous input works on the logical last dim", "[softmax]") {
  Generator gen(3);
  const Tensor x = randn({7, 5, 3}, gen, {DType::f64}).transpose(0, 2);  // (3, 5, 7)
  REQUIRE_FALSE(x.is_contiguous());
  REQUIRE(max_abs_diff(softmax(x).to_vector<double>(), reference(x, false)) <= 1e-13);
  REQUIRE(max_abs_diff(log_softmax(x).to_vector<double>(), reference(x, true)) <= 1e-13);
}

TEST_CASE("softmax is stable for large inputs", "[softmax]") {
  const Tensor x = from_vector<float>({1000.f, 999.f, -1000.f, 0.f, 88.f, 89.f}, {2, 3});
  const std::vector<double> y = softmax(x).to_vector<double>();
  const std::vector<double> ly = log_softmax(x).to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) {
    REQUIRE(std::isfinite(y[i]));
    REQUIRE(std::isfinite(ly[i]));
  }
  REQUIRE(y[0] == Approx(1 / (1 + std::exp(-1.0))));
  REQUIRE(ly[2] == Approx(-2000 - std::log(1 + std::exp(-1.0))));
}

TEST_CASE("softmax backward matches the formula and finite differences", "[softmax]") {
  Generator gen(4);
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor x = randn({2, 3, 7}, gen, {dtype});
    const Tensor dy = randn({2, 3, 7}, gen, {dtype});
    const Tensor y = softmax(x);
    const std::vector<double> yv = y.to_vector<double>();
    const std::vector<double> dyv = dy.to_vector<double>();
    std::vector<double> want(yv.size());
    for (size_t r = 0; r < 6; ++r) {
      double dot = 0.0;
      for (size_t j = 0; j < 7; ++j) dot += dyv[r * 7 + j] * yv[r * 7 + j];
      for (size_t j = 0; j < 7; ++j) want[r * 7 + j] = yv[r * 7 + j] * (dyv[r * 7 + j] - dot);
    }
    const Tensor dx = softmax_backward(dy, y);
    REQUIRE(dx.shape() == x.shape());
    REQUIRE(max_abs_diff(dx.to_vector<double>(), want) <= tolerance(dtype));
  }
  const Tensor x = randn({3, 5}, gen, {DType::f64});
  const Tensor dy = randn({3, 5}, gen, {DType::f64});
  const std::vector<double> fd = numeric_grad([](const Tensor& t) { return softmax(t); }, x, dy);
  REQUIRE(max_abs_diff(softmax_backward(dy, softmax(x)).to_vector<double>(), fd) <= 1e-8);
}

TEST_CASE("log_softmax backward matches finite differences", "[softmax]") {
  Generator gen(5);
  const Tensor x = randn({3, 5}, gen, {DType::f64});
  const Tensor dy = randn({3, 5}, gen, {DType::f64});
  const std::vector<double> fd =
      numeric_grad([](const Tensor& t) { return log_softmax(t); }, x, dy);
  const Tensor dx = log_softmax_backward(dy, log_softmax(x));
  REQUIRE(max_abs_diff(dx.to_vector<double>(), fd) <= 1e-8);
  // f32 against the f64 result; non-contiguous dy.
  const Tensor x32 = x.to(DType::f32);
  const Tensor dy32 = dy.to(DType::f32).transpose(0, 1).contiguous().transpose(0, 1);
  REQUIRE_FALSE(dy32.is_contiguous());
  const Tensor dx32 = log_softmax_backward(dy32, log_softmax(x32));
  REQUIRE(max_abs_diff(dx32.to_vector<double>(), dx.to_vector<double>()) <= 1e-5);
}

TEST_CASE("softmax of empty tensors", "[softmax]") {
  REQUIRE(softmax(zeros({0, 5})).shape() == Shape{0, 5});
  REQUIRE(log_softmax(zeros({4, 0})).shape() == Shape{4, 0});
}

TEST_CASE("softmax rejects bad inputs", "[softmax]") {
  REQUIRE_THROWS_WITH(softmax(scalar_tensor(1.0)),
                      Catch::Contains("[softmax] expected x with at least 1 dim, found ()"));
  REQUIRE_THROWS_WITH(
      log_softmax(zeros({2}, {DType::i64})),
      Catch::Contains("[log_softmax] expected x of dtype f32, f64, f16 or bf16, found i64"));
  REQUIRE_THROWS_WITH(softmax_backward(zeros({2, 3}), zeros({2, 4})),
                      Catch::Contains("[softmax_backward] shapes differ: dy (2, 3) vs y (2, 4)"));
  REQUIRE_THROWS_WITH(log_softmax_backward(zeros({2, 3}), zeros({2, 3}, {DType::f64})),
                      Catch::Contains("[log_softmax_backward] dtypes differ: dy f32 vs y f64"));
}

// The f32 softmax has a vector path of its own that works on two rows at once (Note
// [Memory-bound kernels] in kernels/cpu/avx512_math.h): every width around a vector, one
// row and many per thread, masked (-inf) entries, and a NaN row beside finite ones.
TEST_CASE("f32 softmax matches naive loops at every width and row count", "[softmax]") {
  const tessera::testing::ScopedThreads threads(3);  // chunks starting at odd rows too
  Generator gen(7);
  for (int64_t cols : {1, 15, 16, 17, 33, 768, 8200}) {
    for (int64_t rows : {1, 2, 5, 67}) {
      const Tensor x = randn({rows, cols}, gen, {DType::f32}, 0.0, 4.0);
      INFO(rows << " x " << cols);
      // Relative to each value: a sum over 8200 columns rounds at about 1e-6 of itself.
      const std::vector<double> y = softmax(x).to_vector<double>();
      const std::vector<double> want = reference(x, false);
      double worst = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        worst = std::max(worst, std::abs(y[i] - want[i]) / (want[i] + 1e-30));
      }
      CHECK(worst <= 4e-6);
    }
  }
}

TEST_CASE("f32 softmax gives masked entries exactly 0 and keeps a NaN row to itself", "[softmax]") {
  std::vector<float> v(3 * 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i % 7) - 100.f * (i % 3);
  for (int j = 5; j < 20; ++j) v[j] = -INFINITY;  // row 0: 5 entries left
  v[20 + 11] = NAN;                               // row 1
  const Tensor x = from_vector<float>(v, {3, 20});
  const std::vector<float> y = softmax(x).to_vector<float>();
  const std::vector<double> want = reference(x, false);
  for (int j = 0; j < 20; ++j) {
    if (j >= 5) {
      CHECK(y[j] == 0.f);
    } else {
      CHECK(y[j] == Approx(want[j]).epsilon(1e-6).margin(1e-30));
    }
    CHECK(std::isnan(y[20 + j]));
    CHECK(y[40 + j] == Approx(want[40 + j]).epsilon(1e-6).margin(1e-30));
  }
}

}  // namespace tessera
