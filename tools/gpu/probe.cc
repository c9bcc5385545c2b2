// gpu_probe: what this build's CUDA runtime sees, and one kernel run on each device, so a GPU
// machine's first minute tells whether the bundle's binaries load, find a driver new enough
// and carry machine code (or PTX) for its GPUs (tools/gpu/run.sh runs it first).
//
//   probe            exit 0: every device ran the kernel; 3: no usable device (the reason
//                    is printed); 1: a device failed
#include <cstdio>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "core/tensor.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

constexpr const char* kTool = "probe";
constexpr const char* kUsage =
    "usage: probe\n"
    "Prints the CUDA runtime and driver versions and each device, then runs a conversion\n"
    "kernel on each. Exit codes: 0 all devices work, 3 no usable device, 1 a device failed.\n";

int probe_main(int argc, char** argv) {
  const cli::Flags flags(argc, argv, {});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const cuda::DeviceProbe probe = cuda::probe_devices();
  std::printf("CUDA runtime %s (linked), driver supports CUDA %s, %d device(s)\n",
              cuda::version_name(probe.runtime_version).c_str(),
              cuda::version_name(probe.driver_version).c_str(), probe.count);
  if (probe.count == 0) throw NoDeviceError("[probe] no CUDA device: " + probe.problem);
  for (int i = 0; i < probe.count; ++i) {
    const cuda::DeviceInfo info = cuda::device_info(i);
    std::printf(
        "cuda:%d %s, compute capability %d.%d, %d multiprocessors at %.0f MHz, %.1f GiB, dense "
        "bf16 peak %.0f TFLOP/s\n",
        i, info.name.c_str(), info.major, info.minor, info.multiprocessors, info.clock_khz / 1e3,
        static_cast<double>(info.memory_bytes) / (1 << 30),
        cuda::dense_bf16_peak_flops(info) / 1e12);
    // A conversion runs the copy kernel: it fails here when the fatbin has no code for
    // this GPU. f16 holds the integers up to 2048 exactly.
    const Tensor host = arange(1000);
    const std::vector<float> back =
        host.to(Device::cuda(i)).to(DType::f16).to(DType::f32).to(Device::cpu()).to_vector<float>();
    TS_CHECK(back == host.to_vector<float>(), "[probe] cuda:", i,
             ": a round trip of 0..999 through f16 on the device changed values");
    std::printf("cuda:%d ran a kernel: ok\n", i);
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool(tessera::kTool, tessera::kUsage, tessera::probe_main, argc, argv);
}
