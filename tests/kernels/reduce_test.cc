// Reductions against naive double-precision loops over groups of elements.
#include "kernels/reduce.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <vector>

#include "core/factories.h"
#include "tests/testing.h"

using namespace tessera;
using namespace tessera::kernels;

namespace {

using tessera::testing::require_close;

// The values of x grouped by output element: groups[o] lists, in row-major order, the
// elements that reduce into output o when the dims in `mask` are reduced.
std::vector<std::vector<double>> groups(const Tensor& x, const std::vector<bool>& mask) {
  const Shape& shape = x.shape();
  const std::vector<double> v = x.to_vector<double>();
  int64_t outputs = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d]) outputs *= shape[d];
  }
  std::vector<std::vector<double>> out(static_cast<size_t>(outputs));
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    int64_t rem = i;
    int64_t o = 0;
    int64_t stride = 1;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      const int64_t idx = rem % shape[d];
      rem /= shape[d];
      if (mask[d]) continue;
      o += idx * stride;
      stride *= shape[d];
    }
    out[o].push_back(v[i]);
  }
  return out;
}

std::vector<bool> mask_of(int64_t ndim, const std::vector<int64_t>& dims) {
  std::vector<bool> mask(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) mask[d < 0 ? d + ndim : d] = true;
  return mask;
}

std::vector<double> reference(const Tensor& x, const std::vector<int64_t>& dims,
                              const std::function<double(const std::vector<double>&)>& f) {
  std::vector<double> out;
  for (const std::vector<double>& g : groups(x, mask_of(x.dim(), dims))) out.push_back(f(g));
  return out;
}

double sum_ref(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}

double mean_ref(const std::vector<double>& g) { return sum_ref(g) / static_cast<double>(g.size()); }

double var_ref(const std::vector<double>& g, int64_t correction) {
  const double m = mean_ref(g);
  double s = 0;
  for (double v : g) s += (v - m) * (v - m);
  return s / static_cast<double>(static_cast<int64_t>(g.size()) - correction);
}

Shape expected_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  const std::vector<bool> mask = mask_of(static_cast<int64_t>(shape.size()), dims);
  Shape out;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// (3, 4, 5) tensors in several layouts with the same logical shape.
std::vector<Tensor> layouts(Generator& gen, DType dtype) {
  return {
      randn({3, 4, 5}, gen, {dtype}),
      randn({5, 4, 3}, gen, {dtype}).permute({2, 1, 0}),
      randn({4, 3, 5}, gen, {dtype}).transpose(0, 1),
      randn({1, 4, 1}, gen, {dtype}).expand({3, 4, 5}),
      randn({3, 8, 5}, gen, {dtype}).slice(1, 0, 8, 2),
  };
}

const std::vector<std::vector<int64_t>> kDimSets = {{},     {0},    {1},    {2},    {-1},
                                                    {0, 1}, {1, 2}, {0, 2}, {2, 0}, {0, 1, 2}};

}  // namespace

TEST_CASE("sum, mean and var match the reference over any dims and layout", "[reduce]") {
  Generator gen(11);
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    for (const Tensor& x : layouts(gen, dtype)) {
      for (const std::vector<int64_t>& dims : kDimSets) {
        for (bool keepdim : {false, true}) {
          INFO(dtype_name(dtype) << " strides " << shape_str(x.strides()) << " dims "
                                 << shape_str(dims) << " keepdim " << keepdim);
          const Shape shape = expected_shape(x.shape(), dims, keepdim);
          const Tensor s = sum(x, dims, keepdim);
          REQUIRE(s.shape() == shape);
          require_close(s, reference(x, dims, sum_ref), tol);
          const Tensor m = mean(x, dims, keepdim);
          REQUIRE(m.shape() == shape);
          require_close(m, reference(x, dims, mean_ref), tol);
          for (int64_t correction : {0, 1}) {
            const Tensor v = var(x, dims, correction, keepdim);
            REQUIRE(v.shape() == shape);
            require_close(
                v,
                reference(x, dims,
                          [&](const std::vector<double>& g) { return var_ref(g, correction); }),
                dtype == DType::f32 ? 1e-4 : 1e-10);
          }
        }
      }
    }
  }
}

