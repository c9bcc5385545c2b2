// cat, split, index_select and index_add_ against naive loops.
#include "kernels/index.h"

#include <catch2/catch.hpp>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"

using namespace tessera;
using namespace tessera::kernels;

namespace {

// Element [i, j, k] of a row-major (d0, d1, d2) value list.
double at(const std::vector<double>& v, const Shape& s, int64_t i, int64_t j, int64_t k) {
  return v[(i * s[1] + j) * s[2] + k];
}

}  // namespace

TEST_CASE("cat joins along any dim and layout", "[index]") {
  Generator gen(21);
  for (DType dtype : {DType::f32, DType::f64, DType::i64}) {
    for (int64_t dim : {0, 1, 2, -1}) {
      INFO(dtype_name(dtype) << " dim " << dim);
      const int64_t d = dim < 0 ? dim + 3 : dim;
      Shape sa = {3, 4, 5}, sb = {3, 4, 5}, sc = {3, 4, 5};
      sa[d] = 2;
      sb[d] = 1;
      sc[d] = 3;
      const Tensor a = randn(sa, gen, {DType::f64}, 0, 10).to(dtype);
      // b is broadcast, c is transposed: any layout goes in.
      Shape sb1 = sb;
      sb1[0] = 1;
      const Tensor b = randn(sb1, gen, {DType::f64}, 0, 10).to(dtype).expand(sb);
      const Tensor c =
          randn({sc[2], sc[1], sc[0]}, gen, {DType::f64}, 0, 10).to(dtype).permute({2, 1, 0});
      const Tensor out = cat({a, b, c}, dim);
      Shape want_shape = {3, 4, 5};
      want_shape[d] = 6;
      REQUIRE(out.shape() == want_shape);
      REQUIRE(out.dtype() == dtype);
      const std::vector<double> o = out.to_vector<double>();
      const std::vector<double> av = a.to_vector<double>();
      const std::vector<double> bv = b.to_vector<double>();
      const std::vector<double> cv = c.to_vector<double>();
      for (int64_t i = 0; i < want_shape[0]; ++i) {
        for (int64_t j = 0; j < want_shape[1]; ++j) {
          for (int64_t k = 0; k < want_shape[2]; ++k) {
            int64_t idx[3] = {i, j, k};
            double want;
            if (idx[d] < 2) {
              want = at(av, sa, idx[0], idx[1], idx[2]);
            } else if (idx[d] < 3) {
              idx[d] -= 2;
              want = at(bv, sb, idx[0], idx[1], idx[2]);
            } else {
              idx[d] -= 3;
              want = at(cv, sc, idx[0], idx[1], idx[2]);
            }
            REQUIRE(at(o, want_shape, i, j, k) == want);
          }
        }
      }
    }
  }
}

TEST_CASE("cat errors name the op and the shapes", "[index]") {
  REQUIRE_THROWS_WITH(cat({}, 0), Catch::Contains("[cat]"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 4})}, 0), Catch::Contains("[cat]") &&
                                                                  Catch::Contains("(2, 3)") &&
                                                                  Catch::Contains("(2, 4)"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 3, 1})}, 0), Catch::Contains("[cat]"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 3}, {DType::f64})}, 0),
                      Catch::Contains("[cat]") && Catch::Contains("f64"));
  REQUIRE_THROWS_WITH(cat({zeros({2, 3})}, 2), Catch::Contains("[cat]"));
  REQUIRE_THROWS_WITH(cat({scalar_tensor(1.0)}, 0), Catch::Contains("[cat]"));
}

TEST_CASE("split returns views that cover the dim", "[index]") {
  Generator gen(22);
  Tensor x = randn({4, 7}, gen);
  x.set_requires_grad(true);
  // Raw views inside the kernel are taken without recording, even with grad mode on.
  REQUIRE(GradMode::is_enabled());
  const std::vector<Tensor> parts = split(x, {2, 0, 5}, 1);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].shape() == Shape{4, 2});
  CHECK(parts[1].shape() == Shape{4, 0});
  CHECK(parts[2].shape() == Shape{4, 5});
  const std::vector<double> xv = x.to_vector<double>();
  const std::vector<double> p2 = parts[2].to_vector<double>();
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 5; ++j) CHECK(p2[i * 5 + j] == xv[i * 7 + 2 + j]);
  }
  // Views share storage.
  CHECK(parts[2].raw_data() == static_cast<char*>(x.raw_data()) + 2 * sizeof(float));
  const std::vector<Tensor> rows = split(x, {1, 3}, -2);
  CHECK(rows[1].shape() == Shape{3, 7});
  REQUIRE_THROWS_WITH(split(x, {2, 4}, 1), Catch::Contains("[split]") &&
                                               Catch::Contains("(2, 4)") &&
                                               Catch::Contains("(4, 7)"));
  REQUIRE_THROWS_WITH(split(x, {8, -1}, 1), Catch::Contains("[split]"));
}

