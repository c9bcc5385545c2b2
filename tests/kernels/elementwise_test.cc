// Elementwise kernels against naive double-precision loops, on contiguous, transposed and
// broadcast inputs.
#include "kernels/elementwise.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/factories.h"
#include "tests/testing.h"

using namespace tessera;
using namespace tessera::kernels;

namespace {

using tessera::testing::require_close;

enum class Layout { contiguous, transposed, broadcast };

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::contiguous:
      return "contiguous";
    case Layout::transposed:
      return "transposed";
    case Layout::broadcast:
      return "broadcast";
  }
  return "";
}

// Uniform values in [low, high) with logical shape (rows, cols) in the given layout.
Tensor make(int64_t rows, int64_t cols, Layout layout, DType dtype, Generator& gen, double low,
            double high) {
  switch (layout) {
    case Layout::contiguous:
      return rand({rows, cols}, gen, {dtype}, low, high);
    case Layout::transposed:
      return rand({cols, rows}, gen, {dtype}, low, high).transpose(0, 1);
    case Layout::broadcast:
      return rand({1, cols}, gen, {dtype}, low, high).expand({rows, cols});
  }
  return {};
}

double tolerance(DType dtype) { return dtype == DType::f32 ? 2e-5 : 1e-12; }

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double unary_ref(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::neg:
      return -x;
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return std::log(x);
    case UnaryOp::sqrt:
      return std::sqrt(x);
    case UnaryOp::rsqrt:
      return 1.0 / std::sqrt(x);
    case UnaryOp::tanh:
      return std::tanh(x);
    case UnaryOp::relu:
      return x > 0 ? x : 0.0;
    case UnaryOp::gelu:
      return gelu_ref(x);
    case UnaryOp::sigmoid:
      return 1.0 / (1.0 + std::exp(-x));
  }
  return 0;
}

// op'(x) written from the definition, independent of the kernel's use of y.
double unary_derivative_ref(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::neg:
      return -1;
    case UnaryOp::exp:
      return std::exp(x);
    case UnaryOp::log:
      return 1 / x;
    case UnaryOp::sqrt:
      return 0.5 / std::sqrt(x);
    case UnaryOp::rsqrt:
      return -0.5 * std::pow(x, -1.5);
    case UnaryOp::tanh:
      return 1 - std::tanh(x) * std::tanh(x);
    case UnaryOp::relu:
      return x > 0 ? 1 : 0;
    case UnaryOp::gelu: {
      const double k = std::sqrt(2.0 / M_PI);
      const double t = std::tanh(k * (x + 0.044715 * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    }
    case UnaryOp::sigmoid: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1 - s);
    }
  }
  return 0;
}

// Domain of the test inputs: positive where the op needs it.
std::pair<double, double> input_range(UnaryOp op) {
  if (op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt) return {0.1, 4.0};
  return {-4.0, 4.0};
}

const std::vector<UnaryOp> kUnaryOps = {UnaryOp::neg,  UnaryOp::exp,   UnaryOp::log,
                                        UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::tanh,
                                        UnaryOp::relu, UnaryOp::gelu,  UnaryOp::sigmoid};
const std::vector<Layout> kLayouts = {Layout::contiguous, Layout::transposed, Layout::broadcast};
const std::vector<DType> kFloating = {DType::f32, DType::f64};

double binary_ref(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add:
      return a + b;
    case BinaryOp::sub:
      return a - b;
    case BinaryOp::mul:
      return a * b;
    case BinaryOp::div:
      return a / b;
    case BinaryOp::pow:
      return std::pow(a, b);
    case BinaryOp::maximum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case BinaryOp::minimum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
  }
  return 0;
}

const std::vector<BinaryOp> kBinaryOps = {BinaryOp::add,    BinaryOp::sub, BinaryOp::mul,
                                          BinaryOp::div,    BinaryOp::pow, BinaryOp::maximum,
                                          BinaryOp::minimum};

