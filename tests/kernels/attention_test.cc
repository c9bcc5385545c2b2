#include "kernels/attention.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "kernels/dropout.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using tessera::testing::max_abs_diff;

using kernels::causal_attention;
using kernels::causal_attention_backward;

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// The factors kernels::dropout applies to a contiguous (B, H, T, T) tensor: 1 / (1 - p)
// where it keeps an element, else 0 (empty without dropout).
std::vector<double> dropout_factors(const Tensor& q, const kernels::AttentionDropout& dropout) {
  if (!dropout.drops()) return {};
  const Tensor ones = full({q.size(0), q.size(1), q.size(2), q.size(2)}, 1.0, {DType::f64});
  return kernels::dropout(ones, dropout.p, dropout.seed, dropout.offset).to_vector<double>();
}

// Materializes the full masked (T, T) score matrix of every head in double, and the
// textbook gradients: with F the dropout factors (all 1 when `factors` is empty) and
// P' = P * F, out = P' V, dP' = dO V^T, dP = dP' * F, dS = P * (dP - rowsum(dP * P)),
// dQ = scale dS K, dK = scale dS^T Q, dV = P'^T dO.
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                    double scale, const std::vector<double>& factors = {}) {
  const std::vector<double> Q = q.to_vector<double>(), K = k.to_vector<double>(),
                            V = v.to_vector<double>(), dO = dout.to_vector<double>();
  const int64_t heads = q.size(0) * q.size(1), T = q.size(2), D = q.size(3);
  Reference r;
  r.out.assign(Q.size(), 0.0);
  r.dq.assign(Q.size(), 0.0);
  r.dk.assign(Q.size(), 0.0);
  r.dv.assign(Q.size(), 0.0);
  r.lse.assign(heads * T, 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t o = h * T * D;
    std::vector<double> P(T * T, 0.0), dP(T * T, 0.0), dS(T * T, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> s(T, -INFINITY);
      double max = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += Q[o + t * D + d] * K[o + j * D + d];
        s[j] = scale * dot;
        max = std::max(max, s[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < T; ++j) sum += std::exp(s[j] - max);  // exp(-inf) = 0
      r.lse[h * T + t] = max + std::log(sum);
      for (int64_t j = 0; j < T; ++j) P[t * T + j] = std::exp(s[j] - r.lse[h * T + t]);
    }
    std::vector<double> dropped = P;  // P'
    for (int64_t i = 0; i < T * T && !factors.empty(); ++i) dropped[i] *= factors[h * T * T + i];
    for (int64_t t = 0; t < T; ++t) {
      double rowsum = 0.0;
      for (int64_t j = 0; j < T; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          r.out[o + t * D + d] += dropped[t * T + j] * V[o + j * D + d];
          dP[t * T + j] += dO[o + t * D + d] * V[o + j * D + d];
        }
        if (!factors.empty()) dP[t * T + j] *= factors[h * T * T + t * T + j];
        rowsum += dP[t * T + j] * P[t * T + j];
      }
      for (int64_t j = 0; j < T; ++j) dS[t * T + j] = P[t * T + j] * (dP[t * T + j] - rowsum);
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < T; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          r.dq[o + t * D + d] += scale * dS[t * T + j] * K[o + j * D + d];
          r.dk[o + j * D + d] += scale * dS[t * T + j] * Q[o + t * D + d];
          r.dv[o + j * D + d] += dropped[t * T + j] * dO[o + t * D + d];
        }
      }
    }
  }
  return r;
}

// Runs forward and backward and compares all five results with the reference.
void check(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, double scale,
           double tol, const kernels::AttentionDropout& dropout = {}) {
  const Reference want = reference(q, k, v, dout, scale, dropout_factors(q, dropout));
  const kernels::AttentionOutput fwd = causal_attention(q, k, v, scale, dropout);
  REQUIRE(fwd.out.shape() == q.shape());
  REQUIRE(fwd.lse.shape() == Shape{q.size(0), q.size(1), q.size(2)});
  REQUIRE(max_abs_diff(fwd.out.to_vector<double>(), want.out) <= tol);
  REQUIRE(max_abs_diff(fwd.lse.to_vector<double>(), want.lse) <= tol);
  const kernels::AttentionGrads g =
      causal_attention_backward(dout, q, k, v, fwd.out, fwd.lse, scale, dropout);
  REQUIRE(max_abs_diff(g.dq.to_vector<double>(), want.dq) <= tol);
  REQUIRE(max_abs_diff(g.dk.to_vector<double>(), want.dk) <= tol);
  REQUIRE(max_abs_diff(g.dv.to_vector<double>(), want.dv) <= tol);
}

}  // namespace

