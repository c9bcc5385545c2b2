// Sign pack and unpack (kernels/signs.h) on the GPU against the CPU kernels (which take f32:
// a 16-bit value has its f32 conversion's sign): small sizes in every floating dtype, and
// sizes past the grid cap of kernels/cuda/common.cuh's grid_for
// (524,280 blocks of 256 threads), where a kernel that is not a grid-stride loop leaves the
// tail unwritten (1-bit compression of any model above about 134M parameters).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/factories.h"
#include "core/philox.h"
#include "kernels/signs.h"
#include "tests/gpu/parity.h"

namespace tessera::kernels {
namespace {

using testing::kCuda;

// Threads in the largest grid grid_for launches.
constexpr int64_t kGridCapThreads = int64_t{524280} * 256;

std::vector<uint8_t> bytes_of(const Tensor& t) { return t.to(Device::cpu()).to_vector<uint8_t>(); }
std::vector<float> floats_of(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

// `count` bytes of a fixed pattern that sets every bit position somewhere, as a CPU tensor.
Tensor pattern_bytes(int64_t count) {
  Tensor bits = empty({count}, {DType::u8});
  uint8_t* p = bits.data_ptr<uint8_t>();
  for (int64_t b = 0; b < count; ++b) p[b] = static_cast<uint8_t>((b * 37 + 11) & 0xff);
  return bits;
}

TEST_CASE("GPU sign pack and unpack equal the CPU's", "[gpu][signs]") {
  for (const int64_t n : {1, 7, 8, 9, 1000, 4099}) {
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      CAPTURE(n, dtype_name(dtype));
      Generator gen(n);
      Tensor x = randn({n}, gen);
      float* v = x.data_ptr<float>();
      v[0] = -0.0f;  // packs as "not negative", like DeepSpeed's sign().add_(1).bool()
      if (n > 2) v[2] = 0.0f;
      if (n > 3) v[3] = std::nanf("");
      const Tensor host = x.to(dtype);
      const Tensor bits = pack_signs(host.to(DType::f32));
      CHECK(bytes_of(pack_signs(host.to(kCuda))) == bytes_of(bits));
      CHECK(floats_of(unpack_signs(bits.to(kCuda), n, dtype).to(DType::f32)) ==
            floats_of(unpack_signs(bits, n, DType::f32)));
    }
  }
}

TEST_CASE("GPU sign unpack writes every element past the grid cap", "[gpu][signs]") {
  // One thread per element: n past the cap's threads by a few blocks and a ragged byte.
  const int64_t n = kGridCapThreads + 1000 * 8 + 3;
  const Tensor bits = pattern_bytes((n + 7) / 8);
  const std::vector<float> got =
      floats_of(unpack_signs(bits.to(kCuda), n, DType::bf16).to(DType::f32));
  const std::vector<float> want = floats_of(unpack_signs(bits, n, DType::f32));
  REQUIRE(got.size() == want.size());
  int64_t first_bad = -1;
  for (int64_t i = 0; i < n && first_bad < 0; ++i) {
    if (got[static_cast<size_t>(i)] != want[static_cast<size_t>(i)]) first_bad = i;
  }
  CHECK(first_bad == -1);
}

TEST_CASE("GPU sign pack writes every byte past the grid cap", "[gpu][signs]") {
  // One thread per byte: 8x the cap's threads in elements (about 2.1 GB of bf16), plus a
  // few blocks and a last byte with 5 of its 8 bits used.
  const int64_t bytes = kGridCapThreads + 1000;
  const int64_t n = (bytes - 1) * 8 + 5;
  Tensor want = pattern_bytes(bytes);
  want.data_ptr<uint8_t>()[bytes - 1] &= 0xf8;  // unused low bits pack as 0
  // +1 / -1 with `want`'s bits, made on the device (the CPU unpacks to f32 only).
  const Tensor x = unpack_signs(want.to(kCuda), n, DType::bf16);
  const std::vector<uint8_t> got = bytes_of(pack_signs(x));
  const std::vector<uint8_t> expected = bytes_of(want);
  REQUIRE(got.size() == expected.size());
  int64_t first_bad = -1;
  for (int64_t b = 0; b < bytes && first_bad < 0; ++b) {
    if (got[static_cast<size_t>(b)] != expected[static_cast<size_t>(b)]) first_bad = b;
  }
  CHECK(first_bad == -1);
}

}  // namespace
}  // namespace tessera::kernels