// Broadcasting reference over row-major values of a and b.
std::vector<double> broadcast_ref(const Shape& out_shape, const Tensor& a, const Tensor& b,
                                  const std::function<double(double, double)>& f) {
  const std::vector<double> av = a.to_vector<double>();
  const std::vector<double> bv = b.to_vector<double>();
  const int64_t n = numel_of(out_shape);
  const int64_t nd = static_cast<int64_t>(out_shape.size());
  std::vector<double> out(static_cast<size_t>(n));
  // Flat index of an output element in an operand whose leading dims are missing or 1.
  auto source = [&](const Shape& s, int64_t flat) {
    int64_t index = 0;
    int64_t stride = 1;
    for (int64_t d = nd - 1; d >= 0; --d) {
      const int64_t i = flat % out_shape[d];
      flat /= out_shape[d];
      const int64_t sd = d - (nd - static_cast<int64_t>(s.size()));
      if (sd < 0) continue;
      if (s[sd] != 1) index += i * stride;
      stride *= s[sd];
    }
    return index;
  };
  for (int64_t i = 0; i < n; ++i) {
    out[i] = f(av[source(a.shape(), i)], bv[source(b.shape(), i)]);
  }
  return out;
}

}  // namespace

TEST_CASE("unary ops match the reference on every layout", "[elementwise]") {
  Generator gen(1);
  for (DType dtype : kFloating) {
    for (UnaryOp op : kUnaryOps) {
      for (Layout layout : kLayouts) {
        INFO(unary_name(op) << " " << dtype_name(dtype) << " " << layout_name(layout));
        const auto [low, high] = input_range(op);
        const Tensor x = make(7, 13, layout, dtype, gen, low, high);
        const Tensor y = unary(op, x);
        REQUIRE(y.shape() == Shape{7, 13});
        REQUIRE(y.dtype() == dtype);
        REQUIRE(y.is_contiguous());
        std::vector<double> want;
        for (double v : x.to_vector<double>()) want.push_back(unary_ref(op, v));
        require_close(y, want, tolerance(dtype));
      }
    }
  }
}

TEST_CASE("unary ops on long contiguous and 3-d strided inputs", "[elementwise]") {
  Generator gen(2);
  for (DType dtype : kFloating) {
    for (UnaryOp op : kUnaryOps) {
      INFO(unary_name(op) << " " << dtype_name(dtype));
      const auto [low, high] = input_range(op);
      // Long enough to split into spans on several threads.
      const Tensor big = rand({100003}, gen, {dtype}, low, high);
      std::vector<double> want;
      for (double v : big.to_vector<double>()) want.push_back(unary_ref(op, v));
      require_close(unary(op, big), want, tolerance(dtype));

      const Tensor odd = rand({5, 1, 3}, gen, {dtype}, low, high).permute({2, 1, 0});  // (3, 1, 5)
      want.clear();
      for (double v : odd.to_vector<double>()) want.push_back(unary_ref(op, v));
      const Tensor y = unary(op, odd);
      REQUIRE(y.shape() == Shape{3, 1, 5});
      require_close(y, want, tolerance(dtype));
    }
  }
}

TEST_CASE("unary ops on edge values", "[elementwise]") {
  const Tensor x = from_vector<double>({0.0, -0.0, 30.0, -30.0, NAN});
  CHECK(unary(UnaryOp::relu, x).to_vector<double>()[0] == 0.0);
  CHECK(std::isnan(unary(UnaryOp::relu, x).to_vector<double>()[4]));
  const std::vector<double> s = unary(UnaryOp::sigmoid, x.to(DType::f32)).to_vector<double>();
  CHECK(s[0] == Approx(0.5));
  CHECK(s[2] == Approx(1.0));
  CHECK(s[3] == Approx(0.0).margin(1e-12));
  CHECK(unary(UnaryOp::gelu, x).to_vector<double>()[3] == Approx(0.0).margin(1e-12));
  // relu'(0) = 0
  const Tensor zero = zeros({3});
  CHECK(unary_backward(UnaryOp::relu, ones({3}), zero, Tensor()).to_vector<double>() ==
        std::vector<double>{0, 0, 0});
}

