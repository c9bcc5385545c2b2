// CPU vs CUDA parity of the elementwise, reduction and matmul kernels in f32, f64, bf16 and
// f16 on broadcast, non-contiguous and empty operands. The CPU computes in f64 on the same
// (rounded) values, so each bound measures the device kernel's own error.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/blas1.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/reduce.h"
#include "tests/gpu/parity.h"

namespace tessera {
namespace {

using kernels::BinaryOp;
using kernels::CompareOp;
using kernels::UnaryOp;

using testing::both;
using testing::check_close;
using testing::Input;
using testing::kCuda;
using testing::random;
using testing::random_in;
using testing::random_t;
using testing::tol_for;
using testing::view_of;

const std::vector<DType> kFloating = {DType::f32, DType::f64, DType::bf16, DType::f16};

constexpr UnaryOp kUnaryOps[] = {UnaryOp::neg,  UnaryOp::exp,   UnaryOp::log,
                                 UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::tanh,
                                 UnaryOp::relu, UnaryOp::gelu,  UnaryOp::sigmoid};
constexpr BinaryOp kBinaryOps[] = {BinaryOp::add,    BinaryOp::sub, BinaryOp::mul,
                                   BinaryOp::div,    BinaryOp::pow, BinaryOp::maximum,
                                   BinaryOp::minimum};
constexpr CompareOp kCompareOps[] = {CompareOp::eq, CompareOp::ne, CompareOp::lt,
                                     CompareOp::le, CompareOp::gt, CompareOp::ge};

Shape concat(Shape a, const Shape& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_CASE("unary kernels and their backward match the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : kFloating) {
    for (UnaryOp op : kUnaryOps) {
      DYNAMIC_SECTION(kernels::unary_name(op) << " " << dtype_name(dt)) {
        const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt;
        const double lo = positive ? 0.5 : 0.0, hi = positive ? 2.0 : 0.0;
        const double tol = tol_for(dt, 1e-5);
        for (bool transposed : {false, true}) {
          INFO((transposed ? "non-contiguous" : "contiguous"));
          const Input x = random_in({37, 129}, 1, dt, transposed, lo, hi);  // (37, 129)
          const Tensor want = kernels::unary(op, x.ref);
          check_close(kernels::unary(op, x.dev), want, dt, tol);
          // The backward reads the rounded forward output, the same on both sides.
          const Input y = both(want, dt);                           // (37, 129)
          const Input g = random_in({37, 129}, 2, dt, transposed);  // (37, 129)
          check_close(kernels::unary_backward(op, g.dev, x.dev, y.dev),
                      kernels::unary_backward(op, g.ref, x.ref, y.ref), dt, tol);
        }
        const Input e = random({0, 5}, 3, dt, lo, hi);  // (0, 5)
        check_close(kernels::unary(op, e.dev), kernels::unary(op, e.ref), dt, tol);
      }
    }
  }
}

TEST_CASE("binary kernels match the CPU with broadcasting and strides", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Shapes {
    const char* name;
    Shape a, b;
    bool a_transposed;
  };
  const Shapes shapes[] = {{"same shape", {37, 129}, {37, 129}, false},
                           {"(3, 1, 45) x (7, 1)", {3, 1, 45}, {7, 1}, false},
                           {"non-contiguous a x (29)", {37, 29}, {29}, true},
                           {"0-dim b", {37, 29}, {}, false},
                           {"empty", {0, 29}, {29}, false}};
  for (DType dt : kFloating) {
    for (BinaryOp op : kBinaryOps) {
      DYNAMIC_SECTION(kernels::binary_name(op) << " " << dtype_name(dt)) {
        // pow takes a positive base, div a denominator away from 0.
        const bool pow = op == BinaryOp::pow, div = op == BinaryOp::div;
        for (const Shapes& s : shapes) {
          INFO(s.name);
          const Input a = random_in(s.a, 4, dt, s.a_transposed, pow ? 0.5 : 0.0, pow ? 2.0 : 0.0);
          const Input b = random(s.b, 5, dt, div ? 0.5 : 0.0, div ? 1.5 : 0.0);
          check_close(kernels::binary(op, a.dev, b.dev), kernels::binary(op, a.ref, b.ref), dt,
                      tol_for(dt, 1e-5));
        }
      }
    }
  }
}

TEST_CASE("compare kernels match the CPU, ties included", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    for (CompareOp op : kCompareOps) {
      DYNAMIC_SECTION(kernels::compare_name(op) << " " << dtype_name(dt)) {
        // b repeats a in its first 15 columns, so eq, le and ge see ties.
        const Input a = random({37, 45}, 6, dt);  // (37, 45)
        Input b = random({37, 45}, 7, dt);        // (37, 45)
        b.ref.narrow(1, 0, 15).copy_(a.ref.narrow(1, 0, 15));
        b = both(b.ref, dt);
        check_close(kernels::compare(op, a.dev, b.dev), kernels::compare(op, a.ref, b.ref),
                    DType::boolean, 0.0);
        const Input c = random({3, 1, 45}, 8, dt);  // (3, 1, 45)
        const Input d = random({7, 1}, 9, dt);      // (7, 1)
        check_close(kernels::compare(op, c.dev, d.dev), kernels::compare(op, c.ref, d.ref),
                    DType::boolean, 0.0);
        const Input t = random_t({37, 29}, 10, dt);  // (37, 29) non-contiguous
        const Input r = random({29}, 11, dt);        // (29)
        check_close(kernels::compare(op, t.dev, r.dev), kernels::compare(op, t.ref, r.ref),
                    DType::boolean, 0.0);
      }
    }
  }
}

TEST_CASE("where matches the CPU with three-way broadcasting", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    DYNAMIC_SECTION("where " << dtype_name(dt)) {
      Generator g(12);
      const Tensor cond = kernels::compare(CompareOp::gt, randn({3, 1, 45}, g),
                                           scalar_tensor(0.0));  // (3, 1, 45) bool
      const Input a = random({7, 1}, 13, dt);                    // (7, 1)
      const Input b = random_t({3, 7, 45}, 14, dt);              // (3, 7, 45) non-contiguous
      check_close(kernels::where(cond.to(kCuda), a.dev, b.dev), kernels::where(cond, a.ref, b.ref),
                  dt, 0.0);
    }
  }
}

