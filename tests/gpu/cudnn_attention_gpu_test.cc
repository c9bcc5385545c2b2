// cuDNN's fused attention (kernels/cuda/cudnn_attention.cu) against an f64 CPU reference and
// Tessera's own flash kernels: q, k and v as the strided views of one fused qkv projection
// that GPT hands it, bf16 and f16, lengths that are and are not multiples of the tiles; the
// layouts it returns; the same bits run to run; and the calls it must leave to the flash
// kernels (f32, head dims cuDNN lacks, T = 1 backward).
#include <catch2/catch.hpp>
#include <cmath>
#include <optional>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/attention.h"
#include "kernels/cuda/kernels.h"
#include "tests/gpu/parity.h"

namespace tessera {
namespace {

using testing::check_bitwise;
using testing::check_close;
using testing::Input;
using testing::kCuda;
using testing::random;
using testing::tol_for;
using testing::view_of;

struct Shape4 {
  int64_t B, H, T, D;
};

// q, k and v as GPT makes them: part i of a (B, T, 3, H, D) projection seen as (B, H, T, D).
struct Qkv {
  Input q, k, v;
};

Qkv fused_qkv(const Shape4& s, uint64_t seed, DType dt) {
  const Input qkv = random({s.B, s.T, 3, s.H, s.D}, seed, dt);
  auto part = [&](int64_t i) {
    return view_of(qkv, [i](const Tensor& t) { return t.select(2, i).transpose(1, 2); });
  };
  return {part(0), part(1), part(2)};
}

// (B, H, T, D) seen from (B, T, H, D) memory: out's layout and each of dq, dk, dv's.
void check_heads_interleaved(const Tensor& t, int64_t parts) {
  const int64_t h = t.size(1), d = t.size(3);
  CHECK(t.stride(3) == 1);
  CHECK(t.stride(1) == d);
  CHECK(t.stride(2) == parts * h * d);
}

TEST_CASE("cuDNN attention matches an f64 CPU reference and the flash kernels", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Shape4 shapes[] = {{2, 3, 100, 64}, {1, 2, 77, 32}, {2, 2, 256, 128}, {1, 12, 1024, 64}};
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const Shape4& s : shapes) {
      DYNAMIC_SECTION(dtype_name(dt)
                      << " B " << s.B << " H " << s.H << " T " << s.T << " D " << s.D) {
        const double tol = tol_for(dt, 5e-3);
        const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
        const Qkv in = fused_qkv(s, 90 + s.T, dt);
        const kernels::AttentionOutput want =
            kernels::causal_attention(in.q.ref, in.k.ref, in.v.ref, scale);
        const std::optional<kernels::AttentionOutput> got =
            kernels::cuda::cudnn_causal_attention(in.q.dev, in.k.dev, in.v.dev, scale);
        REQUIRE(got.has_value());
        check_heads_interleaved(got->out, 1);
        check_close(got->out, want.out, dt, tol);
        check_close(got->lse, want.lse, DType::f32, 5e-3);
        const kernels::AttentionOutput flash =
            kernels::cuda::flash_causal_attention(in.q.dev, in.k.dev, in.v.dev, scale);
        check_close(got->lse, flash.lse.to(Device::cpu()).to(DType::f64), DType::f32, 1e-3);

        const Input dout = view_of(random({s.B, s.T, s.H, s.D}, 91 + s.T, dt),
                                   [](const Tensor& t) { return t.transpose(1, 2); });
        const kernels::AttentionGrads wg = kernels::causal_attention_backward(
            dout.ref, in.q.ref, in.k.ref, in.v.ref, want.out, want.lse, scale);
        const std::optional<kernels::AttentionGrads> gg =
            kernels::cuda::cudnn_causal_attention_backward(dout.dev, in.q.dev, in.k.dev, in.v.dev,
                                                           got->out, got->lse, scale);
        REQUIRE(gg.has_value());
        for (const Tensor* g : {&gg->dq, &gg->dk, &gg->dv}) check_heads_interleaved(*g, 3);
        // cuDNN rounds P and dS to 16 bits before the dv, dk and dq products: at T = 1024
        // bf16, 2 of 786432 elements of one gradient were 4-5% of its rms off (an H200).
        check_close(gg->dq, wg.dq, dt, 3 * tol);
        check_close(gg->dk, wg.dk, dt, 3 * tol);
        check_close(gg->dv, wg.dv, dt, 3 * tol);

        const std::optional<kernels::AttentionGrads> again =
            kernels::cuda::cudnn_causal_attention_backward(dout.dev, in.q.dev, in.k.dev, in.v.dev,
                                                           got->out, got->lse, scale);
        REQUIRE(again.has_value());
        check_bitwise(gg->dq, again->dq);
        check_bitwise(gg->dk, again->dk);
        check_bitwise(gg->dv, again->dv);
      }
    }
  }
}

TEST_CASE("calls cuDNN does not take run on the flash kernels", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  SECTION("f32") {
    const Qkv in = fused_qkv({1, 2, 64, 64}, 95, DType::f32);
    CHECK_FALSE(kernels::cuda::cudnn_causal_attention(in.q.dev, in.k.dev, in.v.dev, 0.125));
    const kernels::AttentionOutput routed =
        kernels::causal_attention(in.q.dev, in.k.dev, in.v.dev, 0.125);
    check_close(routed.out, kernels::causal_attention(in.q.ref, in.k.ref, in.v.ref, 0.125).out,
                DType::f32, 5e-3);
  }
  SECTION("a head dim that is not a multiple of 8") {
    const Qkv in = fused_qkv({1, 2, 64, 20}, 96, DType::bf16);
    CHECK_FALSE(kernels::cuda::cudnn_causal_attention(in.q.dev, in.k.dev, in.v.dev, 0.2));
  }
  SECTION("T = 1: the forward is cuDNN's, the backward the flash kernels'") {
    const Qkv in = fused_qkv({2, 2, 1, 32}, 97, DType::bf16);
    const std::optional<kernels::AttentionOutput> f =
        kernels::cuda::cudnn_causal_attention(in.q.dev, in.k.dev, in.v.dev, 0.2);
    REQUIRE(f.has_value());
    CHECK_FALSE(kernels::cuda::cudnn_causal_attention_backward(f->out, in.q.dev, in.k.dev, in.v.dev,
                                                               f->out, f->lse, 0.2));
    const kernels::AttentionGrads routed = kernels::causal_attention_backward(
        f->out, in.q.dev, in.k.dev, in.v.dev, f->out, f->lse, 0.2);
    CHECK(routed.dq.size(2) == 1);
  }
}

}  // namespace
}  // namespace tessera