TEST_CASE("unary_backward matches op' on every layout", "[elementwise]") {
  Generator gen(3);
  for (DType dtype : kFloating) {
    for (UnaryOp op : kUnaryOps) {
      for (Layout layout : kLayouts) {
        INFO(unary_name(op) << " " << dtype_name(dtype) << " " << layout_name(layout));
        const auto [low, high] = input_range(op);
        const Tensor x = make(7, 13, layout, dtype, gen, low, high);
        const Tensor y = unary(op, x);
        const Tensor g = make(7, 13, Layout::transposed, dtype, gen, -2.0, 2.0);
        const Tensor dx = unary_backward(op, g, x, y);
        REQUIRE(dx.shape() == Shape{7, 13});
        const std::vector<double> xv = x.to_vector<double>();
        const std::vector<double> gv = g.to_vector<double>();
        std::vector<double> want;
        for (size_t i = 0; i < xv.size(); ++i)
          want.push_back(gv[i] * unary_derivative_ref(op, xv[i]));
        // f32 derivatives read the rounded output y.
        require_close(dx, want, dtype == DType::f32 ? 1e-4 : 1e-10);
      }
    }
  }
}

TEST_CASE("unary_backward agrees with central differences in f64", "[elementwise]") {
  Generator gen(4);
  for (UnaryOp op : kUnaryOps) {
    INFO(unary_name(op));
    const auto [low, high] = input_range(op);
    const Tensor x = rand({41}, gen, {DType::f64}, low, high);
    const double h = 1e-6;
    const Tensor plus = unary(op, binary(BinaryOp::add, x, scalar_tensor(h, {DType::f64})));
    const Tensor minus = unary(op, binary(BinaryOp::sub, x, scalar_tensor(h, {DType::f64})));
    const std::vector<double> p = plus.to_vector<double>();
    const std::vector<double> m = minus.to_vector<double>();
    std::vector<double> want;
    for (size_t i = 0; i < p.size(); ++i) want.push_back((p[i] - m[i]) / (2 * h));
    require_close(unary_backward(op, ones({41}, {DType::f64}), x, unary(op, x)), want, 1e-6);
  }
}

TEST_CASE("unary_backward needs only the tensor op' reads", "[elementwise]") {
  const Tensor x = from_vector<float>({0.5f, 1.5f, 2.0f});
  const Tensor g = ones({3});
  CHECK_NOTHROW(unary_backward(UnaryOp::gelu, g, x, Tensor()));
  CHECK_NOTHROW(unary_backward(UnaryOp::exp, g, Tensor(), unary(UnaryOp::exp, x)));
  CHECK_NOTHROW(unary_backward(UnaryOp::neg, g, Tensor(), Tensor()));
  REQUIRE_THROWS_WITH(unary_backward(UnaryOp::tanh, g, x, Tensor()),
                      Catch::Contains("[tanh_backward]") && Catch::Contains("forward output y"));
  REQUIRE_THROWS_WITH(unary_backward(UnaryOp::log, g, Tensor(), x),
                      Catch::Contains("[log_backward]") && Catch::Contains("forward input x"));
  REQUIRE_THROWS_WITH(
      unary_backward(UnaryOp::relu, g, zeros({4}), Tensor()),
      Catch::Contains("[relu_backward]") && Catch::Contains("(3)") && Catch::Contains("(4)"));
  REQUIRE_THROWS_WITH(unary_backward(UnaryOp::relu, g, x.to(DType::f64), Tensor()),
                      Catch::Contains("[relu_backward]") && Catch::Contains("f64"));
}

