// CPU vs CUDA parity of the fused neural-network kernels (softmax, layer_norm,
// cross_entropy, dropout, causal attention) forward and backward in f32, bf16 and f16,
// and run-to-run determinism of their backward. The CPU computes in f64 on the same
// (rounded) values; backward inputs that come from a forward (y, statistics, out) are the
// reference's, rounded to what the device saves, so each check isolates one kernel.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/layer_norm.h"
#include "kernels/softmax.h"
#include "tests/gpu/parity.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::both;
using testing::check_bitwise;
using testing::check_close;
using testing::Input;
using testing::kCuda;
using testing::random;
using testing::random_in;
using testing::tol_for;
using testing::view_of;

// Statistics saved for backward are f32 for 16-bit inputs, else the input's dtype.
DType stat_dtype(DType dtype) {
  return dtype == DType::f16 || dtype == DType::bf16 ? DType::f32 : dtype;
}

const std::vector<DType> kHalfAndSingle = {DType::f32, DType::bf16, DType::f16};

// Statistics of 16-bit inputs are f32 computed from exact values: f32 round-off and a
// little more, as the device may sum in another order.
double stat_tol(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-4; }

TEST_CASE("softmax, log_softmax and their backward match the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    Shape shape;
    bool transposed;
    double spread;  // > 0: logits uniform in [-spread, spread), else N(0, 1)
  };
  const Case cases[] = {{"(2, 3, 129)", {2, 3, 129}, false, 0.0},
                        {"(5, 3001), logits in [-20, 20)", {5, 3001}, false, 20.0},
                        {"(2, 40000)", {2, 40000}, false, 0.0},
                        {"non-contiguous (45, 37)", {45, 37}, true, 0.0},
                        {"one column", {7, 1}, false, 0.0},
                        {"no rows", {0, 9}, false, 0.0}};
  for (DType dt : kHalfAndSingle) {
    for (bool log : {false, true}) {
      DYNAMIC_SECTION((log ? "log_softmax " : "softmax ") << dtype_name(dt)) {
        auto forward = log ? kernels::log_softmax : kernels::softmax;
        auto backward = log ? kernels::log_softmax_backward : kernels::softmax_backward;
        const double tol = tol_for(dt, 1e-5);
        for (const Case& c : cases) {
          INFO(c.name);
          const Input x = random_in(c.shape, 30, dt, c.transposed, -c.spread, c.spread);
          const Tensor want = forward(x.ref);
          check_close(forward(x.dev), want, dt, tol);
          const Input y = both(want, dt);
          const Input dy = random_in(c.shape, 31, dt, c.transposed);
          check_close(backward(dy.dev, y.dev), backward(dy.ref, y.ref), dt, tol);
        }
      }
    }
  }
}

TEST_CASE("layer_norm and its backward match the CPU, with and without affine", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    Shape shape;
    bool transposed;
    double lo, hi;  // lo < hi: x uniform in [lo, hi), else N(0, 1)
  };
  // The shifted rows (mean 11, variance 1/12) catch a one-pass E[x^2] - E[x]^2 variance.
  // Rows of whole 16-byte packs take the warp-per-row backward (Note [Warp-per-row layer
  // norm backward] in kernels/cuda/layer_norm_backward.cu): (64, 768) and (16, 256) with one row
  // group, (4099, 768) with 64 groups and a short last one, (130, 1600) with 7 packs per
  // lane in 16 bits (f32 has 400 packs there: the block-per-row kernel), as (3, 5, 37)
  // and (2, 4100).
  const Case cases[] = {{"(3, 5, 37)", {3, 5, 37}, false, 0.0, 0.0},
                        {"(64, 768)", {64, 768}, false, 0.0, 0.0},
                        {"(4099, 768)", {4099, 768}, false, 0.0, 0.0},
                        {"(130, 1600)", {130, 1600}, false, 0.0, 0.0},
                        {"(2, 4100)", {2, 4100}, false, 0.0, 0.0},
                        {"non-contiguous (45, 37)", {45, 37}, true, 0.0, 0.0},
                        {"(16, 256), mean 11", {16, 256}, false, 10.0, 12.0}};
  for (DType dt : kHalfAndSingle) {
    for (bool affine : {true, false}) {
      DYNAMIC_SECTION(dtype_name(dt) << (affine ? " affine" : " no affine")) {
        const double tol = tol_for(dt, 1e-5);
        const DType sd = stat_dtype(dt);
        for (const Case& c : cases) {
          INFO(c.name);
          const int64_t C = c.shape.back();
          const Input x = random_in(c.shape, 40, dt, c.transposed, c.lo, c.hi);  // (..., C)
          const Input w = random({C}, 41, dt);                                   // (C)
          const Input b = random({C}, 42, dt);                                   // (C)
          const Tensor w_ref = affine ? w.ref : Tensor(), w_dev = affine ? w.dev : Tensor();
          const kernels::LayerNormOutput want =
              kernels::layer_norm(x.ref, w_ref, affine ? b.ref : Tensor(), 1e-5);
          const kernels::LayerNormOutput got =
              kernels::layer_norm(x.dev, w_dev, affine ? b.dev : Tensor(), 1e-5);
          check_close(got.y, want.y, dt, tol);
          check_close(got.mean, want.mean, sd, stat_tol(dt));
          check_close(got.rstd, want.rstd, sd, stat_tol(dt));

          const Input dy = random_in(c.shape, 43, dt, c.transposed);  // (..., C)
          const Input mean = both(want.mean, sd), rstd = both(want.rstd, sd);
          const kernels::LayerNormGrads wg =
              kernels::layer_norm_backward(dy.ref, x.ref, w_ref, mean.ref, rstd.ref);
          const kernels::LayerNormGrads gg =
              kernels::layer_norm_backward(dy.dev, x.dev, w_dev, mean.dev, rstd.dev);
          check_close(gg.dx, wg.dx, dt, tol);
          if (affine) {
            check_close(gg.dweight, wg.dweight, dt, tol);
            check_close(gg.dbias, wg.dbias, dt, tol);
          } else {
            CHECK_FALSE(gg.dweight.defined());
            CHECK_FALSE(gg.dbias.defined());
          }
        }
      }
    }
  }
}