TEST_CASE("causal_attention matches the materialized reference", "[attention]") {
  Generator gen(1);
  const Shape shape{2, 3, 7, 5};
  const double scale = 1 / std::sqrt(5.0);
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
    const Tensor q = randn(shape, gen, {dtype});
    const Tensor k = randn(shape, gen, {dtype});
    const Tensor v = randn(shape, gen, {dtype});
    const Tensor dout = randn(shape, gen, {dtype});
    check(q, k, v, dout, scale, tol);
    check(q, k, v, dout, 2.5, 10 * tol);  // peaked probabilities
  }
}

TEST_CASE("causal_attention reads heads split out of (B, T, H, D)", "[attention]") {
  Generator gen(2);
  const Shape bthd{2, 7, 3, 5};
  const Tensor q = randn(bthd, gen, {DType::f64}).transpose(1, 2);
  const Tensor k = randn(bthd, gen, {DType::f64}).transpose(1, 2);
  const Tensor v = randn(bthd, gen, {DType::f64}).transpose(1, 2);
  const Tensor dout = randn(bthd, gen, {DType::f64}).transpose(1, 2);
  REQUIRE_FALSE(q.is_contiguous());
  check(q, k, v, dout, 0.4, 1e-12);
}

TEST_CASE("causal_attention over many heads and a longer sequence", "[attention]") {
  Generator gen(3);
  const Shape shape{2, 4, 67, 16};
  const Tensor q = randn(shape, gen);
  const Tensor k = randn(shape, gen);
  const Tensor v = randn(shape, gen);
  const Tensor dout = randn(shape, gen);
  check(q, k, v, dout, 0.25, 2e-5);
}

TEST_CASE("causal_attention across several query and key blocks", "[attention]") {
  // Note [Causal attention on the CPU]: blocks of 64 positions, so T = 150 has two full
  // blocks and a partial one, and the online softmax rescales across three key blocks.
  // q, k and v are the three parts of one (B, T, 3, H, D) projection, as GPT splits them.
  Generator gen(6);
  const int64_t b = 2, t = 150, h = 3, d = 16;
  for (DType dtype : {DType::f32, DType::f64}) {
    const Tensor qkv = randn({b, t, 3, h, d}, gen, {dtype});
    const auto part = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
    const Tensor dout = randn({b, h, t, d}, gen, {dtype});
    REQUIRE_FALSE(part(0).is_contiguous());
    check(part(0), part(1), part(2), dout, 0.25, dtype == DType::f32 ? 2e-5 : 1e-12);
  }
}

TEST_CASE("causal_attention with heads at and past the small-block width", "[attention]") {
  // Note [Small block products]: f32 heads of up to 64 values (GPT-2's) take the small-block
  // path, with a masked last vector when D is not a multiple of 16; wider heads take Eigen's.
  // T = 80: a diagonal block, a full off-diagonal one and a partial diagonal one.
  Generator gen(8);
  for (const int64_t d : {64, 20, 72}) {
    const Shape shape{2, 3, 80, d};
    const Tensor q = randn(shape, gen), k = randn(shape, gen), v = randn(shape, gen);
    check(q, k, v, randn(shape, gen), 1 / std::sqrt(static_cast<double>(d)), 2e-5);
  }
}

TEST_CASE("causal_attention writes its outputs in (B, T, H, D) memory order", "[attention]") {
  // Merging the heads back into (B, T, C) is then a view, forward and backward.
  Generator gen(7);
  const Shape shape{2, 3, 9, 4};
  const Tensor q = randn(shape, gen), k = randn(shape, gen), v = randn(shape, gen);
  const kernels::AttentionOutput fwd = causal_attention(q, k, v, 0.5);
  REQUIRE(fwd.out.transpose(1, 2).is_contiguous());
  const kernels::AttentionGrads g =
      causal_attention_backward(randn(shape, gen), q, k, v, fwd.out, fwd.lse, 0.5);
  for (const Tensor& grad : {g.dq, g.dk, g.dv}) REQUIRE(grad.transpose(1, 2).is_contiguous());
}