TEST_CASE("sum and var match the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    Shape shape;
    bool transposed;
    std::vector<int64_t> dims;
    bool keepdim;
  };
  const Case cases[] = {
      {"dim 1", {6, 37, 129}, false, {1}, false},
      {"dims {0, 2} keepdim", {6, 37, 129}, false, {0, 2}, true},
      {"all dims", {6, 37, 129}, false, {}, false},
      {"last dim, non-contiguous", {6, 129, 37}, true, {-1}, false},
      {"first dim, non-contiguous, keepdim", {6, 129, 37}, true, {0}, true},
      {"long rows", {3, 20000}, false, {-1}, false},
      {"a size-1 dim", {5, 1}, false, {1}, false},
      {"an empty dim", {0, 5}, false, {0}, false},
  };
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      DYNAMIC_SECTION(c.name << " " << dtype_name(dt)) {
        const Input x = random_in(c.shape, 15, dt, c.transposed);
        const double tol = tol_for(dt, 1e-5);
        check_close(kernels::sum(x.dev, c.dims, c.keepdim), kernels::sum(x.ref, c.dims, c.keepdim),
                    dt, tol);
        // A non-positive divisor gives inf or NaN on both sides (size-1 and empty dims).
        for (int64_t correction : {0, 1}) {
          INFO("correction " << correction);
          check_close(kernels::var(x.dev, c.dims, correction, c.keepdim),
                      kernels::var(x.ref, c.dims, correction, c.keepdim), dt, tol);
        }
      }
    }
  }
}

TEST_CASE("max matches the CPU: the first index on ties, NaN propagates", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    DYNAMIC_SECTION("max " << dtype_name(dt)) {
      // Integers in [0, 5) tie often; column 10 of batch 2 holds NaN at rows 5 and 30.
      Generator g(16);
      Tensor host = rand({6, 37, 45}, g, {DType::f32}, 0.0, 5.0).to(DType::i64).to(DType::f32);
      host.select(0, 2).select(1, 10).narrow(0, 5, 1).fill_(std::nan(""));
      host.select(0, 2).select(1, 10).narrow(0, 30, 1).fill_(std::nan(""));
      const Input x = both(host, dt);  // (6, 37, 45)
      const Input xt = view_of(x, [](const Tensor& t) { return t.transpose(-1, -2); });
      const Input row = random({3, 20000}, 17, dt);  // (3, 20000)
      for (const Input* in : {&x, &xt, &row}) {
        for (int64_t dim : {0, 1, -1}) {
          for (bool keepdim : {false, true}) {
            INFO("shape " << shape_str(in->dev.shape()) << ", dim " << dim << ", keepdim "
                          << keepdim << (in->dev.is_contiguous() ? "" : ", non-contiguous"));
            const kernels::MaxResult got = kernels::max(in->dev, dim, keepdim);
            const kernels::MaxResult want = kernels::max(in->ref, dim, keepdim);
            check_close(got.values, want.values, dt, 0.0);
            check_close(got.indices, want.indices, DType::i64, 0.0);
          }
        }
      }
    }
  }
}

