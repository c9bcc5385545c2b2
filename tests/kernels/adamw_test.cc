#include "kernels/adamw.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "kernels/blas1.h"

namespace tessera {
namespace {

using kernels::adamw_step;
using kernels::AdamWParams;

// One step of DeepSpeed FusedAdam on scalars in double.
void reference_step(std::vector<double>& p, std::vector<double> g, std::vector<double>& m,
                    std::vector<double>& v, const AdamWParams& hp) {
  const double bc1 = hp.bias_correction ? 1 - std::pow(hp.beta1, hp.step) : 1.0;
  const double bc2 = hp.bias_correction ? 1 - std::pow(hp.beta2, hp.step) : 1.0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!hp.adam_w_mode) g[i] += hp.weight_decay * p[i];
    m[i] = hp.beta1 * m[i] + (1 - hp.beta1) * g[i];
    v[i] = hp.beta2 * v[i] + (1 - hp.beta2) * g[i] * g[i];
    double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + hp.eps);
    if (hp.adam_w_mode) update += hp.weight_decay * p[i];
    p[i] -= hp.lr * update;
  }
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(b[i])));
  }
  return d;
}

// Runs three steps of the kernel and of the reference on n elements and compares them.
void check_steps(DType dtype, int64_t n, AdamWParams hp, double tol) {
  Generator gen(7);
  const Tensor param = randn({n}, gen, {dtype});
  const Tensor exp_avg = zeros({n}, {dtype});
  const Tensor exp_avg_sq = zeros({n}, {dtype});
  std::vector<double> p = param.to_vector<double>();
  std::vector<double> m(n, 0.0), v(n, 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor grad = randn({n}, gen, {dtype}, 0.0, 0.1 * step);
    hp.step = step;
    adamw_step(param, grad, exp_avg, exp_avg_sq, hp);
    reference_step(p, grad.to_vector<double>(), m, v, hp);
    REQUIRE(max_rel_diff(param.to_vector<double>(), p) <= tol);
    REQUIRE(max_rel_diff(exp_avg.to_vector<double>(), m) <= tol);
    REQUIRE(max_rel_diff(exp_avg_sq.to_vector<double>(), v) <= tol);
  }
}

}  // namespace

TEST_CASE("adamw_step matches the scalar reference in both modes", "[adamw]") {
  for (DType dtype : {DType::f32, DType::f64}) {
    const double tol = dtype == DType::f32 ? 1e-5 : 1e-14;
    for (bool adam_w_mode : {true, false}) {
      for (bool bias_correction : {true, false}) {
        AdamWParams hp;
        hp.lr = 1e-2;
        hp.beta1 = 0.8;
        hp.beta2 = 0.95;
        hp.eps = 1e-6;
        hp.weight_decay = 0.1;
        hp.adam_w_mode = adam_w_mode;
        hp.bias_correction = bias_correction;
        CAPTURE(dtype_name(dtype), adam_w_mode, bias_correction);
        check_steps(dtype, 13, hp, tol);
        // Past one block and one thread's grain, not a multiple of either.
        check_steps(dtype, 70001, hp, tol);
      }
    }
  }
}

TEST_CASE("adamw_step with zero weight decay is plain Adam", "[adamw]") {
  AdamWParams hp;
  hp.weight_decay = 0.0;
  check_steps(DType::f64, 129, hp, 1e-14);
  hp.adam_w_mode = false;
  check_steps(DType::f64, 129, hp, 1e-14);
}