TEST_CASE("reductions over size-1 dims and odd shapes", "[reduce]") {
  Generator gen(12);
  const Tensor x = randn({3, 1, 5}, gen, {DType::f64});
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{1}, {0, 1}, {1, 2}, {0}, {2}}) {
    INFO(shape_str(dims));
    require_close(sum(x, dims, false), reference(x, dims, sum_ref), 1e-12);
    require_close(var(x, dims, 0, true),
                  reference(x, dims, [](const std::vector<double>& g) { return var_ref(g, 0); }),
                  1e-12);
  }
  const Tensor y = randn({13, 7}, gen).transpose(0, 1);  // (7, 13)
  require_close(sum(y, {1}, false), reference(y, {1}, sum_ref), 1e-5);
  require_close(sum(y, {0}, true), reference(y, {0}, sum_ref), 1e-5);
}

TEST_CASE("sums of long rows and columns stay accurate in f32", "[reduce]") {
  Generator gen(13);
  // Long rows (chunked across threads) and long columns, with a large mean so that naive
  // f32 accumulation would lose digits.
  const Tensor rows = rand({3, 300001}, gen, {DType::f32}, 1.0, 2.0);
  require_close(sum(rows, {1}, false), reference(rows, {1}, sum_ref), 1e-6);
  require_close(sum(rows, {}, false), reference(rows, {}, sum_ref), 1e-6);
  require_close(mean(rows, {1}, false), reference(rows, {1}, mean_ref), 1e-6);
  const Tensor cols = rand({200003, 3}, gen, {DType::f32}, 1.0, 2.0);
  require_close(sum(cols, {0}, false), reference(cols, {0}, sum_ref), 1e-6);
  const Tensor wide = rand({2000, 300}, gen, {DType::f32}, 1.0, 2.0);
  require_close(sum(wide, {0}, false), reference(wide, {0}, sum_ref), 1e-6);
  // A large offset: var must not cancel catastrophically.
  const Tensor offset = rand({2, 100000}, gen, {DType::f32}, 1000.0, 1001.0);
  require_close(var(offset, {1}, 1, false),
                reference(offset, {1}, [](const std::vector<double>& g) { return var_ref(g, 1); }),
                1e-3);
}

TEST_CASE("empty and scalar reductions", "[reduce]") {
  CHECK(sum(zeros({0}), {}, false).item<double>() == 0.0);
  CHECK(sum(zeros({2, 0, 3}), {}, false).item<double>() == 0.0);
  const Tensor s = sum(zeros({3, 0}), {1}, false);
  REQUIRE(s.shape() == Shape{3});
  CHECK(s.to_vector<double>() == std::vector<double>{0, 0, 0});
  REQUIRE(sum(zeros({0, 3}), {1}, true).shape() == Shape{0, 1});
  CHECK(std::isnan(mean(zeros({0}), {}, false).item<double>()));
  const Tensor scalar = scalar_tensor(2.5);
  CHECK(sum(scalar, {}, false).item<double>() == 2.5);
  CHECK(sum(scalar, {0}, true).shape().empty());
  CHECK(mean(scalar, {-1}, false).item<double>() == 2.5);
  // One element with the unbiased correction: 0 / 0, NaN as torch.var.
  CHECK(std::isnan(var(ones({1}), {}, 1, false).item<double>()));
  CHECK(var(ones({1}), {}, 0, false).item<double>() == 0.0);
}

TEST_CASE("max returns the value and index of the first maximum", "[reduce]") {
  // Ties: the first maximum along the dim wins.
  const Tensor x = from_vector<double>({1, 5, 5, 2,  //
                                        7, 7, 0, 7,  //
                                        3, 1, 3, 3},
                                       {3, 4});
  for (DType dtype : {DType::f32, DType::f64}) {
    const MaxResult r1 = max(x.to(dtype), 1, false);
    CHECK(r1.values.to_vector<double>() == std::vector<double>{5, 7, 3});
    CHECK(r1.indices.dtype() == DType::i64);
    CHECK(r1.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0});
    const MaxResult r0 = max(x.to(dtype), 0, true);
    REQUIRE(r0.values.shape() == Shape{1, 4});
    CHECK(r0.values.to_vector<double>() == std::vector<double>{7, 7, 5, 7});
    CHECK(r0.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 0, 1});
    CHECK(argmax(x.to(dtype), -1, false).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0});
    // Transposed input: the maximum over dim 0 of x^T is over dim 1 of x.
    CHECK(argmax(x.to(dtype).transpose(0, 1), 0, false).to_vector<int64_t>() ==
          std::vector<int64_t>{1, 0, 0});
  }
}

