#include "core/factories.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "core/allocator.h"

using Catch::Matchers::Contains;
using tessera::DType;
using tessera::Shape;
using tessera::Tensor;

namespace {

const DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64,
                            DType::i32, DType::i64, DType::u8,   DType::boolean};

}  // namespace

TEST_CASE("zeros, ones and full in every dtype", "[factories]") {
  for (DType d : kAllDTypes) {
    INFO(tessera::dtype_name(d));
    Tensor z = tessera::zeros({2, 3}, {d});
    CHECK(z.dtype() == d);
    CHECK(z.device() == tessera::Device::cpu());
    CHECK(z.shape() == Shape{2, 3});
    CHECK(z.is_contiguous());
    CHECK(z.to_vector<double>() == std::vector<double>(6, 0));
    CHECK(tessera::ones({4}, {d}).to_vector<double>() == std::vector<double>(4, 1));
    const double v = d == DType::boolean ? 1 : 5;
    CHECK(tessera::full({3, 1}, v, {d}).to_vector<double>() == std::vector<double>(3, v));
    CHECK(tessera::scalar_tensor(v, {d}).item<double>() == v);
    CHECK(tessera::empty({0, 4}, {d}).numel() == 0);
    CHECK(tessera::zeros({}, {d}).dim() == 0);
    CHECK(tessera::zeros({}, {d}).numel() == 1);
  }
  CHECK(tessera::full({2}, -1.5, {DType::f16}).to_vector<float>() ==
        std::vector<float>{-1.5f, -1.5f});
  CHECK(tessera::full({2}, 2.9, {DType::i32}).to_vector<int32_t>() == std::vector<int32_t>{2, 2});
  CHECK_THROWS_WITH(tessera::zeros({2, -1}), Contains("expected non-negative dimensions"));
}

TEST_CASE("arange in every dtype", "[factories]") {
  for (DType d : kAllDTypes) {
    if (d == DType::boolean) continue;
    INFO(tessera::dtype_name(d));
    Tensor a = tessera::arange(5, {d});
    CHECK(a.dtype() == d);
    CHECK(a.to_vector<double>() == std::vector<double>{0, 1, 2, 3, 4});
    CHECK(tessera::arange(2.0, 11.0, 3.0, {d}).to_vector<double>() == std::vector<double>{2, 5, 8});
  }
  CHECK(tessera::arange(2, {DType::boolean}).to_vector<bool>() == std::vector<bool>{false, true});
  CHECK(tessera::arange(0.0, 1.0, 0.25, {DType::f64}).to_vector<double>() ==
        std::vector<double>{0, 0.25, 0.5, 0.75});
  CHECK(tessera::arange(3.0, 0.0, -1.0).to_vector<float>() == std::vector<float>{3, 2, 1});
  CHECK(tessera::arange(3.0, 3.0).numel() == 0);
  CHECK(tessera::arange(5.0, 1.0).numel() == 0);  // empty, not negative
  CHECK(tessera::arange(0).shape() == Shape{0});
  CHECK_THROWS_WITH(tessera::arange(0.0, 1.0, 0.0),
                    Contains("[arange] expected a non-zero step, found 0"));
  CHECK_THROWS_WITH(tessera::arange(0.0, 1.0 / 0.0), Contains("[arange] expected finite bounds"));
}

TEST_CASE("from_vector copies values in every dtype", "[factories]") {
  CHECK(tessera::from_vector<float>({1.5f, 2}).to_vector<float>() == std::vector<float>{1.5f, 2});
  CHECK(tessera::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).shape() == Shape{2, 3});
  CHECK(tessera::from_vector<int32_t>({-1, 7}).dtype() == DType::i32);
  CHECK(tessera::from_vector<int64_t>({1ll << 40}).item<int64_t>() == 1ll << 40);
  CHECK(tessera::from_vector<uint8_t>({255, 0}).to_vector<int32_t>() ==
        std::vector<int32_t>{255, 0});
  Tensor h = tessera::from_vector<tessera::Half>({tessera::Half(0.5f), tessera::Half(-2.0f)});
  CHECK(h.dtype() == DType::f16);
  CHECK(h.to_vector<float>() == std::vector<float>{0.5f, -2.0f});
  Tensor b = tessera::from_vector<tessera::BFloat16>({tessera::BFloat16(3.0f)});
  CHECK(b.dtype() == DType::bf16);
  CHECK(b.item<float>() == 3.0f);
  Tensor flags = tessera::from_vector(std::vector<bool>{true, false, true}, {3, 1});
  CHECK(flags.dtype() == DType::boolean);
  CHECK(flags.shape() == Shape{3, 1});
  CHECK(flags.to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(tessera::from_vector(std::vector<bool>{false, true}).to_vector<int32_t>() ==
        std::vector<int32_t>{0, 1});
  // The tensor owns a copy.
  std::vector<float> src = {1, 2};
  Tensor c = tessera::from_vector(src);
  src[0] = 9;
  CHECK(c.to_vector<float>()[0] == 1);
  CHECK(tessera::from_vector(std::vector<float>{}).numel() == 0);
  CHECK_THROWS_WITH(tessera::from_vector<float>({1, 2, 3}, {2, 2}),
                    Contains("[from_vector] shape (2, 2) needs 4 values, found 3"));
}

TEST_CASE("from_blob wraps memory without copying; the deleter runs once", "[factories]") {
  int deleted = 0;
  std::vector<float> buffer = {0, 1, 2, 3, 4, 5};
  void* seen = nullptr;
  {
    Tensor t =
        tessera::from_blob(buffer.data(), {2, 3}, DType::f32, tessera::Device::cpu(), [&](void* p) {
          ++deleted;
          seen = p;
        });
    CHECK(t.raw_data() == buffer.data());
    CHECK(t.to_vector<float>() == buffer);
    t.select(0, 1).fill_(-1);  // writes go to the wrapped memory
    CHECK(buffer == std::vector<float>{0, 1, 2, -1, -1, -1});
    Tensor v = t.transpose(0, 1);
    Tensor d = t.detach();
    Tensor copy = t;
    {
      Tensor n = t.narrow(1, 0, 1);
      CHECK(n.storage().use_count() >= 4);
    }
    CHECK(deleted == 0);
    t = Tensor();
    v = Tensor();
    d = Tensor();
    CHECK(deleted == 0);  // `copy` still holds the storage
  }
  CHECK(deleted == 1);
  CHECK(seen == buffer.data());
  // No deleter: nothing runs, the memory stays the caller's.
  {
    Tensor t = tessera::from_blob(buffer.data(), {6}, DType::i32);
    CHECK(t.numel() == 6);
  }
  // Other dtypes take their element size from the dtype.
  std::vector<uint16_t> halves = {0x3c00, 0x4000};
  Tensor h = tessera::from_blob(halves.data(), {2}, DType::f16);
  CHECK(h.to_vector<float>() == std::vector<float>{1.0f, 2.0f});
  CHECK(h.storage().nbytes() == 4);
}

TEST_CASE("empty and the allocator honour alignment", "[factories]") {
  for (DType d : kAllDTypes) {
    Tensor t = tessera::empty({3, 5}, {d});
    CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % tessera::kCpuAlignment == 0);
    CHECK(t.storage().nbytes() == 15 * tessera::itemsize(d));
  }
}