TEST_CASE("adamw_step rejects bad tensors and steps", "[adamw]") {
  const Tensor p = zeros({4, 3});
  const Tensor z = zeros({4, 3});
  AdamWParams hp;
  REQUIRE_THROWS_WITH(adamw_step(p, zeros({3, 4}).transpose(0, 1), z, z, hp),
                      Catch::Contains("[adamw_step] expected a contiguous grad, found strides "
                                      "(1, 4) for shape (4, 3)"));
  REQUIRE_THROWS_WITH(adamw_step(p, z, zeros({12}), z, hp),
                      Catch::Contains("[adamw_step] shapes differ: param (4, 3) vs exp_avg (12)"));
  REQUIRE_THROWS_WITH(adamw_step(p, zeros({4, 3}, {DType::f64}), z, z, hp),
                      Catch::Contains("[adamw_step] dtypes differ: param f32 vs grad f64"));
  REQUIRE_THROWS_WITH(
      adamw_step(zeros({2}, {DType::i64}), zeros({2}, {DType::i64}), zeros({2}, {DType::i64}),
                 zeros({2}, {DType::i64}), hp),
      Catch::Contains("[adamw_step] expected param of dtype f32, f64, f16 or bf16, found i64"));
  hp.step = 0;
  REQUIRE_THROWS_WITH(adamw_step(p, z, z, z, hp),
                      Catch::Contains("[adamw_step] expected step >= 1 with bias correction, "
                                      "found 0"));
}

TEST_CASE("the multi-tensor adamw_step equals one step per tensor", "[adamw]") {
  AdamWParams hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.1;
  hp.step = 2;
  Generator gen(11);
  // Past two threads' grain in all: the threads' ranges start inside a tensor and span
  // several, including an empty one.
  const std::vector<Shape> shapes = {{5}, {3, 7}, {0}, {70001}, {1000}, {65539}};
  std::vector<kernels::AdamWTensors> before, multi, single;
  for (const Shape& s : shapes) {
    const Tensor p = randn(s, gen), g = randn(s, gen), m = randn(s, gen), v = rand(s, gen);
    before.push_back({p, g, m, v, Tensor()});
    multi.push_back({p.clone(), g, m.clone(), v.clone(), Tensor()});
    single.push_back({p.clone(), g, m.clone(), v.clone(), Tensor()});
  }
  adamw_step(multi, hp);
  for (const kernels::AdamWTensors& t : single) {
    adamw_step(t.param, t.grad, t.exp_avg, t.exp_avg_sq, hp);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    CAPTURE(i);
    CHECK(multi[i].param.to_vector<float>() == single[i].param.to_vector<float>());
    CHECK(multi[i].exp_avg.to_vector<float>() == single[i].exp_avg.to_vector<float>());
    CHECK(multi[i].exp_avg_sq.to_vector<float>() == single[i].exp_avg_sq.to_vector<float>());
    // Every element against the scalar reference too: a range skipped or updated twice fails.
    std::vector<double> p = before[i].param.to_vector<double>();
    std::vector<double> m = before[i].exp_avg.to_vector<double>();
    std::vector<double> v = before[i].exp_avg_sq.to_vector<double>();
    reference_step(p, before[i].grad.to_vector<double>(), m, v, hp);
    CHECK(max_rel_diff(multi[i].param.to_vector<double>(), p) <= 1e-5);
    CHECK(max_rel_diff(multi[i].exp_avg.to_vector<double>(), m) <= 1e-5);
    CHECK(max_rel_diff(multi[i].exp_avg_sq.to_vector<double>(), v) <= 1e-5);
  }
}

// Note [AdamW in cache-sized blocks]: the same values step to the same bits wherever the
// tensors lie. Views at offsets 1-15 elements into larger buffers (so no operand starts on
// a 64-byte boundary, and each block's first elements would take Eigen's scalar path) step
// as aligned copies do, in both modes and dtypes, over several steps.
TEST_CASE("adamw_step does not depend on where its tensors lie", "[adamw]") {
  const int64_t n = 5000;
  for (const DType dtype : {DType::f32, DType::f64}) {
    for (const bool adamw : {true, false}) {
      for (const int64_t offset : {1, 3, 7, 15}) {
        Generator gen(static_cast<uint64_t>(offset));
        const Tensor p0 = randn({n}, gen, {dtype}), g0 = randn({n}, gen, {dtype});
        const Tensor p = p0.clone(), m = zeros({n}, {dtype}), v = zeros({n}, {dtype});  // aligned
        const Tensor wp = zeros({n + offset}, {dtype}), wm = zeros({n + offset}, {dtype}),
                     wv = zeros({n + offset}, {dtype});
        const Tensor q = wp.narrow(0, offset, n), mq = wm.narrow(0, offset, n),
                     vq = wv.narrow(0, offset, n);
        q.copy_(p0);
        for (int step = 1; step <= 3; ++step) {
          const AdamWParams hp{1e-2, 0.9, 0.999, 1e-8, 0.1, step, true, adamw};
          adamw_step(p, g0, m, v, hp);
          adamw_step(q, g0, mq, vq, hp);
        }
        INFO(dtype_name(dtype) << ", offset " << offset << ", adam_w_mode " << adamw);
        CHECK(q.to_vector<double>() == p.to_vector<double>());
        CHECK(mq.to_vector<double>() == m.to_vector<double>());
        CHECK(vq.to_vector<double>() == v.to_vector<double>());
      }
    }
  }
}

