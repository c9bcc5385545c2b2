// Error checking for CUDA runtime calls inside core/cuda (CUDA builds only).
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

// Throws tessera::Error naming the call, the CUDA error and the device.
#define TS_CUDA_CHECK(call, device)                                                               \
  do {                                                                                            \
    const cudaError_t ts_cuda_status = (call);                                                    \
    TS_CHECK(ts_cuda_status == cudaSuccess, "[cuda] ", #call, " failed on cuda:", (device), ": ", \
             cudaGetErrorName(ts_cuda_status), " (", cudaGetErrorString(ts_cuda_status), ")");    \
  } while (0)
