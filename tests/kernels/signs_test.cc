#include "kernels/signs.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "core/factories.h"

namespace tessera {
namespace {

TEST_CASE("pack_signs packs MSB first, zero and nan as +1", "[signs]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // 11 elements: two bytes, the second with 5 unused (zero) low bits.
  const Tensor x = from_vector<float>({1.f, -2.f, 0.f, -0.f, -1e-30f, 3.f, nan, -4.f,  //
                                       -1.f, 2.f, 0.5f});
  const std::vector<uint8_t> bits = kernels::pack_signs(x).to_vector<uint8_t>();
  // 1 0 1 1 0 1 1 0 = 0xB6; 0 1 1 then 00000 = 0x60.
  CHECK(bits == std::vector<uint8_t>{0xB6, 0x60});
  CHECK(kernels::unpack_signs(kernels::pack_signs(x), 11, DType::f32).to_vector<float>() ==
        std::vector<float>{1, -1, 1, 1, -1, 1, 1, -1, -1, 1, 1});
  // f64 in, f64 out; empty input.
  const Tensor d = from_vector<double>({-0.25, 7.0});
  CHECK(kernels::unpack_signs(kernels::pack_signs(d), 2, DType::f64).to_vector<double>() ==
        std::vector<double>{-1, 1});
  CHECK(kernels::pack_signs(zeros({0})).numel() == 0);
}

TEST_CASE("sign bits round-trip at sizes around the byte and the thread grain", "[signs]") {
  Generator gen(3);
  for (int64_t n : {1, 7, 8, 9, 131073}) {
    CAPTURE(n);
    const Tensor x = randn({n}, gen);
    const std::vector<float> v = x.to_vector<float>();
    const std::vector<float> got =
        kernels::unpack_signs(kernels::pack_signs(x), n, DType::f32).to_vector<float>();
    REQUIRE(got.size() == v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (got[i] != (v[i] < 0 ? -1.f : 1.f)) FAIL("element " << i << " of " << n);
    }
  }
}

TEST_CASE("sign kernels reject bad inputs", "[signs]") {
  CHECK_THROWS_WITH(
      kernels::pack_signs(zeros({2, 3})),
      Catch::Contains("[pack_signs] expected a contiguous 1-D x, found shape (2, 3)"));
  CHECK_THROWS_WITH(kernels::unpack_signs(zeros({2}, {DType::u8}), 17, DType::f32),
                    Catch::Contains("[unpack_signs] 17 signs need 3 bytes, found 2"));
  CHECK_THROWS_WITH(kernels::unpack_signs(zeros({2}), 8, DType::f32),
                    Catch::Contains("expected contiguous 1-D u8 bits, found f32"));
}

}  // namespace
}  // namespace tessera
