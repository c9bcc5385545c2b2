// The CUDA runtime behind core/cuda_runtime.h (linked when the toolkit is found).
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/caching_allocator.h"
#include "core/cuda/check.h"
#include "core/cuda/copy_kernel.h"
#include "core/cuda_runtime.h"

namespace tessera::cuda {
bool is_built() { return true; }

DeviceProbe probe_devices() {
  DeviceProbe p;
  if (cudaRuntimeGetVersion(&p.runtime_version) != cudaSuccess) p.runtime_version = 0;
  // Reports 0 without error when no driver library can be loaded.
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();  // discovery errors are not sticky, but never leave one behind
  const std::string runtime = version_name(p.runtime_version);
  if (err == cudaSuccess && n > 0) {
    p.count = n;
  } else if (err == cudaSuccess || err == cudaErrorNoDevice) {
    p.problem = str_cat("the driver (CUDA ", version_name(p.driver_version),
                        ") sees no device; is CUDA_VISIBLE_DEVICES empty or the GPU absent?");
  } else if (err == cudaErrorInsufficientDriver && p.driver_version == 0) {
    p.problem = str_cat("no CUDA driver: libcuda.so.1 could not be loaded (this binary's ",
                        "runtime is CUDA ", runtime, ")");
  } else if (err == cudaErrorInsufficientDriver) {
    p.problem =
        str_cat("the driver supports CUDA up to ", version_name(p.driver_version),
                ", older than this binary's runtime (CUDA ", runtime, "): update the driver");
  } else {
    p.problem = str_cat("cudaGetDeviceCount failed with ", cudaGetErrorName(err), " (",
                        cudaGetErrorString(err), "); driver CUDA ", version_name(p.driver_version),
                        ", runtime CUDA ", runtime);
  }
  return p;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess) return n;
  cudaGetLastError();  // no driver or no device: probe_devices() says which
  return 0;
}

DeviceInfo device_info(int index) {
  check_device(index);
  cudaDeviceProp prop{};
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, index), index);
  int clock_khz = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, index), index);
  return DeviceInfo{.name = prop.name,
                    .major = prop.major,
                    .minor = prop.minor,
                    .multiprocessors = prop.multiProcessorCount,
                    .clock_khz = clock_khz,
                    .memory_bytes = prop.totalGlobalMem};
}

void check_device(int index) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && index >= 0 && index < n) return;  // the common case
  cudaGetLastError();
  const DeviceProbe p = probe_devices();
  if (p.count == 0) {
    throw NoDeviceError(str_cat("[cuda] no CUDA device: expected a GPU for cuda:", index,
                                ", found none: ", p.problem));
  }
  if (index < 0 || index >= p.count) {
    throw NoDeviceError(
        str_cat("[cuda] no CUDA device cuda:", index, ": expected an index in [0, ", p.count, ")"));
  }
}

Allocator& allocator(int index) {
  check_device(index);
  // One allocator per device for the process lifetime, created on first use.
  static std::mutex mutex;
  static std::vector<std::unique_ptr<CachingAllocator>> allocators;
  std::lock_guard<std::mutex> lock(mutex);
  if (allocators.size() <= static_cast<size_t>(index)) allocators.resize(index + 1);
  if (!allocators[index]) {
    // Every block is cached (Note [Block cache]): all work runs on one stream per device,
    // so a block freed on the host may be reused by later work on that stream.
    allocators[index] = std::make_unique<CachingAllocator>(
        str_cat("cuda:", index, " allocator"),
        CachingPolicy{.small_unit = 512,
                      .large_unit = size_t{2} << 20,
                      .large_min = size_t{1} << 20,
                      .min_cached = 0,
                      .max_cached = ~size_t{0}},
        [index](size_t n) -> void* {
          void* p = nullptr;
          if (cudaSetDevice(index) != cudaSuccess || cudaMalloc(&p, n) != cudaSuccess) {
            cudaGetLastError();  // clear the error; the allocator reports the failure
            return nullptr;
          }
          return p;
        },
        [index](void* p) {
          cudaSetDevice(index);
          cudaFree(p);
        });
  }
  return *allocators[index];
}

void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  TS_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, k), device);
  // The device has finished the work before a read: report what it found wrong.
  if (kind == CopyKind::device_to_host) raise_deferred_errors(device);
}

void copy_strided(const StridedView& dst, const StridedView& src, const Shape& shape, int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  launch_copy_strided(dst, src, shape);
  TS_CUDA_CHECK(cudaGetLastError(), device);
}

void fill(const StridedView& dst, const Shape& shape, uint64_t pattern, int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  launch_fill(dst, shape, pattern);
  TS_CUDA_CHECK(cudaGetLastError(), device);
}

void synchronize(int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  TS_CUDA_CHECK(cudaDeviceSynchronize(), device);
  raise_deferred_errors(device);
}

}  // namespace tessera::cuda