// The residual add fused with the norm (Note [Residual layer norm] in
// kernels/cuda/layer_norm.cu): h, the norm and the gradients with dh added, against the f64
// CPU reference; (64, 768) and (130, 1600) in 16 bits add dh in the warp-per-row kernel,
// (3, 5, 37) and f32's (130, 1600) after the block-per-row one.
TEST_CASE("add_layer_norm and its backward match the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Shape shapes[] = {{64, 768}, {130, 1600}, {3, 5, 37}};
  for (DType dt : kHalfAndSingle) {
    for (bool affine : {true, false}) {
      DYNAMIC_SECTION(dtype_name(dt) << (affine ? " affine" : " no affine")) {
        const double tol = tol_for(dt, 1e-5);
        const DType sd = stat_dtype(dt);
        for (const Shape& shape : shapes) {
          INFO(shape_str(shape));
          const int64_t C = shape.back();
          const Input x = random(shape, 50, dt), delta = random(shape, 51, dt);
          const Input w = random({C}, 52, dt), b = random({C}, 53, dt);
          const Tensor w_ref = affine ? w.ref : Tensor(), w_dev = affine ? w.dev : Tensor();
          const Tensor b_ref = affine ? b.ref : Tensor(), b_dev = affine ? b.dev : Tensor();
          // The device normalizes h rounded to its dtype, as the separate add would: so does
          // the reference.
          const Input h = both(kernels::binary(kernels::BinaryOp::add, x.ref, delta.ref), dt);
          const kernels::LayerNormOutput want = kernels::layer_norm(h.ref, w_ref, b_ref, 1e-5);
          const kernels::AddLayerNormOutput got =
              kernels::add_layer_norm(x.dev, delta.dev, w_dev, b_dev, 1e-5);
          check_close(got.h, h.ref, dt, tol);
          check_close(got.norm.y, want.y, dt, tol);
          check_close(got.norm.mean, want.mean, sd, stat_tol(dt));
          check_close(got.norm.rstd, want.rstd, sd, stat_tol(dt));
          const Input dy = random(shape, 54, dt), dh = random(shape, 55, dt);
          const Input mean = both(want.mean, sd), rstd = both(want.rstd, sd);
          const kernels::LayerNormGrads wg =
              kernels::add_layer_norm_backward(dy.ref, dh.ref, h.ref, w_ref, mean.ref, rstd.ref);
          const kernels::LayerNormGrads gg =
              kernels::add_layer_norm_backward(dy.dev, dh.dev, h.dev, w_dev, mean.dev, rstd.dev);
          check_close(gg.dx, wg.dx, dt, tol);
          if (affine) {
            check_close(gg.dweight, wg.dweight, dt, tol);
            check_close(gg.dbias, wg.dbias, dt, tol);
          }
        }
      }
    }
  }
}

