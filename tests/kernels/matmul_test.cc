#include "kernels/matmul.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/cpu/matmul.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using tessera::testing::max_abs_diff;

using kernels::matmul;

// op(a) @ op(b) in double with naive loops; a: (..., R, C), b: 2-D or batched like a.
std::vector<double> reference(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const std::vector<double> av = a.to_vector<double>();
  const std::vector<double> bv = b.to_vector<double>();
  const int64_t ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bc = b.size(-1);
  const int64_t m = trans_a ? ac : ar;
  const int64_t k = trans_a ? ar : ac;
  const int64_t n = trans_b ? br : bc;
  int64_t batches = 1;
  for (int64_t d = 0; d + 2 < a.dim(); ++d) batches *= a.size(d);
  std::vector<double> out(batches * m * n, 0.0);
  for (int64_t t = 0; t < batches; ++t) {
    const int64_t ao = t * ar * ac;
    const int64_t bo = b.dim() > 2 ? t * br * bc : 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t l = 0; l < k; ++l) {
          const double x = trans_a ? av[ao + l * ac + i] : av[ao + i * ac + l];
          const double y = trans_b ? bv[bo + j * bc + l] : bv[bo + l * bc + j];
          acc += x * y;
        }
        out[(t * m + i) * n + j] = acc;
      }
    }
  }
  return out;
}

double tolerance(DType dtype) { return dtype == DType::f32 ? 1e-4 : 1e-12; }

// Checks matmul against the reference, including the output shape.
void check(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double tol) {
  const Tensor out = matmul(a, b, trans_a, trans_b);
  Shape want(a.shape().begin(), a.shape().end() - 2);
  want.push_back(trans_a ? a.size(-1) : a.size(-2));
  want.push_back(trans_b ? b.size(-2) : b.size(-1));
  REQUIRE(out.shape() == want);
  REQUIRE(out.is_contiguous());
  REQUIRE(out.dtype() == a.dtype());
  REQUIRE(max_abs_diff(out.to_vector<double>(), reference(a, b, trans_a, trans_b)) <= tol);
}

// Shape of a stored operand: (rows, cols), swapped when the flag transposes it.
Shape stored(Shape batch, int64_t rows, int64_t cols, bool trans) {
  batch.push_back(trans ? cols : rows);
  batch.push_back(trans ? rows : cols);
  return batch;
}

constexpr int64_t M = 3, K = 7, N = 5;

}  // namespace

TEST_CASE("matmul 2-D, every trans combination, f32 and f64", "[matmul]") {
  Generator gen(1);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = randn(stored({}, M, K, ta), gen, {dtype});
        const Tensor b = randn(stored({}, K, N, tb), gen, {dtype});
        check(a, b, ta, tb, tolerance(dtype));
      }
    }
  }
}

TEST_CASE("matmul batched a with a shared 2-D b", "[matmul]") {
  Generator gen(2);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = randn(stored({2, 3}, M, K, ta), gen, {dtype});
        const Tensor b = randn(stored({}, K, N, tb), gen, {dtype});
        check(a, b, ta, tb, tolerance(dtype));
      }
    }
  }
}

TEST_CASE("matmul batched a and b", "[matmul]") {
  Generator gen(3);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = randn(stored({4}, M, K, ta), gen, {dtype});
        const Tensor b = randn(stored({4}, K, N, tb), gen, {dtype});
        check(a, b, ta, tb, tolerance(dtype));
        // More batches than threads: threads take whole batches.
        const Tensor a4 = randn(stored({3, 5}, 33, 17, ta), gen, {dtype});
        const Tensor b4 = randn(stored({3, 5}, 17, 9, tb), gen, {dtype});
        check(a4, b4, ta, tb, tolerance(dtype));
      }
    }
  }
}

TEST_CASE("matmul at sizes beyond Eigen's blocking", "[matmul]") {
  Generator gen(4);
  const Tensor a = randn({2, 130, 300}, gen, {DType::f64});
  const Tensor b = randn({300, 257}, gen, {DType::f64});
  check(a, b, false, false, 1e-10);
  check(a.to(DType::f32), b.to(DType::f32), false, false, 1e-3);
  const Tensor bt = randn({2, 257, 300}, gen, {DType::f32});
  check(a.to(DType::f32), bt, false, true, 1e-3);
}