TEST_CASE("the multi-tensor adamw_step checks every entry", "[adamw]") {
  const Tensor z = zeros({3});
  const Tensor d = zeros({3}, {DType::f64});
  AdamWParams hp;
  REQUIRE_NOTHROW(adamw_step(std::vector<kernels::AdamWTensors>{}, hp));
  REQUIRE_THROWS_WITH(adamw_step({{z, z, z, z, Tensor()}, {d, d, d, d, Tensor()}}, hp),
                      Catch::Contains("[adamw_step] expected every tensor on cpu in f32, found "
                                      "tensor 1 on cpu in f64"));
  REQUIRE_THROWS_WITH(adamw_step({{z, z, z, z, Tensor()}, {z, z, zeros({4}), z, Tensor()}}, hp),
                      Catch::Contains("[adamw_step] shapes differ: param (3) vs exp_avg (4)"));
}

namespace {

// The operands of one scaled step: f32 parameters and moments at `offset` elements into
// larger buffers (so Eigen's scalar path and the staging take part), with their copies.
std::vector<kernels::AdamWTensors> scaled_operands(const std::vector<Shape>& shapes, int64_t offset,
                                                   DType copy_dtype, uint64_t seed) {
  Generator gen(seed);
  std::vector<kernels::AdamWTensors> out;
  for (const Shape& s : shapes) {
    const auto placed = [&](const Tensor& t) {
      const Tensor buffer = zeros({t.numel() + offset});
      buffer.narrow(0, offset, t.numel()).copy_(t.reshape({t.numel()}));
      return buffer.narrow(0, offset, t.numel()).view(s);
    };
    out.push_back({placed(randn(s, gen)), randn(s, gen), placed(randn(s, gen)),
                   placed(rand(s, gen)), zeros(s, {copy_dtype})});
  }
  return out;
}

std::vector<kernels::AdamWTensors> cloned(const std::vector<kernels::AdamWTensors>& ts) {
  std::vector<kernels::AdamWTensors> out;
  for (const kernels::AdamWTensors& t : ts) {
    out.push_back({t.param.clone(), t.grad.clone(), t.exp_avg.clone(), t.exp_avg_sq.clone(),
                   t.model_copy.clone()});
  }
  return out;
}

}  // namespace

