// TESSERA_HOST_DEVICE: a function defined in a header for both the host and, under nvcc,
// the device, so that the CPU and CUDA backends share one definition of a formula.
#pragma once

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TESSERA_HOST_DEVICE inline
#endif