TEST_CASE("f32 matmul across the packed kernel's tile and block edges", "[matmul]") {
  // Note [Packed SGEMM]: tiles of 8 x 48, blocks of 1536 (M) x 384 (K) x 192 (N), and 16 x
  // 16 transposes while packing. Sizes just past each edge, in every layout, contiguous and
  // as views with a leading dimension wider than their rows; the larger ones are split
  // across threads (Note [GEMM threading]).
  Generator gen(9);
  struct Size {
    int64_t m, n, k;
  };
  for (const Size s : {Size{16, 16, 16}, Size{1549, 33, 21}, Size{37, 801, 19}, Size{29, 47, 403},
                       Size{25, 770, 390}, Size{300, 301, 100}, Size{9, 193, 385}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Shape as = stored({}, s.m, s.k, ta);
        const Shape bs = stored({}, s.k, s.n, tb);
        check(randn(as, gen), randn(bs, gen), ta, tb, 1e-3);
        const Tensor a_view = randn({as[0], as[1] + 5}, gen).narrow(1, 2, as[1]);
        const Tensor b_view = randn({bs[0], bs[1] + 3}, gen).narrow(1, 1, bs[1]);
        check(a_view, b_view, ta, tb, 1e-3);
      }
    }
  }
}

TEST_CASE("f32 x W^T as C^T = W x^T across its tile and block edges", "[matmul]") {
  // Note [Transposed SGEMM]: a B stored (N, K) that is wider than A is tall runs as C^T =
  // B^T A^T with tiles of 8 (weight rows) x 32 (tokens), blocks of 1536 weight rows, 768
  // steps of k and 256 tokens, and each tile stored transposed (added to C after the first
  // k block). Token counts just past 256, weight rows not a multiple of 8 per thread, more
  // than 1536 weight rows per thread and k past 768; a as given and as a transposed view.
  Generator gen(10);
  struct Size {
    int64_t m, n, k;
  };
  for (const Size s : {Size{261, 1037, 781}, Size{37, 3203, 790}, Size{33, 45, 20}}) {
    for (bool ta : {false, true}) {
      check(randn(stored({}, s.m, s.k, ta), gen), randn({s.n, s.k}, gen), ta, true, 1e-3);
    }
    const Tensor x_rows = randn({s.m, s.k + 6}, gen).narrow(1, 3, s.k);
    const Tensor w_rows = randn({s.n, s.k + 2}, gen).narrow(1, 1, s.k);
    check(x_rows, w_rows, false, true, 1e-3);
  }
}

TEST_CASE("matmul reads non-contiguous operands", "[matmul]") {
  Generator gen(5);
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = tolerance(dtype);
    const Tensor b = randn({K, N}, gen, {dtype});
    SECTION("transposed views, with and without flags") {
      const Tensor at = randn({K, M}, gen, {dtype}).transpose(0, 1);  // (M, K) column-major
      const Tensor bt = randn({N, K}, gen, {dtype}).transpose(0, 1);  // (K, N) column-major
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Tensor a_op = ta ? randn({M, K}, gen, {dtype}).transpose(0, 1) : at;
          const Tensor b_op = tb ? randn({K, N}, gen, {dtype}).transpose(0, 1) : bt;
          check(a_op, b_op, ta, tb, tol);
        }
      }
    }
    SECTION("rows of a wider tensor (narrow of the last dim)") {
      const Tensor wide = randn({2, 4, M, K + 3}, gen, {dtype});
      check(wide.narrow(3, 2, K), b, false, false, tol);
      check(wide.narrow(3, 1, K).narrow(1, 1, 2), b, false, false, tol);
      const Tensor wide_b = randn({K, N + 4}, gen, {dtype});
      check(wide.narrow(3, 2, K), wide_b.narrow(1, 3, N), false, false, tol);
    }
    SECTION("permuted batch dims") {
      const Tensor tbc = randn({M, 4, K}, gen, {dtype});  // (T, B, C)
      check(tbc.transpose(0, 1), b, false, false, tol);
      check(tbc.transpose(0, 1), b.transpose(0, 1).contiguous(), false, true, tol);
      const Tensor batched_b = randn({4, K, N}, gen, {dtype});
      check(tbc.transpose(0, 1), batched_b, false, false, tol);
    }
    SECTION("layouts that need a copy: expanded and strided in both dims") {
      const Tensor row = randn({1, N}, gen, {dtype});
      check(randn({M, K}, gen, {dtype}), row.expand({K, N}), false, false, tol);
      const Tensor big = randn({2 * M, 2 * K}, gen, {dtype});
      const Tensor strided = big.slice(0, 0, 2 * M, 2).slice(1, 0, 2 * K, 2);  // (M, K)
      check(strided, b, false, false, tol);
      check(strided, randn({M, N}, gen, {dtype}), true, false, tol);
      check(randn({M, 1, K}, gen, {dtype}).expand({M, 4, K}), b, false, false, tol);
    }
    SECTION("single rows and columns") {
      check(randn({1, K}, gen, {dtype}), b, false, false, tol);
      check(randn({M, K}, gen, {dtype}), randn({K, 1}, gen, {dtype}), false, false, tol);
      check(randn({K, M}, gen, {dtype}).narrow(1, 1, 1), b, true, false, tol);
      check(randn({4, 1, K}, gen, {dtype}), b, false, false, tol);
    }
  }
}