TEST_CASE("index_select gathers along any dim", "[index]") {
  Generator gen(23);
  const std::vector<Tensor> inputs = {
      randn({5, 6, 3}, gen),
      randn({3, 6, 5}, gen, {DType::f64}).permute({2, 1, 0}),
      randn({5, 6, 3}, gen, {DType::f64}, 0, 100).to(DType::i32),
  };
  for (const Tensor& x : inputs) {
    for (DType index_dtype : {DType::i32, DType::i64}) {
      for (int64_t dim : {0, 1, 2}) {
        INFO(dtype_name(x.dtype()) << " index " << dtype_name(index_dtype) << " dim " << dim);
        const Tensor index = from_vector<int64_t>({2, 0, 2, 1}).to(index_dtype);
        const Tensor out = index_select(x, dim, index);
        Shape want_shape = x.shape();
        want_shape[dim] = 4;
        REQUIRE(out.shape() == want_shape);
        REQUIRE(out.dtype() == x.dtype());
        const std::vector<double> xv = x.to_vector<double>();
        const std::vector<double> ov = out.to_vector<double>();
        const std::vector<int64_t> iv = index.to_vector<int64_t>();
        for (int64_t i = 0; i < want_shape[0]; ++i) {
          for (int64_t j = 0; j < want_shape[1]; ++j) {
            for (int64_t k = 0; k < want_shape[2]; ++k) {
              int64_t src[3] = {i, j, k};
              src[dim] = iv[src[dim]];
              REQUIRE(at(ov, want_shape, i, j, k) == at(xv, x.shape(), src[0], src[1], src[2]));
            }
          }
        }
      }
    }
  }
  CHECK(index_select(zeros({4, 2}), 0, zeros({0}, {DType::i64})).shape() == Shape{0, 2});
}

TEST_CASE("index_select errors", "[index]") {
  const Tensor x = zeros({5, 3});
  REQUIRE_THROWS_WITH(index_select(x, 0, from_vector<int64_t>({1, 4, 5})),
                      Catch::Contains("[index_select]") && Catch::Contains("[0, 5)") &&
                          Catch::Contains("found 5 at flat position 2"));
  REQUIRE_THROWS_WITH(index_select(x, 1, from_vector<int32_t>({-1})),
                      Catch::Contains("[index_select]") && Catch::Contains("found -1"));
  REQUIRE_THROWS_WITH(index_select(x, 0, zeros({2})),
                      Catch::Contains("[index_select]") && Catch::Contains("f32"));
  REQUIRE_THROWS_WITH(index_select(x, 0, from_vector<int64_t>({0, 1}, {1, 2})),
                      Catch::Contains("[index_select]") && Catch::Contains("(1, 2)"));
  REQUIRE_THROWS_WITH(index_select(x, 2, from_vector<int64_t>({0})),
                      Catch::Contains("[index_select]"));
}

TEST_CASE("index_add_ accumulates duplicates along any dim", "[index]") {
  Generator gen(24);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t dim : {0, 1, 2}) {
      for (bool transposed_out : {false, true}) {
        INFO(dtype_name(dtype) << " dim " << dim << " transposed out " << transposed_out);
        const Shape shape = {4, 5, 300};
        // A transposed out is written through its strides.
        Tensor out = transposed_out ? randn({300, 5, 4}, gen, {dtype}).permute({2, 1, 0})
                                    : randn(shape, gen, {dtype});
        const std::vector<double> before = out.to_vector<double>();
        const std::vector<int64_t> iv = {3, 0, 3, 1, 3};
        Shape src_shape = shape;
        src_shape[dim] = 5;
        const Tensor src =
            randn({src_shape[2], src_shape[1], src_shape[0]}, gen, {dtype}).permute({2, 1, 0});
        index_add_(out, dim, from_vector<int64_t>(iv), src);
        std::vector<double> want = before;
        const std::vector<double> sv = src.to_vector<double>();
        for (int64_t i = 0; i < src_shape[0]; ++i) {
          for (int64_t j = 0; j < src_shape[1]; ++j) {
            for (int64_t k = 0; k < src_shape[2]; ++k) {
              int64_t dst[3] = {i, j, k};
              dst[dim] = iv[dst[dim]];
              want[(dst[0] * shape[1] + dst[1]) * shape[2] + dst[2]] += at(sv, src_shape, i, j, k);
            }
          }
        }
        const std::vector<double> got = out.to_vector<double>();
        const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::abs(got[i] - want[i]) > tol * (1 + std::abs(want[i]))) {
            INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
            REQUIRE(false);
          }
        }
      }
    }
  }
}

TEST_CASE("index_add_ errors leave out untouched", "[index]") {
  const Tensor out = zeros({5, 3});
  REQUIRE_THROWS_WITH(index_add_(out, 0, from_vector<int64_t>({0, 7}), ones({2, 3})),
                      Catch::Contains("[index_add_]") && Catch::Contains("found 7"));
  CHECK(out.to_vector<double>() == std::vector<double>(15, 0.0));
  REQUIRE_THROWS_WITH(
      index_add_(out, 0, from_vector<int64_t>({0, 1}), ones({3, 3})),
      Catch::Contains("[index_add_]") && Catch::Contains("(2, 3)") && Catch::Contains("(3, 3)"));
  REQUIRE_THROWS_WITH(index_add_(out, 0, from_vector<int64_t>({0}), ones({1, 3}, {DType::f64})),
                      Catch::Contains("[index_add_]") && Catch::Contains("f64"));
  REQUIRE_THROWS_WITH(
      index_add_(zeros({5}, {DType::i32}), 0, from_vector<int64_t>({0}), ones({1}, {DType::i32})),
      Catch::Contains("[index_add_]") && Catch::Contains("i32"));
}