// Rows of a (N, V) device tensor whose target is `ignore_index` hold exact zeros.
void check_ignored_rows_zero(const Tensor& dlogits, const std::vector<int64_t>& targets,
                             int64_t ignore_index) {
  const std::vector<double> d = dlogits.to_vector<double>();
  const int64_t V = dlogits.size(1);
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] != ignore_index) continue;
    for (int64_t j = 0; j < V; ++j) {
      if (d[r * V + j] != 0.0) {
        INFO("ignored row " << r << " column " << j << " holds " << d[r * V + j]);
        CHECK(d[r * V + j] == 0.0);
        return;
      }
    }
  }
}

TEST_CASE("cross_entropy and its backward match the CPU, ignored rows included", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    int64_t rows, vocab, pad;  // logits are the first `vocab` columns of (rows, vocab + pad)
    DType target_dtype;
    int64_t ignore_index;
    bool all_ignored;
  };
  const Case cases[] = {{"V 11", 37, 11, 0, DType::i64, -100, false},
                        {"V 3001, padded rows", 37, 3001, 13, DType::i64, -100, false},
                        {"V 50257, i32 targets", 8, 50257, 0, DType::i32, -100, false},
                        {"ignore_index 5", 37, 11, 0, DType::i64, 5, false},
                        {"every row ignored", 6, 11, 0, DType::i64, -100, true}};
  for (DType dt : kHalfAndSingle) {
    for (const Case& c : cases) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        const DType sd = stat_dtype(dt);
        Generator g(50);
        std::vector<int64_t> targets =
            rand({c.rows}, g, {DType::f32}, 0.0, static_cast<double>(c.vocab))
                .to(DType::i64)
                .to_vector<int64_t>();
        for (int64_t r : {3, 4, 20}) {
          if (r < c.rows) targets[r] = c.ignore_index;
        }
        if (c.all_ignored) targets.assign(targets.size(), c.ignore_index);
        const Tensor t_host = from_vector(targets).to(c.target_dtype);  // (N)
        const Tensor t_dev = t_host.to(kCuda);
        const Input logits = view_of(random({c.rows, c.vocab + c.pad}, 51, dt),
                                     [&](const Tensor& t) { return t.narrow(1, 0, c.vocab); });
        const kernels::CrossEntropyOutput want =
            kernels::cross_entropy(logits.ref, t_host, c.ignore_index);
        const kernels::CrossEntropyOutput got =
            kernels::cross_entropy(logits.dev, t_dev, c.ignore_index);
        check_close(got.loss, want.loss, sd, stat_tol(dt));
        check_close(got.lse, want.lse, sd, stat_tol(dt));
        if (c.all_ignored) CHECK(got.loss.item<double>() == 0.0);

        const Input dloss = both(scalar_tensor(0.7), sd);
        const Input lse = both(want.lse, sd);
        const Tensor dlogits =
            kernels::cross_entropy_backward(dloss.dev, logits.dev, t_dev, lse.dev, c.ignore_index);
        check_close(
            dlogits,
            kernels::cross_entropy_backward(dloss.ref, logits.ref, t_host, lse.ref, c.ignore_index),
            dt, tol_for(dt, 1e-5));
        check_ignored_rows_zero(dlogits, targets, c.ignore_index);
        if (c.pad > 0) {
          // The padded (N, V + pad) gradient, written directly with zeros in the padding.
          const int64_t cols = c.vocab + c.pad;
          const Tensor padded = kernels::cross_entropy_backward(dloss.dev, logits.dev, t_dev,
                                                                lse.dev, c.ignore_index, cols);
          REQUIRE(padded.shape() == Shape{c.rows, cols});
          check_bitwise(padded.narrow(1, 0, c.vocab).contiguous(), dlogits);
          CHECK(padded.narrow(1, c.vocab, c.pad).contiguous().to_vector<double>() ==
                std::vector<double>(static_cast<size_t>(c.rows * c.pad), 0.0));
        }
      }
    }
  }
}

