// Tensors on a CUDA device: transfers (pinned and asynchronous included), strided and
// converting copies, fills, allocator reuse, events.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/matmul.h"

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

TEST_CASE("device conversions round once and equal the CPU's in every layout", "[gpu]") {
  // Just above 16-bit ties (a double rounding through float lands on the tie and rounds to
  // even, down), negatives and out-of-range values for the integers (truncated to int64,
  // then wrapped), NaN and infinity.
  const double above_f16_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  const std::vector<double> values{
      above_f16_tie, above_bf16_tie, -above_f16_tie, 65519.99,     1e-30, -1.5,
      300.7,         -2.9,           1e300,          std::nan(""), 0.0,   7.0};
  const Tensor host = from_vector(values);  // f64
  const Tensor dev = host.to(Device::cuda(0));
  CHECK(dev.to(DType::f16).to(Device::cpu()).to_vector<float>()[0] == 1.0009765625f);
  CHECK(dev.to(DType::bf16).to(Device::cpu()).to_vector<float>()[1] == 1.0078125f);
  for (DType dt :
       {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    CAPTURE(dtype_name(dt));
    const std::vector<double> got = dev.to(dt).to(Device::cpu()).to_vector<double>();
    const std::vector<double> want = host.to(dt).to_vector<double>();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i, values[i]);
      if (std::isnan(want[i])) {
        CHECK(std::isnan(got[i]));
      } else if (dt != DType::i32 && dt != DType::i64 && dt != DType::u8) {
        CHECK(got[i] == want[i]);
      } else if (std::abs(values[i]) < 1e18 && !std::isnan(values[i])) {
        CHECK(got[i] == want[i]);  // int64 itself is undefined past its range
      }
    }
  }
  // Layouts that merge (a transpose, a narrowed view, a broadcast) with a conversion.
  Generator g(3);
  const Tensor x = randn({4, 5, 6}, g);
  const Tensor xd = x.to(Device::cuda(0));
  CHECK(xd.transpose(0, 2).to(DType::bf16).contiguous().to(Device::cpu()).to_vector<float>() ==
        x.transpose(0, 2).to(DType::bf16).contiguous().to_vector<float>());
  CHECK(xd.narrow(2, 1, 4).to(DType::f16).to(Device::cpu()).to_vector<float>() ==
        x.narrow(2, 1, 4).to(DType::f16).to_vector<float>());
  const Tensor grid = empty({3, 4, 6}, {DType::f64, Device::cuda(0)});
  grid.copy_(xd.narrow(0, 0, 1).narrow(1, 0, 1).expand({3, 4, 6}));  // (1, 1, 6) broadcast
  CHECK(grid.to(Device::cpu()).to_vector<double>() == x.narrow(0, 0, 1)
                                                          .narrow(1, 0, 1)
                                                          .expand({3, 4, 6})
                                                          .to(DType::f64)
                                                          .contiguous()
                                                          .to_vector<double>());
}

// Contiguous conversions take vector accesses when both sides are 8-element aligned (Note
// [Device copies] in core/cuda/copy_kernel.cu), with a tail of n % 8; a view one element
// in takes the scalar kernel.
TEST_CASE("contiguous device conversions equal the CPU's, aligned or not", "[gpu]") {
  Generator g(5);
  const Tensor x = randn({100003}, g, {}, 0.0, 300.0);
  const std::vector<DType> types{DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32};
  for (DType from : types) {
    for (DType to : types) {
      if (from == to) continue;
      CAPTURE(dtype_name(from), dtype_name(to));
      const Tensor src = x.to(from);
      const Tensor dev = src.to(Device::cuda(0));
      for (int64_t offset : {0, 1}) {
        CAPTURE(offset);
        const int64_t n = src.numel() - offset;
        CHECK(dev.narrow(0, offset, n).to(to).to(Device::cpu()).to_vector<double>() ==
              src.narrow(0, offset, n).to(to).to_vector<double>());
      }
    }
  }
}

TEST_CASE("fill_ on the device equals the CPU's in every dtype and layout", "[gpu]") {
  // Values whose conversion rounds (16-bit floats), truncates (integers) or saturates to 1
  // (bool), and 0 (contiguous zeros take cudaMemsetAsync).
  for (const double value : {0.0, -1.0 / 3.0, 70000.5, 1e-8}) {
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64,
                     DType::u8, DType::boolean}) {
      CAPTURE(value, dtype_name(dt));
      const Tensor base = arange(6 * 35, {DType::f64}).view({6, 5, 7}).to(dt);
      Tensor host = base.clone();
      Tensor dev = base.to(Device::cuda(0));
      // Whole, a strided view (every other row of a transpose) and a narrowed view.
      host.fill_(value);
      dev.fill_(value);
      CHECK(dev.to(Device::cpu()).to_vector<double>() == host.to_vector<double>());
      host = base.clone();
      dev = base.to(Device::cuda(0));
      host.transpose(0, 2).narrow(2, 1, 3).fill_(value);
      dev.transpose(0, 2).narrow(2, 1, 3).fill_(value);
      CHECK(dev.to(Device::cpu()).to_vector<double>() == host.to_vector<double>());
    }
  }
  CHECK_THROWS_WITH(zeros({1}, {DType::f32, Device::cuda(0)}).expand({4}).fill_(1.0),
                    Catch::Contains("expanded"));
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