TEST_CASE("causal_attention of one position returns v", "[attention]") {
  Generator gen(4);
  const Tensor q = randn({1, 2, 1, 3}, gen);
  const Tensor v = randn({1, 2, 1, 3}, gen);
  const kernels::AttentionOutput fwd = causal_attention(q, randn({1, 2, 1, 3}, gen), v, 1.0);
  REQUIRE(fwd.out.to_vector<double>() == v.to_vector<double>());
}

TEST_CASE("causal_attention drops the probabilities dropout(softmax) would", "[attention]") {
  // Note [Attention-probability dropout]: the mask is kernels::dropout's for the (B, H, T, T)
  // probabilities, here taken from dropout applied to ones, within and across key blocks
  // (T = 150: Note [Causal attention on the CPU]'s blocks of 64), with a nonzero offset.
  Generator gen(9);
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 2e-5 : 1e-12;
    for (const double p : {0.1, 0.5}) {
      const kernels::AttentionDropout dropout{p, 1234, 77};
      const Shape shape{2, 3, 7, 5};
      check(randn(shape, gen, {dtype}), randn(shape, gen, {dtype}), randn(shape, gen, {dtype}),
            randn(shape, gen, {dtype}), 0.45, tol, dropout);
      const int64_t b = 1, t = 150, h = 2, d = 16;
      const Tensor qkv = randn({b, t, 3, h, d}, gen, {dtype});
      const auto part = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
      check(part(0), part(1), part(2), randn({b, h, t, d}, gen, {dtype}), 0.25, tol, dropout);
    }
  }
  // bf16 and f16 widen to f32 and keep the mask: held to the f64 reference at 16-bit
  // tolerance, inputs rounded first.
  for (DType dtype : {DType::bf16, DType::f16}) {
    const Shape shape{1, 2, 80, 16};
    const auto rounded = [&] { return randn(shape, gen, {DType::f64}).to(dtype).to(DType::f64); };
    const Tensor q = rounded(), k = rounded(), v = rounded(), dout = rounded();
    const kernels::AttentionDropout dropout{0.3, 8, 1};
    const Reference want = reference(q, k, v, dout, 0.25, dropout_factors(q, dropout));
    const kernels::AttentionOutput fwd =
        causal_attention(q.to(dtype), k.to(dtype), v.to(dtype), 0.25, dropout);
    CHECK(max_abs_diff(fwd.out.to_vector<double>(), want.out) <= 3e-2);
    const kernels::AttentionGrads g = causal_attention_backward(
        dout.to(dtype), q.to(dtype), k.to(dtype), v.to(dtype), fwd.out, fwd.lse, 0.25, dropout);
    CHECK(max_abs_diff(g.dv.to_vector<double>(), want.dv) <= 3e-2);
    CHECK(max_abs_diff(g.dq.to_vector<double>(), want.dq) <= 3e-2);
  }
}

TEST_CASE("causal_attention's dropped probabilities are exactly dropout's zeros", "[attention]") {
  // With v the identity (D = T), out row t is the dropped probability row P'[t]: zero exactly
  // where dropout of ones is zero, at every visible key, across blocks; p = 0 drops nothing.
  Generator gen(10);
  const int64_t t = 70;
  const Tensor q = randn({1, 2, t, t}, gen, {DType::f64}),
               k = randn({1, 2, t, t}, gen, {DType::f64});
  std::vector<double> eye(static_cast<size_t>(2 * t * t), 0.0);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t j = 0; j < t; ++j) eye[static_cast<size_t>((h * t + j) * t + j)] = 1.0;
  }
  const Tensor v = from_vector(eye, {1, 2, t, t});
  const kernels::AttentionDropout dropout{0.3, 99, 5};
  const std::vector<double> out = causal_attention(q, k, v, 0.1, dropout).out.to_vector<double>();
  const std::vector<double> factors = dropout_factors(q, dropout);
  int64_t dropped = 0;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        const size_t at = static_cast<size_t>((h * t + i) * t + j);
        REQUIRE((out[at] == 0.0) == (factors[at] == 0.0));
        dropped += factors[at] == 0.0;
      }
    }
  }
  REQUIRE(dropped > 0.25 * t * (t + 1));  // about 30% of the 2 t (t + 1) / 2 visible keys
  REQUIRE(dropped < 0.35 * t * (t + 1));
  const kernels::AttentionDropout none{0.0, 99, 5};
  REQUIRE(causal_attention(q, k, v, 0.1, none).out.to_vector<double>() ==
          causal_attention(q, k, v, 0.1).out.to_vector<double>());
}

