// The CUDA runtime as seen from core: device discovery, memory and copies.
//
// Two implementations exist: core/cuda/runtime.cc (built when the toolkit is found) and
// core/cuda/runtime_stub.cc, where every call throws "built without CUDA". Either way a
// machine without a GPU gets a clear "no CUDA device" error instead of a crash.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace tessera::cuda {

// True when this binary contains the CUDA backend.
bool is_built();
// Number of visible CUDA devices; 0 when built without CUDA or no driver/device.
int device_count();
// Throws unless `index` names a present device: "no CUDA device" / "built without CUDA".
void check_device(int index);

// The caching allocator of device `index` (created on first use).
Allocator& allocator(int index);

enum class CopyKind { host_to_device, device_to_host, device_to_device };
// Synchronous byte copy between host and device memory.
void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);

// One strided operand of copy_strided: `data` points at element 0 of the view.
struct StridedView {
  void* data;
  DType dtype;
  Strides strides;  // in elements, same rank as the shape
};
// dst[i] = cast(src[i]) over `shape` on device `device`; src strides may be 0 (broadcast).
void copy_strided(const StridedView& dst, const StridedView& src, const Shape& shape, int device);

// Blocks until all work on `device` is done.
void synchronize(int device);

}  // namespace tessera::cuda