TEST_CASE("binary ops broadcast like numpy", "[elementwise]") {
  Generator gen(5);
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {{{7, 13}, {7, 13}},  {{7, 13}, {13}}, {{7, 1}, {1, 13}},
                                   {{3, 1, 5}, {4, 5}}, {{7, 13}, {}},   {{}, {3, 1, 5}},
                                   {{1, 13}, {7, 1}}};
  for (DType dtype : kFloating) {
    for (BinaryOp op : kBinaryOps) {
      for (const Case& c : cases) {
        INFO(binary_name(op) << " " << dtype_name(dtype) << " " << shape_str(c.a) << " "
                             << shape_str(c.b));
        // Positive bases keep pow real; b stays away from 0 for div.
        const Tensor a = rand(c.a, gen, {dtype}, 0.5, 2.0);
        const Tensor b = rand(c.b, gen, {dtype}, 0.5, 2.0);
        const Tensor out = binary(op, a, b);
        const Shape shape = broadcast_shapes(c.a, c.b, "test");
        REQUIRE(out.shape() == shape);
        require_close(
            out,
            broadcast_ref(shape, a, b, [&](double u, double v) { return binary_ref(op, u, v); }),
            tolerance(dtype));
      }
    }
  }
}

TEST_CASE("binary ops on transposed and expanded operands", "[elementwise]") {
  Generator gen(6);
  for (DType dtype : kFloating) {
    for (BinaryOp op : kBinaryOps) {
      for (Layout la : kLayouts) {
        for (Layout lb : kLayouts) {
          INFO(binary_name(op) << " " << dtype_name(dtype) << " " << layout_name(la) << " "
                               << layout_name(lb));
          const Tensor a = make(7, 13, la, dtype, gen, 0.5, 2.0);
          const Tensor b = make(7, 13, lb, dtype, gen, 0.5, 2.0);
          require_close(binary(op, a, b),
                        broadcast_ref({7, 13}, a, b,
                                      [&](double u, double v) { return binary_ref(op, u, v); }),
                        tolerance(dtype));
        }
      }
    }
  }
}

TEST_CASE("binary ops on large inputs use every path", "[elementwise]") {
  Generator gen(7);
  const Tensor a = rand({300, 1001}, gen, {DType::f32}, 0.5, 2.0);
  const Tensor row = rand({1001}, gen, {DType::f32}, 0.5, 2.0);
  const Tensor col = rand({300, 1}, gen, {DType::f32}, 0.5, 2.0);
  for (BinaryOp op : kBinaryOps) {
    INFO(binary_name(op));
    auto f = [&](double u, double v) { return binary_ref(op, u, v); };
    require_close(binary(op, a, a.transpose(0, 1).contiguous().transpose(0, 1)),
                  broadcast_ref({300, 1001}, a, a, f), 2e-5);
    require_close(binary(op, a, row), broadcast_ref({300, 1001}, a, row, f), 2e-5);
    require_close(binary(op, col, a), broadcast_ref({300, 1001}, col, a, f), 2e-5);
  }
}

TEST_CASE("maximum and minimum propagate NaN", "[elementwise]") {
  const Tensor a = from_vector<double>({1.0, NAN, 3.0, NAN});
  const Tensor b = from_vector<double>({NAN, 2.0, 1.0, NAN});
  for (DType dtype : kFloating) {
    const std::vector<double> mx =
        binary(BinaryOp::maximum, a.to(dtype), b.to(dtype)).to_vector<double>();
    const std::vector<double> mn =
        binary(BinaryOp::minimum, a.to(dtype), b.to(dtype)).to_vector<double>();
    CHECK(std::isnan(mx[0]));
    CHECK(std::isnan(mx[1]));
    CHECK(mx[2] == 3.0);
    CHECK(std::isnan(mx[3]));
    CHECK(std::isnan(mn[0]));
    CHECK(std::isnan(mn[1]));
    CHECK(mn[2] == 1.0);
    CHECK(std::isnan(mn[3]));
  }
}

