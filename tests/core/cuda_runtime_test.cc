#include "core/cuda_runtime.h"

#include <catch2/catch.hpp>

#include "core/device.h"
#include "core/factories.h"

using Catch::Matchers::Contains;
using tessera::Device;
using tessera::DeviceType;

TEST_CASE("Device::parse accepts cpu, cuda and cuda:N", "[device]") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:0") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cuda:12").index == 12);
  CHECK(Device::parse("cuda:3").type == DeviceType::cuda);
  CHECK(Device::cuda(2).str() == "cuda:2");
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cpu().is_cpu());
  CHECK_FALSE(Device::cpu().is_cuda());
  CHECK(Device::cuda(1) != Device::cuda(0));
  for (const char* bad : {"", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:1x", "cuda: 1", "cuda0",
                          "cpu:0", "cuda:99999999999"}) {
    INFO(bad);
    CHECK_THROWS_WITH(Device::parse(bad),
                      Contains("[device] expected \"cpu\", \"cuda\" or \"cuda:N\"; found \"" +
                               std::string(bad) + "\""));
  }
}

TEST_CASE("CUDA tensors fail clearly without a GPU", "[cuda]") {
  if (tessera::cuda::device_count() > 0) {
    // A GPU is present: a round trip through it must work instead.
    tessera::Tensor t = tessera::arange(6).view({2, 3});
    tessera::Tensor g = t.to(Device::cuda(0));
    CHECK(g.device() == Device::cuda(0));
    CHECK(g.to(Device::cpu()).to_vector<float>() == t.to_vector<float>());
    return;
  }
  const std::string expected = tessera::cuda::is_built() ? "no CUDA device" : "built without CUDA";
  CHECK_THROWS_WITH(tessera::zeros({2}, {tessera::DType::f32, Device::cuda(0)}),
                    Contains(expected));
  CHECK_THROWS_WITH(tessera::empty({2}, {tessera::DType::f16, Device::cuda(1)}),
                    Contains(expected));
  CHECK_THROWS_WITH(tessera::arange(4).to(Device::cuda(0)), Contains(expected));
  CHECK_THROWS_WITH(tessera::cuda::check_device(0), Contains(expected));
  CHECK_THROWS_WITH(tessera::allocator_for(Device::cuda(0)), Contains(expected));
  CHECK_THROWS_WITH(tessera::arange(4).pin_memory(), Contains(expected));
  CHECK_THROWS_WITH(tessera::cuda::Event(0), Contains(expected));
  CHECK_FALSE(tessera::arange(4).is_pinned());
  // A non-blocking copy of pageable memory is a plain copy, which fails the same way.
  CHECK_THROWS_WITH(tessera::arange(4).to(Device::cuda(0), /*non_blocking=*/true),
                    Contains(expected));
  CHECK(tessera::cuda::device_count() == 0);
  // The CPU keeps working after the failures.
  CHECK(tessera::ones({2}).to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("Device discovery says why no GPU is usable", "[cuda]") {
  const tessera::cuda::DeviceProbe probe = tessera::cuda::probe_devices();
  if (probe.count > 0) {
    CHECK(probe.problem.empty());
    CHECK(probe.driver_version >= probe.runtime_version);
    return;
  }
  CHECK_FALSE(probe.problem.empty());
  CHECK_THROWS_AS(tessera::cuda::check_device(0), tessera::NoDeviceError);
  CHECK_THROWS_WITH(tessera::cuda::check_device(0), Contains(probe.problem));
  if (!tessera::cuda::is_built()) return;
  // The runtime is linked statically, so its version is known even without a driver.
  CHECK(probe.runtime_version >= 11000);
  const std::string runtime = std::to_string(probe.runtime_version / 1000) + "." +
                              std::to_string(probe.runtime_version % 1000 / 10);
  if (probe.driver_version == 0) {
    CHECK_THAT(probe.problem, Contains("libcuda.so.1") && Contains("CUDA " + runtime));
  } else if (probe.driver_version < probe.runtime_version) {
    CHECK_THAT(probe.problem, Contains("older than") && Contains("CUDA " + runtime));
  }
}

TEST_CASE("the dense bf16 peak is SMs x clock x the architecture's FLOPs per SM per clock",
          "[cuda]") {
  using tessera::cuda::dense_bf16_peak_flops;
  using tessera::cuda::DeviceInfo;
  // NVIDIA's data sheets: A100 312 TFLOP/s (108 SMs at 1410 MHz), H100 SXM 989.4 TFLOP/s
  // (132 SMs at 1830 MHz; the device reports 1980 MHz, for 1070 TFLOP/s).
  CHECK(dense_bf16_peak_flops(DeviceInfo{"A100", 8, 0, 108, 1410000, 0}) ==
        Approx(312e12).epsilon(0.001));
  CHECK(dense_bf16_peak_flops(DeviceInfo{"H100", 9, 0, 132, 1830000, 0}) ==
        Approx(989.4e12).epsilon(0.001));
  // Architectures it has no figure for: 0, and the trainer reports no MFU. An RTX 3090's
  // is 71 TFLOP/s, an RTX A6000's 155, both sm_86.
  CHECK(dense_bf16_peak_flops(DeviceInfo{"RTX 3090", 8, 6, 82, 1695000, 0}) == 0);
  CHECK(dense_bf16_peak_flops(DeviceInfo{"future", 11, 0, 200, 2000000, 0}) == 0);
}