TEST_CASE("matmul of empty operands", "[matmul]") {
  const Tensor zero_k = matmul(ones({M, 0}), ones({0, N}));
  REQUIRE(zero_k.shape() == Shape{M, N});
  for (double v : zero_k.to_vector<double>()) REQUIRE(v == 0.0);
  REQUIRE(matmul(ones({0, K}), ones({K, N})).shape() == Shape{0, N});
  REQUIRE(matmul(ones({2, 0, M, K}), ones({K, N})).shape() == Shape{2, 0, M, N});
}

TEST_CASE("matmul reads inputs that require grad without recording", "[matmul]") {
  Generator gen(6);
  Tensor a = randn({M, K}, gen);
  a.set_requires_grad(true);
  Tensor row = randn({1, N}, gen);
  row.set_requires_grad(true);
  Tensor b;
  {
    NoGradGuard guard;
    b = row.expand({K, N});  // stride 0: matmul must copy it
  }
  REQUIRE(GradMode::is_enabled());
  check(a, b, false, false, 1e-4);
}

TEST_CASE("matmul rejects mismatched operands", "[matmul]") {
  REQUIRE_THROWS_WITH(matmul(ones({4, 5}), ones({6, 2})),
                      Catch::Contains("[matmul] inner dimensions differ: (4, 5) vs (6, 2)"));
  REQUIRE_THROWS_WITH(matmul(ones({4, 5}), ones({2, 6}), false, true),
                      Catch::Contains("[matmul] inner dimensions differ: (4, 5) vs (2, 6)"));
  REQUIRE_THROWS_WITH(matmul(ones({2, 4, 5}), ones({3, 5, 2})),
                      Catch::Contains("[matmul] batch dimensions differ: (2, 4, 5) vs (3, 5, 2)"));
  REQUIRE_THROWS_WITH(
      matmul(ones({2, 2, 4, 5}), ones({2, 5, 2})),
      Catch::Contains("[matmul] expected b with 2 dims or as many as a (2, 2, 4, 5), "
                      "found (2, 5, 2)"));
  REQUIRE_THROWS_WITH(matmul(ones({5}), ones({5, 2})),
                      Catch::Contains("[matmul] expected a with at least 2 dims, found (5)"));
  REQUIRE_THROWS_WITH(matmul(ones({4, 5}), ones({5, 2}, {DType::f64})),
                      Catch::Contains("[matmul] dtypes differ: a f32 vs b f64"));
  REQUIRE_THROWS_WITH(
      matmul(ones({4, 5}, {DType::i32}), ones({5, 2}, {DType::i32})),
      Catch::Contains("[matmul] expected a of dtype f32, f64, f16 or bf16, found i32"));
  REQUIRE_THROWS_WITH(matmul(Tensor(), ones({5, 2})),
                      Catch::Contains("[matmul] expected a to be a defined tensor"));
}

TEST_CASE("f32 linear adds its bias inside the GEMM, once, in every path", "[matmul]") {
  // sgemm adds the bias to the first k block's sums: the transposed path (8 x 32 tiles, k
  // blocks of 768), the row-major path (8 x 48 tiles, k blocks of 384, weights packed or
  // read in place) and edge tiles, each with k past one block; small shapes go to Eigen.
  Generator gen(42);
  struct Size {
    int64_t m, n, k;
  };
  for (const Size s :
       {Size{261, 1037, 781}, Size{300, 301, 401}, Size{37, 50, 400}, Size{5, 3, 4}}) {
    INFO("m " << s.m << " n " << s.n << " k " << s.k);
    const Tensor x = randn({s.m, s.k}, gen);
    const Tensor w = randn({s.n, s.k}, gen);
    const Tensor b = randn({s.n}, gen);
    std::vector<double> want = reference(x, w, false, true);
    const std::vector<double> bv = b.to_vector<double>();
    for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % s.n];
    CHECK(max_abs_diff(kernels::linear(x, w, b).to_vector<double>(), want) <= 1e-3);
    // The weight stored (in, out): B's rows read in place.
    const Tensor w_in_out = w.transpose(0, 1).contiguous();
    CHECK(max_abs_diff(kernels::cpu::matmul(x, w_in_out, false, false, b).to_vector<double>(),
                       want) <= 1e-3);
  }
}