TEST_CASE("binary errors name the op and both shapes", "[elementwise]") {
  REQUIRE_THROWS_WITH(binary(BinaryOp::add, zeros({2, 3}), zeros({4, 3})),
                      Catch::Contains("[add] shapes do not broadcast: (2, 3) vs (4, 3)"));
  REQUIRE_THROWS_WITH(binary(BinaryOp::mul, zeros({2, 3}), zeros({2, 3}, {DType::f64})),
                      Catch::Contains("[mul]") && Catch::Contains("f32") && Catch::Contains("f64"));
  REQUIRE_THROWS_WITH(binary(BinaryOp::sub, zeros({2}, {DType::i32}), zeros({2}, {DType::i32})),
                      Catch::Contains("[sub]") && Catch::Contains("i32"));
  REQUIRE_THROWS_WITH(binary(BinaryOp::div, Tensor(), zeros({2})),
                      Catch::Contains("[div]") && Catch::Contains("undefined"));
  REQUIRE_THROWS_WITH(unary(UnaryOp::exp, zeros({2}, {DType::i64})),
                      Catch::Contains("[exp]") && Catch::Contains("i64"));
}

TEST_CASE("compare works for every dtype and broadcasts", "[elementwise]") {
  const std::vector<CompareOp> ops = {CompareOp::eq, CompareOp::ne, CompareOp::lt,
                                      CompareOp::le, CompareOp::gt, CompareOp::ge};
  auto ref = [](CompareOp op, double a, double b) {
    switch (op) {
      case CompareOp::eq:
        return a == b;
      case CompareOp::ne:
        return a != b;
      case CompareOp::lt:
        return a < b;
      case CompareOp::le:
        return a <= b;
      case CompareOp::gt:
        return a > b;
      case CompareOp::ge:
        return a >= b;
    }
    return false;
  };
  // Small integers so that ties occur; b is broadcast and a transposed.
  const Tensor a =
      from_vector<double>({0, 1, 2, 1, 0, 2, 2, 2, 0, 1, 1, 1}, {4, 3}).transpose(0, 1);
  const Tensor b = from_vector<double>({1, 2, 0, 1}, {1, 4});
  const std::vector<DType> dtypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                     DType::i32, DType::i64, DType::u8};
  for (DType dtype : dtypes) {
    for (CompareOp op : ops) {
      INFO(compare_name(op) << " " << dtype_name(dtype));
      const Tensor out = compare(op, a.to(dtype), b.to(dtype));
      REQUIRE(out.dtype() == DType::boolean);
      REQUIRE(out.shape() == Shape{3, 4});
      const std::vector<double> want = broadcast_ref(
          {3, 4}, a, b, [&](double u, double v) { return ref(op, u, v) ? 1.0 : 0.0; });
      REQUIRE(out.to_vector<double>() == want);
    }
  }
  const Tensor t = from_vector<uint8_t>({1, 0, 1}).to(DType::boolean);
  CHECK(compare(CompareOp::eq, t, scalar_tensor(1, {DType::boolean})).to_vector<bool>() ==
        std::vector<bool>{true, false, true});
  REQUIRE_THROWS_WITH(compare(CompareOp::lt, zeros({2}), zeros({2}, {DType::i64})),
                      Catch::Contains("[lt]"));
  REQUIRE_THROWS_WITH(compare(CompareOp::ge, zeros({2, 3}), zeros({3, 2})),
                      Catch::Contains("[ge] shapes do not broadcast: (2, 3) vs (3, 2)"));
}

