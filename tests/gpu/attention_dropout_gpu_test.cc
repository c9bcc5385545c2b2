// Attention-probability dropout on CUDA (Note [Attention-probability dropout] in
// kernels/attention.h): the device mask of cuDNN's graphs against the CPU dropout's, Tessera's
// flash kernels and cuDNN's fused attention with dropout against the CPU attention with the
// same (p, seed, offset), forward and backward, and the dropped probabilities exactly where
// dropout of ones has its zeros.
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/attention.h"
#include "kernels/cuda/kernels.h"
#include "kernels/dropout.h"
#include "tests/gpu/parity.h"

namespace tessera {
namespace {

using testing::check_close;
using testing::Input;
using testing::kCuda;
using testing::random;
using testing::tol_for;
using testing::view_of;

struct Case {
  int64_t B, H, T, D;
};

// Which entries of a (B, H, T, T) dropout of ones are zero.
std::vector<bool> dropped(const Case& c, const kernels::AttentionDropout& d) {
  const Tensor ones = full({c.B, c.H, c.T, c.T}, 1.0, {DType::f64});
  std::vector<bool> zero;
  for (double f : kernels::dropout(ones, d.p, d.seed, d.offset).to_vector<double>()) {
    zero.push_back(f == 0.0);
  }
  return zero;
}

// q, k and v of GPT's layout: part i of a (B, T, 3, H, D) projection seen as (B, H, T, D).
std::vector<Input> fused_qkv(const Case& c, uint64_t seed, DType dt) {
  const Input qkv = random({c.B, c.T, 3, c.H, c.D}, seed, dt);
  std::vector<Input> parts;
  for (int64_t i = 0; i < 3; ++i) {
    parts.push_back(view_of(qkv, [i](const Tensor& t) { return t.select(2, i).transpose(1, 2); }));
  }
  return parts;
}

// `forward`/`backward` (a device path) against the CPU attention with the same dropout.
template <class Forward, class Backward>
void check_against_cpu(const Case& c, DType dt, const kernels::AttentionDropout& d,
                       Forward&& forward, Backward&& backward) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const std::vector<Input> in = fused_qkv(c, 40 + c.T, dt);
  const kernels::AttentionOutput want =
      kernels::causal_attention(in[0].ref, in[1].ref, in[2].ref, scale, d);
  const kernels::AttentionOutput got = forward(in[0].dev, in[1].dev, in[2].dev, scale);
  const double tol = tol_for(dt, 5e-3);
  check_close(got.out, want.out, dt, tol);
  // lse is f64 for f64 operands, else f32.
  check_close(got.lse, want.lse, dt == DType::f64 ? DType::f64 : DType::f32, 5e-3);
  const Input dout = random({c.B, c.H, c.T, c.D}, 41 + c.T, dt);
  const kernels::AttentionGrads wg = kernels::causal_attention_backward(
      dout.ref, in[0].ref, in[1].ref, in[2].ref, want.out, want.lse, scale, d);
  const kernels::AttentionGrads gg =
      backward(dout.dev, in[0].dev, in[1].dev, in[2].dev, got.out, got.lse, scale);
  check_close(gg.dq, wg.dq, dt, 3 * tol);
  check_close(gg.dk, wg.dk, dt, 3 * tol);
  check_close(gg.dv, wg.dv, dt, 3 * tol);
}

// With v the identity (D = T) out row t is the dropped probability row: zero exactly where
// the CPU mask drops. q and k are small, so no kept probability rounds to zero.
void check_exact_zeros(DType dt, bool cudnn) {
  const Case c{1, 2, 128, 128};
  const kernels::AttentionDropout d{0.25, 4242, 9};
  std::vector<double> eye(static_cast<size_t>(c.H * c.T * c.T), 0.0);
  for (int64_t h = 0; h < c.H; ++h) {
    for (int64_t j = 0; j < c.T; ++j) eye[static_cast<size_t>((h * c.T + j) * c.T + j)] = 1.0;
  }
  const Tensor v = from_vector(eye, {c.B, c.H, c.T, c.D}).to(dt).to(kCuda);
  const Input q = random({c.B, c.H, c.T, c.D}, 50, dt, -0.1, 0.1);
  const Input k = random({c.B, c.H, c.T, c.D}, 51, dt, -0.1, 0.1);
  kernels::AttentionOutput got;
  if (cudnn) {
    const std::optional<kernels::AttentionOutput> fused =
        kernels::cuda::cudnn_causal_attention(q.dev, k.dev, v, 0.1, d);
    REQUIRE(fused.has_value());
    got = *fused;
  } else {
    got = kernels::cuda::flash_causal_attention(q.dev, k.dev, v, 0.1, d);
  }
  const std::vector<double> out = got.out.to(Device::cpu()).to_vector<double>();
  const std::vector<bool> zero = dropped(c, d);
  int64_t mismatches = 0;
  for (int64_t h = 0; h < c.H; ++h) {
    for (int64_t i = 0; i < c.T; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        const size_t at = static_cast<size_t>((h * c.T + i) * c.T + j);
        mismatches += (out[at] == 0.0) != zero[at];
      }
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("the device dropout mask is the CPU dropout's", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Case c{2, 3, 77, 0};
  for (const kernels::AttentionDropout& d :
       {kernels::AttentionDropout{0.1, 7, 0}, kernels::AttentionDropout{0.5, 99, 0xFFFFFFF0ull}}) {
    for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
      const Tensor mask =
          kernels::cuda::dropout_keep_mask({c.B, c.H, c.T, c.T}, dt, kCuda, d.p, d.seed, d.offset);
      const std::vector<double> got = mask.to(Device::cpu()).to_vector<double>();
      const std::vector<bool> zero = dropped(c, d);
      int64_t mismatches = 0;
      for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != (zero[i] ? 0.0 : 1.0);
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("the flash kernels drop the CPU attention's probabilities", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const kernels::AttentionDropout d{0.2, 31337, 123};
  for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    for (const Case& c : {Case{2, 3, 100, 64}, Case{1, 2, 77, 32}}) {
      DYNAMIC_SECTION(dtype_name(dt) << " T " << c.T << " D " << c.D) {
        check_against_cpu(
            c, dt, d,
            [&](const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
              return kernels::cuda::flash_causal_attention(q, k, v, scale, d);
            },
            [&](const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& out, const Tensor& lse, double scale) {
              return kernels::cuda::flash_causal_attention_backward(dout, q, k, v, out, lse, scale,
                                                                    d);
            });
      }
    }
  }
  for (DType dt : {DType::f32, DType::bf16}) check_exact_zeros(dt, false);
}

TEST_CASE("cuDNN's fused attention drops the CPU attention's probabilities", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const kernels::AttentionDropout d{0.1, 2718, 5};
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const Case& c : {Case{2, 3, 128, 64}, Case{1, 12, 1024, 64}}) {
      DYNAMIC_SECTION(dtype_name(dt) << " T " << c.T << " D " << c.D) {
        check_against_cpu(
            c, dt, d,
            [&](const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
              const std::optional<kernels::AttentionOutput> got =
                  kernels::cuda::cudnn_causal_attention(q, k, v, scale, d);
              REQUIRE(got.has_value());
              return *got;
            },
            [&](const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& out, const Tensor& lse, double scale) {
              const std::optional<kernels::AttentionGrads> got =
                  kernels::cuda::cudnn_causal_attention_backward(dout, q, k, v, out, lse, scale, d);
              REQUIRE(got.has_value());
              return *got;
            });
      }
    }
  }
  check_exact_zeros(DType::bf16, true);
}

}  // namespace
}  // namespace tessera