// f32 runs on TF32 tensor cores (10-bit mantissa inputs), so it is held to 5e-3 of the f64
// reference rather than to f32 round-off; f16/bf16 products are exact in the f32
// accumulator and f64 runs in double.
TEST_CASE("matmul matches an f64 CPU reference for every transpose and batch layout", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const int64_t M = 67, K = 131, N = 45;
  const Shape batch{2, 3};
  for (DType dt : kFloating) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        DYNAMIC_SECTION(dtype_name(dt) << " trans_a " << ta << " trans_b " << tb) {
          const double tol = tol_for(dt, 5e-3);
          auto a_shape = [&](int64_t m, int64_t k) { return ta ? Shape{k, m} : Shape{m, k}; };
          auto b_shape = [&](int64_t k, int64_t n) { return tb ? Shape{n, k} : Shape{k, n}; };
          for (bool batched_b : {false, true}) {
            for (bool strided : {false, true}) {
              INFO("b " << (batched_b ? "batched" : "shared") << ", operands "
                        << (strided ? "non-contiguous" : "contiguous"));
              const Input a = random_in(concat(batch, a_shape(M, K)), 20, dt, strided);
              const Input b =
                  random_in(concat(batched_b ? batch : Shape{}, b_shape(K, N)), 21, dt, strided);
              check_close(kernels::matmul(a.dev, b.dev, ta, tb),
                          kernels::matmul(a.ref, b.ref, ta, tb), dt, tol);
            }
          }
          // 2-D operands: plain, one row, a long K, an empty K (zeros) and an empty M.
          const int64_t dims[][3] = {{M, K, N}, {1, K, N}, {M, 1000, N}, {M, 0, N}, {0, K, N}};
          for (const auto& d : dims) {
            INFO("M " << d[0] << ", K " << d[1] << ", N " << d[2]);
            const Input a = random(a_shape(d[0], d[1]), 22, dt);
            const Input b = random(b_shape(d[1], d[2]), 23, dt);
            check_close(kernels::matmul(a.dev, b.dev, ta, tb),
                        kernels::matmul(a.ref, b.ref, ta, tb), dt, tol);
          }
        }
      }
    }
  }
}

// linear's bias epilogue, with operands at every alignment: views at element offsets of a
// flat buffer (as ZeRO's parameters are) must work, and a bias that is not 16-byte aligned
// takes the separate add (Note [cuBLASLt alignment] in kernels/cuda/matmul.cu).
TEST_CASE("linear (bias in the GEMM epilogue) matches the CPU at any operand alignment", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const int64_t B = 3, T = 37, K = 48, N = 40;
  for (DType dt : kFloating) {
    for (int64_t offset : {0, 1, 2, 3, 4}) {
      DYNAMIC_SECTION(dtype_name(dt) << " offset " << offset) {
        const double tol = tol_for(dt, 5e-3);
        // Weight and bias as views of one flat buffer, at `offset` elements.
        const Input flat = random({offset + N * K + offset + N}, 30, dt);
        const Input w = view_of(flat, [&](const Tensor& f) {
          return f.narrow(0, offset, N * K).view({N, K});
        });
        const Input bias =
            view_of(flat, [&](const Tensor& f) { return f.narrow(0, offset + N * K + offset, N); });
        const Input x = random({B, T, K}, 31, dt);
        check_close(kernels::linear(x.dev, w.dev, bias.dev),
                    kernels::linear(x.ref, w.ref, bias.ref), dt, tol);
        check_close(kernels::linear(x.dev, w.dev, Tensor()),
                    kernels::linear(x.ref, w.ref, Tensor()), dt, tol);
        // A transposed (non-contiguous) input runs as a batched GEMM with the bias broadcast.
        const Input xt = random_t({B, T, K}, 32, dt);
        check_close(kernels::linear(xt.dev, w.dev, bias.dev),
                    kernels::linear(xt.ref, w.ref, bias.ref), dt, tol);
      }
    }
  }
}