TEST_CASE("pinned host memory: pin_memory, is_pinned and non-blocking transfers", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  Generator g(3);
  const Tensor x = randn({64, 33}, g);
  CHECK_FALSE(x.is_pinned());
  const Tensor pinned = x.pin_memory();
  CHECK(pinned.is_pinned());
  CHECK(pinned.device() == Device::cpu());
  CHECK(pinned.to_vector<float>() == x.to_vector<float>());
  CHECK(pinned.pin_memory().raw_data() == pinned.raw_data());  // already pinned: itself
  CHECK(x.transpose(0, 1).pin_memory().to_vector<float>() ==
        x.transpose(0, 1).contiguous().to_vector<float>());
  const Tensor d = pinned.to(Device::cuda(0), /*non_blocking=*/true);
  CHECK(d.to(Device::cpu()).to_vector<float>() == x.to_vector<float>());
}

TEST_CASE("a pinned source freed while its copy is queued is not reused too early", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  Generator g(4);
  // A large GEMM queued first keeps the device busy while the copies below are queued.
  const Tensor a = randn({4096, 4096}, g).to(Device::cuda(0));
  const Tensor busy = kernels::matmul(a, a, false, false);
  const Tensor x = randn({1 << 20}, g);
  Tensor d;
  {
    const Tensor pinned = x.pin_memory();
    d = pinned.to(Device::cuda(0), /*non_blocking=*/true);
  }  // freed at once; the allocator must keep the block until the copy has run
  const Tensor other = full({1 << 20}, 7.0).pin_memory();  // same size: would reuse it
  CHECK(other.to_vector<float>() == std::vector<float>(1 << 20, 7.0f));
  CHECK(d.to(Device::cpu()).to_vector<float>() == x.to_vector<float>());
  CHECK(busy.numel() == 4096 * 4096);
}

TEST_CASE("copy_queued_ converts through pinned staging and equals copy_", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  Generator g(6);
  const std::vector<DType> dtypes = {DType::bf16, DType::f16, DType::f32};
  std::vector<Tensor> sources, got;
  for (DType dt : dtypes) {
    sources.push_back(randn({999}, g));
    got.push_back(zeros({999}, {dt, Device::cuda(0)}));
  }
  // A large GEMM queued first keeps the device busy, so the queued copies wait behind it:
  // their sources are overwritten (allowed) and their staging kept (required) meanwhile.
  const Tensor a = randn({4096, 4096}, g).to(Device::cuda(0));
  const Tensor busy = kernels::matmul(a, a, false, false);
  std::vector<Tensor> staging;
  std::vector<std::vector<float>> values;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    staging.push_back(zeros({1000}).pin_memory());  // 4000 bytes: room for 1000 of any dtype
    values.push_back(sources[i].to_vector<float>());
    got[i].copy_queued_(sources[i], staging[i]);
    sources[i].fill_(5.0);
  }
  for (size_t i = 0; i < dtypes.size(); ++i) {
    INFO(dtype_name(dtypes[i]));
    const Tensor want = zeros({999}, {dtypes[i], Device::cuda(0)});
    want.copy_(from_vector(values[i]));
    CHECK(got[i].to(Device::cpu()).to_vector<double>() ==
          want.to(Device::cpu()).to_vector<double>());
  }
  const Tensor& staging_full = staging.front();  // for the refusals below
  const Tensor d = zeros({2001}, {DType::bf16, Device::cuda(0)});
  CHECK_THROWS_WITH(d.copy_queued_(randn({2001}, g), staging_full),
                    Catch::Contains("expected staging of at least 4002 bytes"));
  CHECK_THROWS_WITH(d.narrow(0, 0, 10).copy_queued_(randn({10}, g), zeros({10})),
                    Catch::Contains("pageable memory"));
  CHECK_THROWS_WITH(zeros({10}).copy_queued_(randn({10}, g), staging_full),
                    Catch::Contains("contiguous CUDA destination"));
  CHECK(busy.numel() == 4096 * 4096);
}

TEST_CASE("events time device work and report completion", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  Generator g(5);
  const Tensor a = randn({2048, 2048}, g).to(Device::cuda(0));
  cuda::Event start(0), end(0);
  CHECK(start.done());  // never recorded
  start.record();
  Tensor c = a;
  for (int i = 0; i < 8; ++i) c = kernels::matmul(c, a, false, false);
  end.record();
  end.synchronize();
  CHECK(end.done());
  CHECK(start.done());
  const double ms = cuda::Event::elapsed_ms(start, end);
  CHECK(ms > 0.0);
  CHECK(ms < 10000.0);
}

}  // namespace
}  // namespace tessera
