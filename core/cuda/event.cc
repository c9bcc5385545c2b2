// cuda::Event (core/cuda_runtime.h): cudaEvent_t on a device's compute stream.
#include <cuda_runtime_api.h>

#include "core/cuda/check.h"
#include "core/cuda_runtime.h"

namespace tessera::cuda {

Event::Event(int device) : device_(device) {
  check_device(device);
  TS_CUDA_CHECK(cudaSetDevice(device), device);
  cudaEvent_t e = nullptr;
  TS_CUDA_CHECK(cudaEventCreate(&e), device);
  event_ = e;
}

Event::~Event() {
  cudaSetDevice(device_);
  cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void Event::record() {
  TS_CUDA_CHECK(cudaSetDevice(device_), device_);
  // Stream 0, the legacy default stream every kernel and copy runs on.
  TS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), 0), device_);
}

bool Event::done() const {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clear it
    return false;
  }
  TS_CUDA_CHECK(status, device_);
  return true;
}

void Event::synchronize() const {
  TS_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), device_);
}

double Event::elapsed_ms(const Event& start, const Event& end) {
  TS_CHECK(start.device_ == end.device_, "[cuda] elapsed time between events of one device: ",
           "expected the same device, found cuda:", start.device_, " and cuda:", end.device_);
  float ms = 0;
  TS_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                                     static_cast<cudaEvent_t>(end.event_)),
                start.device_);
  return ms;
}

}  // namespace tessera::cuda
