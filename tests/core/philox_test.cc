#include "core/philox.h"

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "core/factories.h"

using tessera::DType;
using tessera::Generator;
using Words = std::array<uint32_t, 4>;

TEST_CASE("philox4x32-10 known answers (Random123 kat_vectors)", "[philox]") {
  CHECK(tessera::philox4x32(0, 0, 0) == Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(tessera::philox4x32(~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}) ==
        Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  // Counter {243f6a88, 85a308d3, 13198a2e, 03707344}, key {a4093822, 299f31d0}: the low
  // 32 bits of each uint64 are the first word.
  CHECK(tessera::philox4x32(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull) ==
        Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("philox is a pure function of counter and key", "[philox]") {
  CHECK(tessera::philox4x32(5, 7, 9) == tessera::philox4x32(5, 7, 9));
  CHECK(tessera::philox4x32(5, 7, 9) != tessera::philox4x32(6, 7, 9));
  CHECK(tessera::philox4x32(5, 7, 9) != tessera::philox4x32(5, 8, 9));
  CHECK(tessera::philox4x32(5, 7, 9) != tessera::philox4x32(5, 7, 10));
  CHECK(tessera::philox4x32(5, 7, 9) != tessera::philox4x32(5, 7, 9ull | (1ull << 40)));
}

TEST_CASE("uniform_from_bits maps to [0, 1)", "[philox]") {
  CHECK(tessera::uniform_from_bits(0) == 0.0f);
  CHECK(tessera::uniform_from_bits(0xffffffffu) < 1.0f);
  CHECK(tessera::uniform_from_bits(0xffffffffu) == 1.0f - std::ldexp(1.0f, -24));
  CHECK(tessera::uniform_from_bits(0x80000000u) == 0.5f);
}

TEST_CASE("rand draws element i from word i % 4 of block offset + i / 4", "[philox]") {
  Generator g(1234, 10);
  const std::vector<double> v = tessera::rand({6}, g, {DType::f64}).to_vector<double>();
  CHECK(g.offset() == 12);  // 6 words use 2 blocks
  for (int i = 0; i < 6; ++i) {
    const Words w = tessera::philox4x32(10 + i / 4, 0, 1234);
    CHECK(v[i] == tessera::uniform_from_bits(w[i % 4]));
  }
}

TEST_CASE("rand stays in [low, high) for every floating dtype", "[philox]") {
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    INFO(tessera::dtype_name(d));
    Generator g(7);
    const std::vector<double> v = tessera::rand({200000}, g, {d}).to_vector<double>();
    double lo = 1, hi = 0, sum = 0;
    for (double x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sum += x;
    }
    CHECK(lo >= 0.0);
    CHECK(hi < 1.0);
    CHECK(std::abs(sum / v.size() - 0.5) < 0.01);
    Generator g2(8);
    for (double x : tessera::rand({100000}, g2, {d}, 1.0, 2.0).to_vector<double>()) {
      if (!(x >= 1.0 && x < 2.0)) FAIL("rand in [1, 2) gave " << x);
    }
    Generator g3(9);
    for (double x : tessera::rand({100000}, g3, {d}, -3.0, -2.5).to_vector<double>()) {
      if (!(x >= -3.0 && x < -2.5)) FAIL("rand in [-3, -2.5) gave " << x);
    }
  }
  Generator g(1);
  CHECK_THROWS_WITH(tessera::rand({2}, g, {DType::i32}),
                    Catch::Matchers::Contains("[rand] expected a floating dtype, found i32"));
  CHECK_THROWS_WITH(tessera::randn({2}, g, {DType::u8}),
                    Catch::Matchers::Contains("[randn] expected a floating dtype, found u8"));
}

TEST_CASE("randn has the requested mean and standard deviation", "[philox]") {
  Generator g(42);
  const int64_t n = 400000;
  const std::vector<double> v = tessera::randn({n}, g, {DType::f64}, 3.0, 2.0).to_vector<double>();
  double sum = 0, sq = 0;
  int64_t within_one = 0;
  for (double x : v) {
    REQUIRE(std::isfinite(x));
    sum += x;
    sq += x * x;
    within_one += std::abs(x - 3.0) < 2.0;
  }
  const double mean = sum / n;
  const double var = sq / n - mean * mean;
  CHECK(std::abs(mean - 3.0) < 0.02);
  CHECK(std::abs(std::sqrt(var) - 2.0) < 0.02);
  CHECK(std::abs(static_cast<double>(within_one) / n - 0.6827) < 0.005);  // one sigma
  Generator gf(43);
  const std::vector<float> f = tessera::randn({1001}, gf).to_vector<float>();  // odd length
  CHECK(std::set<float>(f.begin(), f.end()).size() > 990);
}

TEST_CASE("generators advance, reproduce and continue streams", "[philox]") {
  Generator a(99);
  const std::vector<float> first = tessera::rand({8}, a).to_vector<float>();
  CHECK(a.offset() == 2);
  const std::vector<float> second = tessera::rand({8}, a).to_vector<float>();
  CHECK(a.offset() == 4);
  CHECK(first != second);
  // Two draws of 8 equal one draw of 16 (both use whole blocks).
  Generator b(99);
  const std::vector<float> both = tessera::rand({16}, b).to_vector<float>();
  CHECK(std::vector<float>(both.begin(), both.begin() + 8) == first);
  CHECK(std::vector<float>(both.begin() + 8, both.end()) == second);
  // Rewinding the offset reproduces the stream.
  a.set_offset(2);
  CHECK(tessera::rand({8}, a).to_vector<float>() == second);
  // A partial block is skipped: the next draw starts on a fresh block.
  Generator c(99);
  tessera::rand({5}, c);
  CHECK(c.offset() == 2);
  CHECK(c.reserve(0) == 2);
  CHECK(c.offset() == 2);
  CHECK(c.reserve(1) == 2);
  CHECK(c.offset() == 3);
  // Different seeds differ; randn and rand read the same words but map them differently.
  Generator d(100);
  CHECK(tessera::rand({8}, d).to_vector<float>() != first);
  Generator e(99), f(99);
  CHECK(tessera::randn({16}, e).to_vector<float>() == tessera::randn({16}, f).to_vector<float>());
  CHECK(e.offset() == 4);
}

TEST_CASE("Generator::for_name is keyed by seed and name", "[philox]") {
  const Generator a = Generator::for_name(0, "h.0.attn.c_attn.weight");
  const Generator b = Generator::for_name(0, "h.0.attn.c_attn.bias");
  const Generator c = Generator::for_name(1, "h.0.attn.c_attn.weight");
  const Generator a2 = Generator::for_name(0, "h.0.attn.c_attn.weight");
  CHECK(a.seed() == a2.seed());
  CHECK(a.offset() == 0);
  CHECK(a.seed() != b.seed());
  CHECK(a.seed() != c.seed());
  CHECK(Generator::for_name(0, "").seed() != Generator::for_name(0, "a").seed());
  CHECK(tessera::hash_name(5, "x") == tessera::hash_name(5, "x"));
  Generator ga = a, gb = b;
  CHECK(tessera::randn({8}, ga).to_vector<float>() != tessera::randn({8}, gb).to_vector<float>());
  // Many names give distinct keys.
  std::set<uint64_t> keys;
  for (int i = 0; i < 1000; ++i) keys.insert(tessera::hash_name(0, "h." + std::to_string(i)));
  CHECK(keys.size() == 1000);
}
