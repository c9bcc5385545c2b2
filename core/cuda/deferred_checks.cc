// Deferred device checks (Note [Deferred device checks], core/cuda_runtime.h).
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda_runtime.h"

namespace tessera::cuda {
namespace {

constexpr int kTagShift = 40;  // positions below 2^40, tags above
constexpr uint64_t kNoViolation = ~uint64_t{0};
constexpr size_t kMaxPending = 4096;

// One device's checks since its word was last read.
struct DeviceChecks {
  std::mutex mutex;
  unsigned long long* word = nullptr;  // device memory, kNoViolation when clear
  std::vector<std::function<std::string(int64_t)>> pending;  // index = tag >> kTagShift
};

DeviceChecks& checks_of(int device) {
  check_device(device);
  // One record per device for the process lifetime, as the allocators.
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceChecks>> all;
  std::lock_guard<std::mutex> lock(mutex);
  if (all.size() <= static_cast<size_t>(device)) all.resize(static_cast<size_t>(device) + 1);
  if (!all[static_cast<size_t>(device)])
    all[static_cast<size_t>(device)] = std::make_unique<DeviceChecks>();
  return *all[static_cast<size_t>(device)];
}

// The word, allocated and cleared on first use; the caller holds c.mutex.
unsigned long long* word_locked(DeviceChecks& c, int device) {
  if (c.word == nullptr) {
    TS_CUDA_CHECK(cudaSetDevice(device), device);
    void* word = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&word, sizeof(*c.word)), device);
    c.word = static_cast<unsigned long long*>(word);
    TS_CUDA_CHECK(cudaMemset(c.word, 0xff, sizeof(*c.word)), device);
  }
  return c.word;
}

}  // namespace

unsigned long long* deferred_check_word(int device) {
  DeviceChecks& c = checks_of(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  return word_locked(c, device);
}

uint64_t defer_check(int device, std::function<std::string(int64_t position)> describe) {
  DeviceChecks& c = checks_of(device);
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    full = c.pending.size() >= kMaxPending;
  }
  if (full) raise_deferred_errors(device);
  std::lock_guard<std::mutex> lock(c.mutex);
  word_locked(c, device);
  c.pending.push_back(std::move(describe));
  return static_cast<uint64_t>(c.pending.size() - 1) << kTagShift;
}

void raise_deferred_errors(int device) {
  DeviceChecks& c = checks_of(device);
  std::vector<std::function<std::string(int64_t)>> pending;
  uint64_t recorded = kNoViolation;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.pending.empty()) return;
    pending.swap(c.pending);
    TS_CUDA_CHECK(cudaSetDevice(device), device);
    // On the legacy default stream: after every kernel queued so far.
    TS_CUDA_CHECK(cudaMemcpy(&recorded, c.word, sizeof(recorded), cudaMemcpyDeviceToHost), device);
    if (recorded == kNoViolation) return;
    TS_CUDA_CHECK(cudaMemset(c.word, 0xff, sizeof(*c.word)), device);
  }
  // Outside the lock: describe() may read device memory, which raises again (nothing is
  // pending then).
  const uint64_t tag = recorded >> kTagShift;
  const int64_t position = static_cast<int64_t>(recorded & ((uint64_t{1} << kTagShift) - 1));
  // A tag from another host thread's check that this read consumed first (Note [Deferred
  // device checks]) has no description here.
  if (tag >= pending.size()) {
    throw Error(str_cat("[cuda] a device-side check of cuda:", device, " failed at position ",
                        position,
                        "; its op is unknown (checks from several host threads on "
                        "one device)"));
  }
  throw Error(pending[tag](position));
}

}  // namespace tessera::cuda