TEST_CASE("linear adds the bias to every row of x @ weight^T", "[matmul]") {
  Generator gen(41);
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x = randn({2, 3, 7}, gen, {dt});
    const Tensor w = randn({5, 7}, gen, {dt});
    const Tensor b = randn({5}, gen, {dt});
    const std::vector<double> xw = reference(x, w, false, true);
    const std::vector<double> bv = b.to_vector<double>();
    std::vector<double> want = xw;
    for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 5];
    const Tensor y = kernels::linear(x, w, b);
    REQUIRE(y.shape() == Shape{2, 3, 5});
    CHECK(max_abs_diff(y.to_vector<double>(), want) <= tolerance(dt));
    CHECK(max_abs_diff(kernels::linear(x, w, Tensor()).to_vector<double>(), xw) <= tolerance(dt));
  }
  const Tensor x = zeros({2, 7});
  REQUIRE_THROWS_WITH(kernels::linear(x, zeros({5, 7}), zeros({4})),
                      Catch::Contains("[linear] expected bias of shape (5), found (4)"));
  REQUIRE_THROWS_WITH(kernels::linear(x, zeros({5, 7}), zeros({5}, {DType::f64})),
                      Catch::Contains("[linear] dtypes differ: x f32 vs bias f64"));
  REQUIRE_THROWS_WITH(kernels::linear(x, zeros({5, 6}), Tensor()),
                      Catch::Contains("[matmul] inner dimensions differ"));
}

TEST_CASE("linear_param_grads gives g^T x and g summed over its rows", "[matmul]") {
  Generator gen(42);
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor g = randn({9, 5}, gen, {dt});  // (R, N)
    const Tensor x = randn({9, 7}, gen, {dt});  // (R, K)
    const kernels::LinearParamGrads p = kernels::linear_param_grads(g, x);
    REQUIRE(p.dweight.shape() == Shape{5, 7});
    CHECK(max_abs_diff(p.dweight.to_vector<double>(), reference(g, x, true, false)) <=
          tolerance(dt));
    const std::vector<double> gv = g.to_vector<double>();
    std::vector<double> sums(5, 0.0);
    for (size_t i = 0; i < gv.size(); ++i) sums[i % 5] += gv[i];
    REQUIRE(p.dbias.shape() == Shape{5});
    CHECK(max_abs_diff(p.dbias.to_vector<double>(), sums) <= tolerance(dt));
  }
  REQUIRE_THROWS_WITH(kernels::linear_param_grads(zeros({9, 5}), zeros({8, 7})),
                      Catch::Contains("[linear_param_grads] expected g (R, N) and x (R, K) with "
                                      "the same rows, found (9, 5) and (8, 7)"));
}

TEST_CASE("add_linear_param_grads adds g^T x into the weight's gradient", "[matmul]") {
  Generator gen(43);
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor g = randn({9, 5}, gen, {dt});    // (R, N)
    const Tensor x = randn({9, 7}, gen, {dt});    // (R, K)
    const Tensor acc = randn({5, 7}, gen, {dt});  // earlier sums
    std::vector<double> want = reference(g, x, true, false);
    const std::vector<double> before = acc.to_vector<double>();
    for (size_t i = 0; i < want.size(); ++i) want[i] += before[i];
    const Tensor dbias = kernels::add_linear_param_grads(g, x, acc, true);
    CHECK(max_abs_diff(acc.to_vector<double>(), want) <= 2 * tolerance(dt));
    CHECK(dbias.to_vector<double>() == kernels::linear_param_grads(g, x).dbias.to_vector<double>());
    CHECK_FALSE(kernels::add_linear_param_grads(g, x, acc, false).defined());
  }
  REQUIRE_THROWS_WITH(
      kernels::add_linear_param_grads(zeros({9, 5}), zeros({9, 7}), zeros({7, 5}), false),
      Catch::Contains("[add_linear_param_grads] expected dweight a contiguous f32 (5, 7) tensor "
                      "on cpu, found"));
  REQUIRE_THROWS_WITH(kernels::add_linear_param_grads(zeros({9, 5}), zeros({9, 7}),
                                                      zeros({7, 5}).transpose(0, 1), false),
                      Catch::Contains("expected dweight a contiguous f32 (5, 7) tensor"));
}

}  // namespace tessera