TEST_CASE("where picks a or b with three-way broadcasting", "[elementwise]") {
  Generator gen(8);
  for (DType dtype : {DType::f32, DType::f64, DType::i64}) {
    INFO(dtype_name(dtype));
    const Tensor x = randn({7, 13}, gen);
    const Tensor cond = compare(CompareOp::gt, x, zeros({13}));  // (7, 13)
    const Tensor a = randn({13, 7}, gen, {DType::f64}, 0.0, 10.0).to(dtype).transpose(0, 1);
    const Tensor b = randn({7, 1}, gen, {DType::f64}, 0.0, 10.0).to(dtype);
    const Tensor out = where(cond, a, b);
    REQUIRE(out.shape() == Shape{7, 13});
    REQUIRE(out.dtype() == dtype);
    const std::vector<double> c = cond.to_vector<double>();
    const std::vector<double> av = a.to_vector<double>();
    const std::vector<double> bv = b.to_vector<double>();
    std::vector<double> want;
    for (int64_t i = 0; i < 7 * 13; ++i) want.push_back(c[i] != 0 ? av[i] : bv[i / 13]);
    REQUIRE(out.to_vector<double>() == want);
  }
  const Tensor cond_row = from_vector<uint8_t>({1, 0, 1}).to(DType::boolean);
  const std::vector<double> picked =
      where(cond_row, scalar_tensor(1.0), zeros({2, 1})).to_vector<double>();
  CHECK(picked == std::vector<double>{1, 0, 1, 1, 0, 1});
  REQUIRE_THROWS_WITH(where(zeros({3}), zeros({3}), zeros({3})),
                      Catch::Contains("[where]") && Catch::Contains("bool"));
  REQUIRE_THROWS_WITH(where(cond_row, zeros({3}), zeros({3}, {DType::f64})),
                      Catch::Contains("[where]") && Catch::Contains("f64"));
  REQUIRE_THROWS_WITH(where(cond_row, zeros({4}), zeros({3})),
                      Catch::Contains("[where] shapes do not broadcast"));
}

TEST_CASE("op names", "[elementwise]") {
  CHECK(std::string(unary_name(UnaryOp::gelu)) == "gelu");
  CHECK(std::string(binary_name(BinaryOp::maximum)) == "maximum");
  CHECK(std::string(compare_name(CompareOp::le)) == "le");
}

// The f32 GELU's vector path (Note [Memory-bound kernels] in kernels/cpu/avx512_math.h): every
// length around a vector, unaligned starts, several threads' chunks, and its exact limits.
TEST_CASE("f32 gelu matches the f64 formula at every length and offset", "[elementwise]") {
  const tessera::testing::ScopedThreads threads(3);  // chunks starting off a vector boundary
  Generator gen(41);
  for (int64_t n : {1, 15, 16, 17, 33, 100003}) {
    for (int64_t offset : {0, 3}) {
      INFO("n = " << n << ", offset = " << offset);
      const Tensor base = rand({n + offset}, gen, {DType::f32}, -6.0, 6.0);
      const Tensor x = base.narrow(0, offset, n);  // contiguous, starting `offset` floats in
      REQUIRE(x.is_contiguous());
      const std::vector<double> xv = x.to_vector<double>();
      const std::vector<double> y = unary(UnaryOp::gelu, x).to_vector<double>();
      double worst = 0;  // relative error
      for (size_t i = 0; i < xv.size(); ++i) {
        const double want = gelu_ref(xv[i]);
        worst = std::max(worst, std::abs(y[i] - want) / (std::abs(want) + 1e-6));
      }
      CHECK(worst <= 2e-6);
    }
  }
}

TEST_CASE("f32 gelu limits: x for large x, -0 for very negative x, NaN", "[elementwise]") {
  const Tensor x = from_vector<float>({30.f, -30.f, -1e30f, INFINITY, NAN, 0.f}, {6});
  const std::vector<float> y = unary(UnaryOp::gelu, x).to_vector<float>();
  CHECK(y[0] == 30.f);
  CHECK((y[1] == 0.f && std::signbit(y[1])));
  CHECK(y[2] == 0.f);
  CHECK(y[3] == INFINITY);
  CHECK(std::isnan(y[4]));
  CHECK(y[5] == 0.f);
}
