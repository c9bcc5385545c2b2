// Strided, dtype-converting copy on the current CUDA device (core/cuda/copy_kernel.cu).
#pragma once

#include "core/cuda_runtime.h"

namespace tessera::cuda {

// dst[i] = cast(src[i]) for every index of `shape` (rank <= 8); asynchronous.
void launch_copy_strided(const StridedView& dst, const StridedView& src, const Shape& shape);

// Every element of `dst` over `shape` (rank <= 8) becomes the low itemsize bytes of
// `pattern`; cudaMemsetAsync for zeros in contiguous memory; asynchronous.
void launch_fill(const StridedView& dst, const Shape& shape, uint64_t pattern);

}  // namespace tessera::cuda
