// Bulk f32 <-> f16/bf16 conversion (core/half_convert.h) against the scalar conversions of
// core/half.h, bit for bit: every 16-bit pattern widened, and f32 patterns from every
// exponent (NaNs, infinities, subnormals and ties included) narrowed. Lengths leave a
// scalar tail after the vector loop.
#include "core/half_convert.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/factories.h"
#include "core/tensor.h"

namespace tessera {
namespace {

std::vector<float> awkward_floats() {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffbfffffu, 0x00000001u, 0x807fffffu, 0x477ff000u,
                                0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
                                0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7fffffu, 0xc77fe000u};
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;      // bf16 ties
    if (i % 4 == 1) u = (u & 0x8fffe000u) | 0x38001000u;  // f16 ties near the normal range
    bits.push_back(u);
  }
  std::vector<float> f(bits.size() + 7);  // + a tail that is not a whole vector
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::bit_cast<float>(bits[i % bits.size()]);
  return f;
}

template <class H>
std::vector<H> every_pattern() {
  std::vector<H> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i].bits = static_cast<uint16_t>(i);
  return all;
}

TEST_CASE("bulk narrowing equals the scalar conversions bit for bit", "[half]") {
  const std::vector<float> src = awkward_floats();
  const auto n = static_cast<int64_t>(src.size());
  std::vector<BFloat16> bf(src.size());
  std::vector<Half> h(src.size());
  f32_to_bf16(src.data(), bf.data(), n);
  f32_to_f16(src.data(), h.data(), n);
  size_t bad_bf = 0, bad_h = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    bad_bf += bf[i].bits != BFloat16(src[i]).bits;
    bad_h += h[i].bits != Half(src[i]).bits;
  }
  CHECK(bad_bf == 0);
  CHECK(bad_h == 0);
}

TEST_CASE("bulk widening equals the scalar conversions for every 16-bit pattern", "[half]") {
  const auto bf = every_pattern<BFloat16>();
  const auto h = every_pattern<Half>();
  std::vector<float> wide_bf(bf.size()), wide_h(h.size());
  bf16_to_f32(bf.data(), wide_bf.data(), static_cast<int64_t>(bf.size()));
  f16_to_f32(h.data(), wide_h.data(), static_cast<int64_t>(h.size()));
  size_t bad = 0;
  for (size_t i = 0; i < bf.size(); ++i) {
    bad +=
        std::bit_cast<uint32_t>(wide_bf[i]) != std::bit_cast<uint32_t>(static_cast<float>(bf[i]));
    bad += std::bit_cast<uint32_t>(wide_h[i]) != std::bit_cast<uint32_t>(static_cast<float>(h[i]));
  }
  CHECK(bad == 0);
}

TEST_CASE("Tensor::to between f32 and 16 bits goes through the bulk path unchanged", "[half]") {
  const std::vector<float> values = awkward_floats();
  const Tensor f = from_vector(values, {static_cast<int64_t>(values.size())});
  for (DType half : {DType::f16, DType::bf16}) {
    const Tensor narrow = f.to(half);
    // The strided path converts element by element: the transposed views must agree.
    const Tensor f2 = f.narrow(0, 0, 200000).reshape({400, 500});
    const Tensor strided = empty({500, 400}, {half}).transpose(0, 1);
    strided.copy_(f2);
    const Tensor bulk = f2.to(half);
    CHECK(std::memcmp(strided.contiguous().raw_data(), bulk.raw_data(), bulk.nbytes()) == 0);
    const Tensor back = narrow.to(DType::f32);
    const Tensor back_strided = empty({500, 400}, {DType::f32}).transpose(0, 1);
    back_strided.copy_(bulk);
    CHECK(std::memcmp(back_strided.contiguous().raw_data(), bulk.to(DType::f32).raw_data(),
                      bulk.numel() * 4) == 0);
    CHECK(back.numel() == f.numel());
  }
}

}  // namespace
}  // namespace tessera
