// Tensors on a CUDA device: transfers, strided and converting copies, fills, allocator reuse.
#include <catch2/catch.hpp>

#include "core/cuda_runtime.h"
#include "core/factories.h"

namespace tessera {
namespace {

TEST_CASE("host -> device -> host round trips exactly", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  Generator g(1);
  Tensor x = randn({37, 19}, g);
  Tensor back = x.to(Device::cuda(0)).to(Device::cpu());
  CHECK(back.to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("device copies handle strides, broadcasting and dtype conversion", "[gpu]") {
  Generator g(2);
  Tensor x = randn({5, 7}, g, {DType::f64});
  Tensor d = x.to(Device::cuda(0));
  Tensor t = d.transpose(0, 1).contiguous();  // strided device-to-device copy
  CHECK(t.to(Device::cpu()).to_vector<double>() ==
        x.transpose(0, 1).contiguous().to_vector<double>());
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    INFO(dtype_name(dt));
    CHECK(d.to(dt).to(Device::cpu()).to_vector<double>() == x.to(dt).to_vector<double>());
  }
  Tensor filled = full({3, 4}, 2.5, {DType::bf16, Device::cuda(0)});
  CHECK(filled.to(Device::cpu()).to_vector<float>() == std::vector<float>(12, 2.5f));
  Tensor row = from_vector<float>({1, 2, 3}).to(Device::cuda(0));
  Tensor grid = empty({2, 3}, {DType::f32, Device::cuda(0)});
  grid.copy_(row);  // broadcast (3) -> (2, 3)
  CHECK(grid.to(Device::cpu()).to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
}

TEST_CASE("the caching allocator reuses freed blocks", "[gpu]") {
  Allocator& alloc = allocator_for(Device::cuda(0));
  { Tensor a = empty({1 << 20}, {DType::f32, Device::cuda(0)}); }
  const int64_t reserved = alloc.stats().reserved;
  { Tensor b = empty({1 << 20}, {DType::f32, Device::cuda(0)}); }
  CHECK(alloc.stats().reserved == reserved);
  CHECK(alloc.stats().allocated == 0);
  CHECK(alloc.stats().peak_allocated >= (int64_t{4} << 20));
}

}  // namespace
}  // namespace tessera