// 16-bit operands take cuBLASLt's BGRADB epilogue (Note [Bias gradient epilogue] in
// kernels/cuda/matmul.cu), f32 a matmul and a sum; a g at an odd offset as well; the same
// added into an existing gradient (kernels::add_linear_param_grads).
TEST_CASE("a linear layer's weight and bias gradients match an f64 CPU reference", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : kFloating) {
    for (int64_t offset : {0, 1}) {
      for (const auto& [rows, n, k] : {std::array<int64_t, 3>{300, 64, 96}, {4096, 2304, 768}}) {
        DYNAMIC_SECTION(dtype_name(dt)
                        << " R " << rows << " N " << n << " K " << k << " offset " << offset) {
          const Input flat = random({offset + rows * n}, 33, dt);
          const Input g = view_of(flat, [&](const Tensor& f) {
            return f.narrow(0, offset, rows * n).view({rows, n});
          });
          const Input x = random({rows, k}, 34, dt);
          const kernels::LinearParamGrads got = kernels::linear_param_grads(g.dev, x.dev);
          const kernels::LinearParamGrads want = kernels::linear_param_grads(g.ref, x.ref);
          check_close(got.dweight, want.dweight, dt, tol_for(dt, 5e-3));
          check_close(got.dbias, want.dbias, dt, tol_for(dt, 1e-5));
          // Added into an existing gradient with beta = 1 (Note [Gradients accumulated into
          // leaves] in autograd/grad_slot.h), with and without the bias's sums.
          for (bool with_bias : {true, false}) {
            INFO((with_bias ? "added, with the bias" : "added, without the bias"));
            // At the g's offset: a misaligned buffer view takes the fallback.
            const Input acc_flat = random({offset + n * k}, 38, dt);
            const Input acc = view_of(acc_flat, [&](const Tensor& f) {
              return f.narrow(0, offset, n * k).view({n, k});
            });
            const Tensor acc_want = acc.ref.clone();
            kernels::axpy_(acc_want, want.dweight);
            const Tensor dbias = kernels::add_linear_param_grads(g.dev, x.dev, acc.dev, with_bias);
            check_close(acc.dev, acc_want, dt, tol_for(dt, 5e-3));
            CHECK(dbias.defined() == with_bias);
            if (with_bias) check_close(dbias, want.dbias, dt, tol_for(dt, 1e-5));
          }
        }
      }
    }
  }
}

// 16-bit operands take cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD epilogues where the
// features are a multiple of 8 (Note [GELU epilogues] in kernels/cuda/matmul.cu); N = 100
// and f32 the separate kernels.
TEST_CASE("a linear layer with GELU and GELU's input gradient match an f64 CPU reference",
          "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : kFloating) {
    for (const auto& [rows, n, k] :
         {std::array<int64_t, 3>{300, 64, 96}, {1024, 3072, 768}, {77, 100, 48}}) {
      for (bool with_bias : {true, false}) {
        DYNAMIC_SECTION(dtype_name(dt) << " R " << rows << " N " << n << " K " << k
                                       << (with_bias ? " with bias" : " without bias")) {
          const double tol = tol_for(dt, 5e-3);
          const Input x = random({rows, k}, 35, dt);
          const Input w = random({n, k}, 36, dt);
          const Input b = random({n}, 37, dt);
          const kernels::LinearGelu got =
              kernels::linear_gelu(x.dev, w.dev, with_bias ? b.dev : Tensor());
          const kernels::LinearGelu want =
              kernels::linear_gelu(x.ref, w.ref, with_bias ? b.ref : Tensor());
          check_close(got.pre, want.pre, dt, tol);
          check_close(got.y, want.y, dt, tol);
          // c_proj's side: g (R, K') through a weight (K', N) into GELU's input (R, N).
          const Input g = random({rows, k}, 38, dt);
          const Input w2 = random({k, n}, 39, dt);
          const Input pre = random({rows, n}, 40, dt);
          const kernels::GeluInputGrads dg = kernels::gelu_input_grads(g.dev, w2.dev, pre.dev);
          const kernels::GeluInputGrads dw = kernels::gelu_input_grads(g.ref, w2.ref, pre.ref);
          check_close(dg.dpre, dw.dpre, dt, tol);
          check_close(dg.dbias, dw.dbias, dt, tol);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tessera
