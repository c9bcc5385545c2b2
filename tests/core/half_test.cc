#include "core/half.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "core/dtype.h"

using tessera::BFloat16;
using tessera::Half;

namespace {

float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }
bool half_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// Checks round-to-nearest-even between two adjacent 16-bit patterns lo < hi (by value,
// both finite and non-negative, hi = lo + 1): the exact midpoint goes to the even pattern,
// anything nearer to one side goes to that side.
template <class ToFloat, class FromFloat>
void check_rounding_between(uint16_t lo, ToFloat to_float, FromFloat from_float) {
  const uint16_t hi = lo + 1;
  const double a = to_float(lo);
  const double b = to_float(hi);
  const float mid = static_cast<float>((a + b) / 2);  // exact: one more bit than a or b
  REQUIRE(static_cast<double>(mid) == (a + b) / 2);
  const uint16_t even = (lo & 1u) == 0 ? lo : hi;
  INFO("lo=" << lo << " a=" << a << " b=" << b);
  CHECK(from_float(mid) == even);
  CHECK(from_float(std::nextafter(mid, 0.0f)) == lo);
  CHECK(from_float(std::nextafter(mid, std::numeric_limits<float>::infinity())) == hi);
  CHECK(from_float(-mid) == (even | 0x8000u));
  CHECK(from_float(-std::nextafter(mid, 0.0f)) == (lo | 0x8000u));
}

}  // namespace

TEST_CASE("f16: every non-NaN pattern round-trips through float", "[half]") {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = Half::to_float(bits);
    if (half_is_nan(bits)) {
      CHECK(std::isnan(f));
      CHECK(half_is_nan(Half::from_float(f)));
    } else if (Half::from_float(f) != bits) {
      FAIL("pattern " << h << " -> " << f << " -> " << Half::from_float(f));
    }
  }
}