TEST_CASE("a bad cross_entropy target fails the next device read with the CPU's message", "[gpu]") {
  const Input logits = random({4, 7}, 52, DType::f32);
  const Tensor bad = from_vector<int64_t>({1, 7, 2, -3});  // rows 1 and 3 are bad; 1 is first
  const Tensor good = from_vector<int64_t>({1, 6, 2, 0});
  const std::string forward_error =
      testing::error_of([&] { kernels::cross_entropy(logits.ref, bad, -100); });
  CHECK_THAT(forward_error, Catch::Contains("found 7 at row 1"));
  // The call queues its kernels and returns; the loss read reports the target.
  const kernels::CrossEntropyOutput out = kernels::cross_entropy(logits.dev, bad.to(kCuda), -100);
  CHECK_THROWS_WITH(out.loss.item<double>(), forward_error);
  const Tensor dloss = scalar_tensor(1.0).to(kCuda);
  const Tensor dlogits =
      kernels::cross_entropy_backward(dloss, logits.dev, bad.to(kCuda), out.lse, -100);
  CHECK_THROWS_WITH(cuda::synchronize(0), Catch::Contains("[cross_entropy_backward] expected "
                                                          "targets in [0, 7) or ignore_index "
                                                          "-100, found 7 at row 1"));
  // Nothing is left pending, and the device computes on.
  cuda::synchronize(0);
  const kernels::CrossEntropyOutput fine = kernels::cross_entropy(logits.dev, good.to(kCuda));
  CHECK(fine.loss.item<double>() ==
        Approx(kernels::cross_entropy(logits.ref, good).loss.item<double>()).epsilon(1e-5));
}

// Which elements are exactly 0 (dropped, for inputs without zeros).
std::vector<bool> zeros_of(const Tensor& t) {
  std::vector<bool> z;
  for (double v : t.to_vector<double>()) z.push_back(v == 0.0);
  return z;
}

TEST_CASE("dropout and its backward keep the CPU's mask bit for bit", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Stream {
    double p;
    uint64_t seed, offset;
  };
  // The second stream's counters cross 2^32, where the carry reaches the second word.
  const Stream streams[] = {
      {0.3, 1234, 17}, {0.5, 0x0123456789ABCDEFull, 0xFFFFFFF0ull}, {0.9, 7, 0}};
  struct Layout {
    Shape shape;
    bool transposed;
  };
  const Layout layouts[] = {{{37, 129}, false}, {{37, 129}, true}, {{3, 1000, 7}, false}};
  for (DType dt : kHalfAndSingle) {
    DYNAMIC_SECTION("dropout " << dtype_name(dt)) {
      for (const Layout& l : layouts) {
        for (const Stream& s : streams) {
          INFO(shape_str(l.shape) << (l.transposed ? " non-contiguous" : "") << ", p " << s.p
                                  << ", seed " << s.seed << ", offset " << s.offset);
          // Inputs in [0.5, 1.5): a zero output marks a dropped element. The CPU mask does
          // not depend on the dtype, so the f64 reference holds the CPU's mask.
          const Input x = random_in(l.shape, 60, dt, l.transposed, 0.5, 1.5);
          const Tensor want = kernels::dropout(x.ref, s.p, s.seed, s.offset);
          const Tensor got = kernels::dropout(x.dev, s.p, s.seed, s.offset);
          check_close(got, want, dt, tol_for(dt, 1e-6));
          CHECK(zeros_of(got) == zeros_of(want));
          const Input dy = random_in(l.shape, 61, dt, l.transposed, 0.5, 1.5);
          const Tensor dx = kernels::dropout_backward(dy.dev, s.p, s.seed, s.offset);
          check_close(dx, kernels::dropout_backward(dy.ref, s.p, s.seed, s.offset), dt,
                      tol_for(dt, 1e-6));
          CHECK(zeros_of(dx) == zeros_of(want));
        }
      }
    }
  }
}

struct AttentionCase {
  const char* name;
  int64_t B, H, T, D;
  bool bthd;  // q, k, v are (B, T, H, D) tensors viewed as (B, H, T, D): non-contiguous
};

// Random (B, H, T, D) operands on both sides.
Input attention_input(const AttentionCase& c, uint64_t seed, DType dt) {
  if (!c.bthd) return random({c.B, c.H, c.T, c.D}, seed, dt);
  return view_of(random({c.B, c.T, c.H, c.D}, seed, dt),
                 [](const Tensor& t) { return t.transpose(1, 2); });
}