// Note [Scaled AdamW]: one pass gives the bits of the separate passes.
TEST_CASE("a scaled adamw_step with model copies equals scale_, adamw_step and copy_ in turn",
          "[adamw]") {
  const std::vector<Shape> shapes = {{5}, {3, 7}, {70001}, {1000}};
  AdamWParams hp;
  hp.lr = 1e-2;
  hp.weight_decay = 0.1;
  hp.step = 3;
  for (const DType copy_dtype : {DType::bf16, DType::f16}) {
    for (const double factor : {1.0, 0.37, 1.0 / 1024}) {
      for (const int64_t offset : {0, 3}) {
        INFO(dtype_name(copy_dtype) << " copies, factor " << factor << ", offset " << offset);
        const std::vector<kernels::AdamWTensors> fused =
            scaled_operands(shapes, offset, copy_dtype, 5 + static_cast<uint64_t>(offset));
        const std::vector<kernels::AdamWTensors> separate = cloned(fused);
        std::vector<kernels::AdamWTensors> plain;  // the separate passes' operands
        for (const kernels::AdamWTensors& t : separate) {
          kernels::scale_(t.grad, factor);
          plain.push_back({t.param, t.grad, t.exp_avg, t.exp_avg_sq, Tensor()});
        }
        adamw_step(plain, hp);
        for (const kernels::AdamWTensors& t : separate) t.model_copy.copy_(t.param);
        const Tensor grads_before = fused[2].grad.clone();
        adamw_step(fused, hp, scalar_tensor(factor, {DType::f64}));
        for (size_t i = 0; i < shapes.size(); ++i) {
          CAPTURE(i);
          CHECK(fused[i].param.to_vector<float>() == separate[i].param.to_vector<float>());
          CHECK(fused[i].exp_avg.to_vector<float>() == separate[i].exp_avg.to_vector<float>());
          CHECK(fused[i].exp_avg_sq.to_vector<float>() ==
                separate[i].exp_avg_sq.to_vector<float>());
          CHECK(fused[i].model_copy.to_vector<float>() ==
                separate[i].model_copy.to_vector<float>());
        }
        CHECK(fused[2].grad.to_vector<float>() == grads_before.to_vector<float>());
      }
    }
  }
}

TEST_CASE("a grad_scale that is not finite leaves every tensor unchanged", "[adamw]") {
  AdamWParams hp;
  for (const double bad :
       {std::nan(""), static_cast<double>(INFINITY), -static_cast<double>(INFINITY)}) {
    INFO("grad_scale " << bad);
    const std::vector<kernels::AdamWTensors> ts =
        scaled_operands({{17}, {4, 5}}, 1, DType::bf16, 9);
    const std::vector<kernels::AdamWTensors> before = cloned(ts);
    // A (2) f64 tensor as clip_factor() makes it: the factor is element 0.
    const Tensor factor = zeros({2}, {DType::f64});
    factor.narrow(0, 0, 1).fill_(bad);
    adamw_step(ts, hp, factor.narrow(0, 0, 1));
    for (size_t i = 0; i < ts.size(); ++i) {
      CHECK(ts[i].param.to_vector<float>() == before[i].param.to_vector<float>());
      CHECK(ts[i].exp_avg.to_vector<float>() == before[i].exp_avg.to_vector<float>());
      CHECK(ts[i].exp_avg_sq.to_vector<float>() == before[i].exp_avg_sq.to_vector<float>());
      CHECK(ts[i].model_copy.to_vector<float>() == before[i].model_copy.to_vector<float>());
    }
  }
}

TEST_CASE("adamw_step checks its grad_scale and model copies", "[adamw]") {
  const Tensor z = zeros({3});
  const Tensor c = zeros({3}, {DType::bf16});
  AdamWParams hp;
  REQUIRE_THROWS_WITH(adamw_step({{z, z, z, z, c}, {z, z, z, z, Tensor()}}, hp),
                      Catch::Contains("[adamw_step] expected a model copy for every tensor, "
                                      "found tensor 1 without one"));
  REQUIRE_THROWS_WITH(adamw_step({{z, z, z, z, c}, {z, z, z, z, zeros({3}, {DType::f16})}}, hp),
                      Catch::Contains("[adamw_step] expected tensor 1's model copy a contiguous "
                                      "bf16 tensor of its f32 parameter's shape (3) on cpu"));
  REQUIRE_THROWS_WITH(adamw_step({{z, z, z, z, zeros({4}, {DType::bf16})}}, hp),
                      Catch::Contains("tensor 0's model copy a contiguous bf16 tensor"));
  REQUIRE_THROWS_WITH(
      adamw_step({{z, z, z, z, Tensor()}}, hp, scalar_tensor(1.0, {DType::f32})),
      Catch::Contains("[adamw_step] expected grad_scale one f64 element on cpu with f32 or f64 "
                      "parameters"));
  const Tensor h = zeros({3}, {DType::bf16});
  REQUIRE_THROWS_WITH(adamw_step({{h, h, h, h, Tensor()}}, hp, scalar_tensor(1.0, {DType::f64})),
                      Catch::Contains("with bf16 parameters"));
}

}  // namespace tessera