TEST_CASE("f16: to_float of known patterns", "[half]") {
  CHECK(Half::to_float(0x0000) == 0.0f);
  CHECK(std::signbit(Half::to_float(0x8000)));
  CHECK(Half::to_float(0x3c00) == 1.0f);
  CHECK(Half::to_float(0xc000) == -2.0f);
  CHECK(Half::to_float(0x7bff) == 65504.0f);
  CHECK(Half::to_float(0x0400) == std::ldexp(1.0f, -14));     // smallest normal
  CHECK(Half::to_float(0x0001) == std::ldexp(1.0f, -24));     // smallest subnormal
  CHECK(Half::to_float(0x03ff) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(Half::to_float(0x3555) == 0.333251953125f);
  CHECK(Half::to_float(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(Half::to_float(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(Half::to_float(0x7e00)));
}

TEST_CASE("f16: from_float rounds to nearest even everywhere, subnormals included", "[half]") {
  auto to_f = [](uint16_t h) { return Half::to_float(h); };
  auto from_f = [](float f) { return Half::from_float(f); };
  // Every pair of adjacent finite positive halves, from 0/min-subnormal up to 65504.
  for (uint32_t lo = 0; lo < 0x7bff; ++lo)
    check_rounding_between(static_cast<uint16_t>(lo), to_f, from_f);
}

TEST_CASE("f16: overflow, underflow, inf and NaN", "[half]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(Half::from_float(65504.0f) == 0x7bff);
  CHECK(Half::from_float(65519.99f) == 0x7bff);  // below the midpoint to 65536
  CHECK(Half::from_float(65520.0f) == 0x7c00);   // the midpoint rounds to even: inf
  CHECK(Half::from_float(1e10f) == 0x7c00);
  CHECK(Half::from_float(-1e10f) == 0xfc00);
  CHECK(Half::from_float(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(Half::from_float(inf) == 0x7c00);
  CHECK(Half::from_float(-inf) == 0xfc00);
  CHECK(Half::from_float(-0.0f) == 0x8000);
  CHECK(Half::from_float(std::ldexp(1.0f, -25)) == 0x0000);  // half of min subnormal: even
  CHECK(Half::from_float(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(Half::from_float(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp: to even (2)
  CHECK(Half::from_float(std::ldexp(1.0f, -30)) == 0x0000);
  CHECK(Half::from_float(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(Half::from_float(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  CHECK(half_is_nan(Half::from_float(std::numeric_limits<float>::quiet_NaN())));
  CHECK(half_is_nan(Half::from_float(-std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload lives only in the low float bits stays a NaN.
  CHECK(half_is_nan(Half::from_float(std::bit_cast<float>(0x7f800001u))));
  CHECK(half_is_nan(Half::from_float(std::bit_cast<float>(0xff800001u))));
}

#if defined(__FLT16_MANT_DIG__)
TEST_CASE("f16: from_float matches the compiler's _Float16 conversion", "[half]") {
  std::mt19937 rng(1234);
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    const uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    const uint16_t got = Half::from_float(f);
    if (std::isnan(f)) {
      CHECK(half_is_nan(got));
    } else if (got != want) {
      FAIL("float bits " << std::bit_cast<uint32_t>(f) << ": got " << got << ", want " << want);
    }
  }
}
#endif

TEST_CASE("bf16: every non-NaN pattern round-trips through float", "[half]") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = bf16_to_float(bits);
    CHECK((static_cast<float>(BFloat16(f)) == f || std::isnan(f)));
    if (bf16_is_nan(bits)) {
      CHECK(bf16_is_nan(BFloat16::from_float(f)));
    } else if (BFloat16::from_float(f) != bits) {
      FAIL("pattern " << b << " -> " << f << " -> " << BFloat16::from_float(f));
    }
  }
}

TEST_CASE("bf16: from_float rounds to nearest even, subnormals included", "[half]") {
  auto from_f = [](float f) { return BFloat16::from_float(f); };
  // Every pair of adjacent finite positive bf16 values below the largest (0x7f7f).
  for (uint32_t lo = 0; lo < 0x7f7f; ++lo) {
    check_rounding_between(static_cast<uint16_t>(lo), bf16_to_float, from_f);
  }
}

TEST_CASE("bf16: known values, overflow, inf and NaN", "[half]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(BFloat16::from_float(1.0f) == 0x3f80);
  CHECK(BFloat16::from_float(-2.0f) == 0xc000);
  CHECK(BFloat16::from_float(0.1f) == 0x3dcd);
  CHECK(BFloat16::from_float(3.0e38f) == 0x7f62);
  CHECK(BFloat16::from_float(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to inf
  CHECK(BFloat16::from_float(inf) == 0x7f80);
  CHECK(BFloat16::from_float(-inf) == 0xff80);
  CHECK(BFloat16::from_float(-0.0f) == 0x8000);
  CHECK(BFloat16::from_float(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(BFloat16::from_float(std::bit_cast<float>(0x00008000u)) == 0x0000);  // tie: to even
  CHECK(BFloat16::from_float(std::bit_cast<float>(0x00018000u)) == 0x0002);  // tie: to even
  CHECK(bf16_is_nan(BFloat16::from_float(std::numeric_limits<float>::quiet_NaN())));
  // NaNs whose payload would be rounded away stay NaN (they must not become inf).
  CHECK(bf16_is_nan(BFloat16::from_float(std::bit_cast<float>(0x7f800001u))));
  CHECK(bf16_is_nan(BFloat16::from_float(std::bit_cast<float>(0xffffffffu))));
}

TEST_CASE("conversion operators", "[half]") {
  CHECK(static_cast<float>(Half(1.5f)) == 1.5f);
  CHECK(Half(1.5f).bits == 0x3e00);
  CHECK(static_cast<float>(BFloat16(1.5f)) == 1.5f);
  CHECK(BFloat16(1.5f).bits == 0x3fc0);
  CHECK(Half().bits == 0);
  CHECK(BFloat16().bits == 0);
}

namespace {

// The 16-bit pattern nearest to `d` among the neighbours of `guess` (ties to the even
// pattern): a reference that only compares exact doubles. Finite d within range only.
template <class T>
uint16_t nearest_pattern(double d, uint16_t guess) {
  uint16_t best = guess;
  double best_err =
      std::abs(static_cast<double>(static_cast<float>(T{std::bit_cast<T>(guess)})) - d);
  for (const int step : {-1, 1}) {
    const uint16_t c = static_cast<uint16_t>(guess + step);
    if (((c ^ guess) & 0x8000u) != 0) continue;  // stay on one side of zero
    const double err = std::abs(static_cast<double>(static_cast<float>(std::bit_cast<T>(c))) - d);
    if (err < best_err || (err == best_err && (c & 1u) == 0)) best = c, best_err = err;
  }
  return best;
}

}  // namespace

TEST_CASE("convert rounds doubles and 32-bit integers to 16 bits once", "[half]") {
  // Just above a tie: rounding to float first lands on the tie, which goes to even (down).
  const double above_f16_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(tessera::convert<Half>(above_f16_tie).bits == Half(1.0009765625f).bits);
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  CHECK(tessera::convert<BFloat16>(above_bf16_tie).bits == BFloat16(1.0078125f).bits);
  CHECK(tessera::convert<BFloat16>(int32_t{(1 << 24) + (1 << 16) + 1}).bits ==
        BFloat16(static_cast<float>((1 << 24) + (2 << 16))).bits);
  // Random doubles near 16-bit values: the nearest pattern, exactly.
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> mag(-20.0, 15.0);
  for (int i = 0; i < 200000; ++i) {
    const double d =
        std::ldexp(1.0 + static_cast<double>(rng() >> 11) * 0x1p-53, static_cast<int>(mag(rng))) *
        ((rng() & 1u) != 0 ? -1.0 : 1.0);
    const uint16_t h = tessera::convert<Half>(d).bits;
    const uint16_t b = tessera::convert<BFloat16>(d).bits;
    if (h != nearest_pattern<Half>(d, h) || b != nearest_pattern<BFloat16>(d, b)) {
      FAIL("double " << d << ": f16 " << h << ", bf16 " << b);
    }
  }
}

TEST_CASE("convert truncates floating values to integers and wraps to the width", "[half]") {
  CHECK(tessera::convert<uint8_t>(-1.5) == 255);
  CHECK(tessera::convert<uint8_t>(-1.5f) == 255);
  CHECK(tessera::convert<uint8_t>(300.7) == 44);
  CHECK(tessera::convert<int32_t>(-2.9) == -2);
  CHECK(tessera::convert<int64_t>(1e15) == 1000000000000000);
}