TEST_CASE("causal_attention backward matches finite differences", "[attention]") {
  Generator gen(5);
  const Shape shape{1, 2, 5, 3};
  const Tensor q = randn(shape, gen, {DType::f64});
  const Tensor k = randn(shape, gen, {DType::f64});
  const Tensor v = randn(shape, gen, {DType::f64});
  const Tensor dout = randn(shape, gen, {DType::f64});
  const double scale = 0.7;
  // The loss with and without dropout: the mask is fixed by (seed, offset).
  const kernels::AttentionDropout dropout =
      GENERATE(kernels::AttentionDropout{}, kernels::AttentionDropout{0.4, 3, 11});
  const kernels::AttentionOutput fwd = causal_attention(q, k, v, scale, dropout);
  const kernels::AttentionGrads g =
      causal_attention_backward(dout, q, k, v, fwd.out, fwd.lse, scale, dropout);
  const std::vector<double> dov = dout.to_vector<double>();
  // Perturbs input `which` (0: q, 1: k, 2: v) and returns sum(dout * out).
  const auto loss = [&](int which, const std::vector<double>& values) {
    const Tensor t = from_vector(values, shape);
    const Tensor out =
        causal_attention(which == 0 ? t : q, which == 1 ? t : k, which == 2 ? t : v, scale, dropout)
            .out;
    const std::vector<double> ov = out.to_vector<double>();
    double l = 0.0;
    for (size_t i = 0; i < ov.size(); ++i) l += dov[i] * ov[i];
    return l;
  };
  const Tensor inputs[] = {q, k, v};
  const Tensor grads[] = {g.dq, g.dk, g.dv};
  for (int which = 0; which < 3; ++which) {
    std::vector<double> x = inputs[which].to_vector<double>();
    std::vector<double> fd(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + 1e-6;
      const double up = loss(which, x);
      x[i] = saved - 1e-6;
      const double down = loss(which, x);
      x[i] = saved;
      fd[i] = (up - down) / 2e-6;
    }
    REQUIRE(max_abs_diff(grads[which].to_vector<double>(), fd) <= 1e-8);
  }
}

TEST_CASE("causal_attention rejects bad inputs", "[attention]") {
  const Tensor q = zeros({2, 3, 7, 5});
  REQUIRE_THROWS_WITH(
      causal_attention(q, zeros({2, 3, 6, 5}), q, 1.0),
      Catch::Contains("[causal_attention] shapes differ: q (2, 3, 7, 5) vs k (2, 3, 6, 5)"));
  REQUIRE_THROWS_WITH(
      causal_attention(zeros({3, 7, 5}), zeros({3, 7, 5}), zeros({3, 7, 5}), 1.0),
      Catch::Contains("[causal_attention] expected q of shape (B, H, T, D), found (3, 7, 5)"));
  REQUIRE_THROWS_WITH(causal_attention(q, q, zeros({2, 3, 7, 5}, {DType::f64}), 1.0),
                      Catch::Contains("[causal_attention] dtypes differ: q f32 vs v f64"));
  REQUIRE_THROWS_WITH(causal_attention(q, q, q, INFINITY),
                      Catch::Contains("[causal_attention] expected a finite scale"));
  REQUIRE_THROWS_WITH(causal_attention(q, q, q, 1.0, {1.0, 0, 0}),
                      Catch::Contains("[causal_attention] expected a dropout probability in [0, "
                                      "1), found 1"));
  REQUIRE_THROWS_WITH(
      causal_attention_backward(q, q, q, q, q, zeros({2, 3, 5}), 1.0),
      Catch::Contains("[causal_attention_backward] expected lse of shape (2, 3, 7), found "
                      "(2, 3, 5)"));
  REQUIRE_THROWS_WITH(causal_attention_backward(q, q, q, q, Tensor(), zeros({2, 3, 7}), 1.0),
                      Catch::Contains("[causal_attention_backward] expected out to be a defined"));
}

}  // namespace tessera
