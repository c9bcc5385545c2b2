// The CUDA runtime as seen from core: device discovery, memory and copies.
//
// Two implementations exist: core/cuda/runtime.cc (built when the toolkit is found) and
// core/cuda/runtime_stub.cc, where every call throws "built without CUDA". Either way a
// machine without a GPU gets a clear "no CUDA device" error instead of a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace tessera::cuda {

// True when this binary contains the CUDA backend.
bool is_built();
// What device discovery found. CUDA versions are encoded as 1000 * major + 10 * minor
// (13000 is 13.0); 0 where unknown (no driver library, or built without CUDA).
struct DeviceProbe {
  int count = 0;            // usable devices
  int driver_version = 0;   // the newest CUDA the installed driver supports
  int runtime_version = 0;  // the CUDA runtime this binary was linked with
  // Empty when count > 0; otherwise why none is usable, one line naming the versions found:
  // no device, no driver library, a driver older than the runtime, or the runtime's error.
  std::string problem;
};
// Asks the driver once per call; never throws.
DeviceProbe probe_devices();
// "13.0" for a CUDA version of 13000 (as DeviceProbe encodes it), "none" for 0.
inline std::string version_name(int cuda_version) {
  if (cuda_version == 0) return "none";
  return std::to_string(cuda_version / 1000) + "." + std::to_string(cuda_version % 1000 / 10);
}
// One device's identity and size, as the driver reports them.
struct DeviceInfo {
  std::string name;          // "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;  // compute capability (9.0 for Hopper)
  int multiprocessors = 0;
  int clock_khz = 0;        // the SMs' peak clock
  size_t memory_bytes = 0;  // total device memory
};
// Throws NoDeviceError unless `index` names a usable device.
DeviceInfo device_info(int index);

// The device's dense bf16 tensor-core peak in FLOP/s, the denominator of the CUDA MFU
// (PaLM's MFU uses the hardware peak whatever the precision): multiprocessors x clock_khz
// x the architecture's dense bf16 FLOPs per SM per clock, 2048 for compute capability 8.0
// and 4096 for 9.0. 0 for other architectures, whose rate differs between product lines (a
// GeForce sm_86 runs f32 accumulation at half an RTX A6000's rate) or is not known here.
// clock_khz is the device's reported peak SM clock, which can be above the clock of
// NVIDIA's data-sheet figures: A100 reports the 1410 MHz of its 312 TFLOP/s, but an H100
// SXM reports 1980 MHz where its 989 TFLOP/s assume 1830, so an MFU against this peak reads
// about 8% lower than one against the data sheet.
inline double dense_bf16_peak_flops(const DeviceInfo& d) {
  const int cc = d.major * 10 + d.minor;
  const double per_sm_clock = cc == 80 ? 2048 : cc == 90 ? 4096 : 0;
  return per_sm_clock * d.multiprocessors * d.clock_khz * 1e3;
}

// Number of usable CUDA devices; 0 when built without CUDA or for any reason in
// probe_devices().problem.
int device_count();
// Throws NoDeviceError unless `index` names a usable device; the message starts with
// "no CUDA device" and gives probe_devices().problem, or says "built without CUDA".
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

// Sets every element of `dst` over `shape` to the low itemsize(dst.dtype) bytes of
// `pattern` (the value already converted to dst's dtype) on `device`: queued on the compute
// stream, no host round trip.
void fill(const StridedView& dst, const Shape& shape, uint64_t pattern, int device);

// Blocks until all work on `device` is done.
void synchronize(int device);

// Note [Deferred device checks]
// Kernels that validate their inputs on the device (embedding and index ids, cross-entropy
// targets) do not read a verdict back per call, which would stall the host on every op.
// Each call registers a check (defer_check) and its kernel records the first violation in
// the device's check word, as tag | position with atomicMin, so the earliest check's lowest
// position wins. The next synchronizing read (every device-to-host memcpy, synchronize,
// raise_deferred_errors) throws that check's message, naming the op and the bad value, as
// the CPU would have at the call. The kernels never read or write out of bounds meanwhile
// (they skip bad entries), and the trainer reads each step's loss before its optimizer step,
// so a bad batch fails before any state changes. The record is per device: with several
// host threads on one device (thread ranks sharing a GPU), a thread's read may consume a
// check another thread registered but had not launched yet, so that thread's violation is
// reported without its op's message, or at another thread's read.

// Registers a check on `device` and returns its tag; a violation at `position` (< 2^40) is
// recorded by the kernel as atomicMin(deferred_check_word(device), tag | position).
// `describe(position)` makes the error message when that violation is the first; it may
// read device memory. Registering synchronizes only every 4096 checks (to bound the list).
uint64_t defer_check(int device, std::function<std::string(int64_t position)> describe);
// The device word the kernels of defer_check record into (created on first use).
unsigned long long* deferred_check_word(int device);
// Throws the first violation recorded since the last call, if any, and forgets every
// registered check. Reads 8 bytes (waiting for the device) only when a check is registered.
void raise_deferred_errors(int device);

// Note [Pinned host memory]
// Page-locked host memory (cudaHostAlloc) is what the DMA engines read directly: a copy from
// it to a device can be queued on the compute stream and return at once, where a copy from
// pageable memory first waits for the device to finish all queued work. The trainer puts
// each batch in pinned memory and queues its transfer, so the host never stalls the device
// between micro-batches. A pinned block freed while such a copy may still be queued is kept
// aside until an event recorded at free time completes, then reused by size like device
// blocks (Note [Block cache]).

// The allocator of pinned host memory (created on first use; throws without a device).
Allocator& pinned_host_allocator();
// True when `ptr` points into a block of pinned_host_allocator().
bool is_pinned(const void* ptr);
// Queues a copy of `nbytes` from pinned host memory to `device` on its compute stream and
// returns before it runs. The source must not be written until the device has done it;
// freeing it is safe (Note [Pinned host memory]).
void memcpy_from_pinned_async(void* dst, const void* pinned_src, size_t nbytes, int device);
// Queues a copy of `nbytes` from `device`'s memory into pinned host memory on its compute
// stream and returns before it runs: read the destination only once an Event recorded after
// it is done (NVMe-free GPU offload: Note [Offload on a GPU] in parallel/zero/zero_optimizer.h).
void memcpy_to_pinned_async(void* pinned_dst, const void* src, size_t nbytes, int device);

// A CUDA event on a device's compute stream: marks a point in the queued work, for timing
// device work and for waiting on part of it.
class Event {
 public:
  explicit Event(int device);  // throws without such a device
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Marks the current end of the device's compute stream.
  void record();
  // True when the work queued before record() has finished (or record() was never called).
  bool done() const;
  // Blocks until the work queued before record() has finished.
  void synchronize() const;
  // Milliseconds of device time between two recorded events of one device.
  static double elapsed_ms(const Event& start, const Event& end);

 private:
  void* event_ = nullptr;  // cudaEvent_t
  int device_;
};

}  // namespace tessera::cuda