TEST_CASE("max matches the reference on every layout", "[reduce]") {
  Generator gen(14);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const Tensor& x : layouts(gen, dtype)) {
      for (int64_t dim : {0, 1, 2, -1}) {
        for (bool keepdim : {false, true}) {
          INFO(dtype_name(dtype) << " strides " << shape_str(x.strides()) << " dim " << dim);
          const MaxResult r = max(x, dim, keepdim);
          const Shape shape = expected_shape(x.shape(), {dim}, keepdim);
          REQUIRE(r.values.shape() == shape);
          REQUIRE(r.indices.shape() == shape);
          std::vector<double> values;
          std::vector<int64_t> indices;
          for (const std::vector<double>& g : groups(x, mask_of(3, {dim}))) {
            int64_t best = 0;
            for (size_t i = 1; i < g.size(); ++i) {
              if (g[i] > g[best]) best = static_cast<int64_t>(i);
            }
            values.push_back(g[best]);
            indices.push_back(best);
          }
          CHECK(r.values.to_vector<double>() == values);
          CHECK(r.indices.to_vector<int64_t>() == indices);
        }
      }
    }
  }
  const Tensor big = randn({5, 70001}, gen);
  const std::vector<int64_t> idx = argmax(big, 1, false).to_vector<int64_t>();
  const std::vector<std::vector<double>> g = groups(big, {false, true});
  for (size_t o = 0; o < 5; ++o) {
    for (double v : g[o]) REQUIRE(v <= g[o][idx[o]]);
  }
}

TEST_CASE("max breaks ties and NaNs by the first index in long rows and columns", "[reduce]") {
  Generator gen(15);
  // Values in {0, ..., 4} with some NaNs: ties everywhere, NaN in some rows only.
  std::vector<double> v =
      rand({7, 37, 19}, gen, {DType::f64}, 0.0, 5.0).to(DType::i64).to_vector<double>();
  for (size_t i = 0; i < v.size(); i += 97) v[i] = NAN;
  const Tensor x = from_vector<double>(v, {7, 37, 19});
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t dim : {0, 1, 2}) {
      INFO(dtype_name(dtype) << " dim " << dim);
      const MaxResult r = max(x.to(dtype), dim, false);
      std::vector<int64_t> want;
      for (const std::vector<double>& g : groups(x, mask_of(3, {dim}))) {
        int64_t best = 0;
        for (size_t i = 1; i < g.size(); ++i) {
          if (std::isnan(g[best])) break;
          if (std::isnan(g[i]) || g[i] > g[best]) best = static_cast<int64_t>(i);
        }
        want.push_back(best);
      }
      CHECK(r.indices.to_vector<int64_t>() == want);
    }
  }
}

TEST_CASE("max propagates NaN", "[reduce]") {
  const Tensor x = from_vector<double>({1, NAN, 3, 4, 5, NAN}, {2, 3});
  const MaxResult r = max(x, 1, false);
  const std::vector<double> v = r.values.to_vector<double>();
  CHECK(std::isnan(v[0]));
  CHECK(std::isnan(v[1]));
  CHECK(r.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  const MaxResult c = max(x.to(DType::f32), 0, false);
  CHECK(std::isnan(c.values.to_vector<double>()[1]));
  CHECK(c.indices.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});
}

TEST_CASE("reduction errors name the op", "[reduce]") {
  REQUIRE_THROWS_WITH(sum(zeros({2, 3}), {2}, false),
                      Catch::Contains("[sum]") && Catch::Contains("dim 2"));
  REQUIRE_THROWS_WITH(sum(zeros({2, 3}), {1, -1}, false),
                      Catch::Contains("[sum]") && Catch::Contains("(1, -1)"));
  REQUIRE_THROWS_WITH(var(zeros({2}, {DType::i32}), {}, 1, false),
                      Catch::Contains("[var]") && Catch::Contains("i32"));
  REQUIRE_THROWS_WITH(mean(Tensor(), {}, false), Catch::Contains("[mean]"));
  REQUIRE_THROWS_WITH(max(zeros({3, 0}), 1, false),
                      Catch::Contains("[max]") && Catch::Contains("(3, 0)"));
  REQUIRE_THROWS_WITH(argmax(zeros({3}), 1, false), Catch::Contains("[max]"));
  REQUIRE_THROWS_WITH(var(zeros({3}), {}, -1, false), Catch::Contains("[var]"));
}
