// When cuDNN's fused attention takes a call (kernels/fused_attention.h), decided without a
// GPU: CPU tensors stand for the device operands (only dtypes, shapes, strides and
// addresses are read), against the limits cudnn-frontend checks.
#include "kernels/fused_attention.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/factories.h"

namespace tessera {
namespace {

using kernels::fused_attention_refusal;
using kernels::FusedAttentionMachine;

constexpr FusedAttentionMachine kH100{9, 0, 91900};

// q, k, v as parts of one (B, T, 3, H, D) projection seen as (B, H, T, D), as GPT makes them.
std::vector<Tensor> fused_qkv(int64_t b, int64_t h, int64_t t, int64_t d, DType dtype) {
  const Tensor qkv = zeros({b, t, 3, h, d}, {dtype});
  return {qkv.select(2, 0).transpose(1, 2), qkv.select(2, 1).transpose(1, 2),
          qkv.select(2, 2).transpose(1, 2)};
}

// The backward's operands: q, k, v, out, dout, with out and dout (B, T, H, D) in memory.
std::vector<Tensor> backward_operands(int64_t b, int64_t h, int64_t t, int64_t d, DType dtype) {
  std::vector<Tensor> ops = fused_qkv(b, h, t, d, dtype);
  ops.push_back(zeros({b, t, h, d}, {dtype}).transpose(1, 2));
  ops.push_back(zeros({b, t, h, d}, {dtype}).transpose(1, 2));
  return ops;
}

bool mentions(const std::string& why, const std::string& what) {
  return why.find(what) != std::string::npos;
}

TEST_CASE("cuDNN takes GPT's 16-bit attention on compute capability 8.0 and newer",
          "[fused_attention]") {
  for (DType dt : {DType::bf16, DType::f16}) {
    CHECK(fused_attention_refusal(fused_qkv(16, 12, 1024, 64, dt), Tensor(), kH100).empty());
    CHECK(fused_attention_refusal(backward_operands(2, 3, 100, 128, dt), zeros({2, 3, 100}), kH100)
              .empty());
    CHECK(fused_attention_refusal(fused_qkv(1, 1, 1, 8, dt), Tensor(), {8, 0, 90000}).empty());
  }
}

TEST_CASE("cuDNN's fused attention refuses what its limits exclude, with the reason",
          "[fused_attention]") {
  const Tensor lse = zeros({2, 3, 100});
  CHECK(mentions(fused_attention_refusal(fused_qkv(1, 2, 64, 64, DType::f32), Tensor(), kH100),
                 "found f32"));
  CHECK(mentions(
      fused_attention_refusal(fused_qkv(1, 2, 64, 64, DType::bf16), Tensor(), {7, 5, 91900}),
      "compute capability 8.0, found 7.5"));
  CHECK(mentions(
      fused_attention_refusal(fused_qkv(1, 2, 64, 64, DType::bf16), Tensor(), {9, 0, 8906}),
      "needs cuDNN 9, found 8.9.6"));
  CHECK(mentions(
      fused_attention_refusal(fused_qkv(1, 2, 64, 64, DType::bf16), Tensor(), {9, 0, 91001}),
      "known bugs"));
  CHECK(mentions(fused_attention_refusal(fused_qkv(1, 2, 64, 64, DType::bf16), Tensor(),
                                         {9, 0, 91900, /*turned_off=*/true}),
                 "TESSERA_CUDNN_ATTENTION=0"));
  CHECK(mentions(fused_attention_refusal(fused_qkv(1, 2, 64, 20, DType::bf16), Tensor(), kH100),
                 "multiple of 8 and at most 128, found 20"));
  CHECK(mentions(fused_attention_refusal(fused_qkv(1, 2, 64, 256, DType::bf16), Tensor(), kH100),
                 "found 256"));
  CHECK(mentions(
      fused_attention_refusal(backward_operands(2, 3, 1, 64, DType::bf16), zeros({2, 3, 1}), kH100),
      "T > 1"));
  // Older engines pad a backward whose T is not a multiple of 128; the forward needs none.
  CHECK(mentions(
      fused_attention_refusal(backward_operands(2, 3, 100, 64, DType::bf16), lse, {9, 0, 91500}),
      "multiple of 128, found 100"));
  CHECK(fused_attention_refusal(fused_qkv(2, 3, 100, 64, DType::bf16), Tensor(), {9, 0, 91500})
            .empty());
}

TEST_CASE("cuDNN's fused attention needs 16-byte strides and addresses and a unit last stride",
          "[fused_attention]") {
  SECTION("a last dim with stride 2") {
    const Tensor wide = zeros({1, 2, 64, 128}, {DType::bf16});
    const Tensor q = wide.narrow(3, 0, 64);
    std::vector<Tensor> ops = fused_qkv(1, 2, 64, 64, DType::bf16);
    ops[0] = zeros({1, 2, 64, 64, 2}, {DType::bf16}).select(4, 0);  // strides (.., 2)
    CHECK(mentions(fused_attention_refusal(ops, Tensor(), kH100), "q's last dim has stride 2"));
    ops[0] = q;  // rows 128 apart: fine
    CHECK(fused_attention_refusal(ops, Tensor(), kH100).empty());
  }
  SECTION("rows 8 bytes apart") {
    std::vector<Tensor> ops = fused_qkv(1, 2, 64, 64, DType::bf16);
    ops[1] = zeros({1, 2, 64, 68}, {DType::bf16}).narrow(3, 0, 64);
    CHECK(mentions(fused_attention_refusal(ops, Tensor(), kH100),
                   "k's stride 68 of dim 2 is not a multiple of 16 bytes"));
  }
  SECTION("an address 8 bytes past an aligned one") {
    std::vector<Tensor> ops = fused_qkv(1, 2, 64, 64, DType::bf16);
    ops[2] =
        zeros({1 * 2 * 64 * 64 + 4}, {DType::bf16}).narrow(0, 4, 2 * 64 * 64).view({1, 2, 64, 64});
    CHECK(mentions(fused_attention_refusal(ops, Tensor(), kH100), "v is not 16-byte aligned"));
  }
  SECTION("an lse 4 bytes past an aligned address") {
    const Tensor lse = zeros({2 * 3 * 100 + 1}).narrow(0, 1, 2 * 3 * 100).view({2, 3, 100});
    CHECK(
        mentions(fused_attention_refusal(backward_operands(2, 3, 100, 64, DType::bf16), lse, kH100),
                 "lse is not 16-byte aligned"));
  }
  SECTION("a non-contiguous lse") {
    const Tensor lse = zeros({2, 3, 200}).narrow(2, 0, 100);
    CHECK(
        mentions(fused_attention_refusal(backward_operands(2, 3, 100, 64, DType::bf16), lse, kH100),
                 "lse is not contiguous"));
  }
}

TEST_CASE("cuDNN's fused attention takes dropout up to a 1 GiB mask", "[fused_attention]") {
  // Note [cuDNN attention graphs]: the graphs read a (B, H, T, T) 16-bit mask.
  const kernels::AttentionDropout dropout{0.1, 1, 0};
  CHECK(fused_attention_refusal(fused_qkv(16, 12, 1024, 64, DType::bf16), Tensor(), kH100, dropout)
            .empty());
  CHECK(fused_attention_refusal(backward_operands(2, 3, 128, 64, DType::f16), zeros({2, 3, 128}),
                                kH100, dropout)
            .empty());
  // 64 x 16 x 1024 x 1024 bf16 values: 2 GiB.
  const std::vector<Tensor> big = fused_qkv(64, 16, 1024, 8, DType::bf16);
  CHECK(fused_attention_refusal(big, Tensor(), kH100).empty());
  CHECK(mentions(fused_attention_refusal(big, Tensor(), kH100, dropout),
                 "its dropout mask would take 2048 MiB, over 1024 MiB"));
}

}  // namespace
}  // namespace tessera