// The device kernel may run q k^T and p v on TF32 (f32) or 16-bit tensor cores with 16-bit
// probabilities, so f32 is held to 5e-3 of the f64 reference, as matmul is.
TEST_CASE("causal_attention and its backward match an f64 CPU reference", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const AttentionCase cases[] = {{"T 100, D 64", 2, 3, 100, 64, false},
                                 {"T 77, D 32", 1, 2, 77, 32, false},
                                 {"T 200, D 64, (B, T, H, D) layout", 1, 2, 200, 64, true},
                                 {"T 1, D 32", 2, 1, 1, 32, false}};
  for (DType dt : kHalfAndSingle) {
    for (const AttentionCase& c : cases) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        const double tol = tol_for(dt, 5e-3);
        const DType sd = stat_dtype(dt);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
        const Input q = attention_input(c, 70, dt), k = attention_input(c, 71, dt),
                    v = attention_input(c, 72, dt);
        const kernels::AttentionOutput want = kernels::causal_attention(q.ref, k.ref, v.ref, scale);
        const kernels::AttentionOutput got = kernels::causal_attention(q.dev, k.dev, v.dev, scale);
        check_close(got.out, want.out, dt, tol);
        check_close(got.lse, want.lse, sd, 5e-3);

        const Input dout = attention_input(c, 73, dt);
        const Input out = both(want.out, dt), lse = both(want.lse, sd);
        const kernels::AttentionGrads wg = kernels::causal_attention_backward(
            dout.ref, q.ref, k.ref, v.ref, out.ref, lse.ref, scale);
        const kernels::AttentionGrads gg = kernels::causal_attention_backward(
            dout.dev, q.dev, k.dev, v.dev, out.dev, lse.dev, scale);
        // With T = 1 the softmax has one entry and dq = dk = 0 exactly: the device's
        // dP - rowsum(dO o O) cancels terms of size ~sqrt(D) (unit normals) in f32 and
        // leaves their rounding, ~1e-7 x sqrt(D) x scale (seen on an H200: 6e-8).
        const double cancel = 1e-6 * std::sqrt(static_cast<double>(c.D)) * scale;
        check_close(gg.dq, wg.dq, dt, tol, cancel);
        check_close(gg.dk, wg.dk, dt, tol, cancel);
        check_close(gg.dv, wg.dv, dt, tol);
      }
    }
  }
}

TEST_CASE("layer_norm, cross_entropy and attention give bitwise equal results run to run",
          "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::bf16}) {
    DYNAMIC_SECTION("determinism " << dtype_name(dt)) {
      {
        INFO("layer_norm_backward (256, 768)");
        const Input x = random({256, 768}, 80, dt), w = random({768}, 81, dt),
                    b = random({768}, 82, dt), dy = random({256, 768}, 83, dt);
        const kernels::LayerNormOutput f = kernels::layer_norm(x.dev, w.dev, b.dev, 1e-5);
        const kernels::LayerNormGrads g1 =
            kernels::layer_norm_backward(dy.dev, x.dev, w.dev, f.mean, f.rstd);
        const kernels::LayerNormGrads g2 =
            kernels::layer_norm_backward(dy.dev, x.dev, w.dev, f.mean, f.rstd);
        check_bitwise(g1.dx, g2.dx);
        check_bitwise(g1.dweight, g2.dweight);
        check_bitwise(g1.dbias, g2.dbias);
      }
      {
        INFO("cross_entropy (512, 5000)");
        Generator g(84);
        const Tensor targets =
            rand({512}, g, {DType::f32}, 0.0, 5000.0).to(DType::i64).to(kCuda);  // (512)
        const Input logits = random({512, 5000}, 85, dt);
        const kernels::CrossEntropyOutput f1 = kernels::cross_entropy(logits.dev, targets);
        const kernels::CrossEntropyOutput f2 = kernels::cross_entropy(logits.dev, targets);
        check_bitwise(f1.loss, f2.loss);
        check_bitwise(f1.lse, f2.lse);
        const Tensor dloss = full({}, 1.0, {f1.loss.dtype(), kCuda});
        check_bitwise(kernels::cross_entropy_backward(dloss, logits.dev, targets, f1.lse),
                      kernels::cross_entropy_backward(dloss, logits.dev, targets, f1.lse));
      }
      {
        INFO("causal_attention (2, 4, 257, 64)");
        const AttentionCase c{"", 2, 4, 257, 64, false};
        const Input q = attention_input(c, 86, dt), k = attention_input(c, 87, dt),
                    v = attention_input(c, 88, dt), dout = attention_input(c, 89, dt);
        const kernels::AttentionOutput f1 = kernels::causal_attention(q.dev, k.dev, v.dev, 0.125);
        const kernels::AttentionOutput f2 = kernels::causal_attention(q.dev, k.dev, v.dev, 0.125);
        check_bitwise(f1.out, f2.out);
        check_bitwise(f1.lse, f2.lse);
        const kernels::AttentionGrads g1 = kernels::causal_attention_backward(
            dout.dev, q.dev, k.dev, v.dev, f1.out, f1.lse, 0.125);
        const kernels::AttentionGrads g2 = kernels::causal_attention_backward(
            dout.dev, q.dev, k.dev, v.dev, f1.out, f1.lse, 0.125);
        check_bitwise(g1.dq, g2.dq);
        check_bitwise(g1.dk, g2.dk);
        check_bitwise(g1.dv, g2.dv);
      }
    }
  }
}

}  // namespace
}  // namespace tessera
