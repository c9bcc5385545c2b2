// main() of the gpu-tagged tests: without a usable CUDA device they run nothing and exit
// with cli::kExitNoDevice and the reason (tools/gpu/run.sh reports them as skipped), instead
// of failing each test case on its first device call. Failed tests exit with 1, not
// Catch2's count of failures, which could read as kExitNoDevice.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "core/cuda_runtime.h"
#include "tools/cli/flags.h"

int main(int argc, char** argv) {
  const tessera::cuda::DeviceProbe probe = tessera::cuda::probe_devices();
  if (probe.count == 0) {
    std::fprintf(stderr, "%s: no CUDA device: %s\n", argv[0], probe.problem.c_str());
    return tessera::cli::kExitNoDevice;
  }
  return Catch::Session().run(argc, argv) == 0 ? 0 : 1;
}
