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
namespace {}  // namespace

bool is_built() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: report zero and clear the sticky error
    return 0;
  }
  return n;
}

void check_device(int index) {
  const int n = device_count();
  TS_CHECK(n > 0, "[cuda] no CUDA device: expected a GPU for cuda:", index,
           ", found none (cudaGetDeviceCount reports 0 or no driver is loaded)");
  TS_CHECK(index >= 0 && index < n, "[cuda] no CUDA device cuda:", index,
           ": expected an index in [0, ", n, ")");
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
}

void copy_strided(const StridedView& dst, const StridedView& src, const Shape& shape, int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  launch_copy_strided(dst, src, shape);
  TS_CUDA_CHECK(cudaGetLastError(), device);
}

void synchronize(int device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  TS_CUDA_CHECK(cudaDeviceSynchronize(), device);
}

}  // namespace tessera::cuda
