// core/cuda_runtime.h for builds without the CUDA toolkit: every device call throws.
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace tessera::cuda {
namespace {
constexpr const char* kBuiltWithout =
    "Tessera was built without CUDA (nvcc was not found, or --config=cpu was given)";

[[noreturn]] void built_without_cuda(const char* what) {
  TS_FAIL("[cuda] ", what, ": ", kBuiltWithout, "; rebuild on a machine with the CUDA toolkit");
}
}  // namespace

bool is_built() { return false; }
DeviceProbe probe_devices() { return DeviceProbe{.problem = kBuiltWithout}; }
int device_count() { return 0; }
void check_device(int) {
  throw NoDeviceError(str_cat("[cuda] no CUDA device: ", kBuiltWithout,
                              "; rebuild on a machine with the CUDA toolkit"));
}
DeviceInfo device_info(int index) {
  check_device(index);
  return {};
}
Allocator& allocator(int) { built_without_cuda("cannot allocate device memory"); }
void memcpy(void*, const void*, size_t, CopyKind, int) { built_without_cuda("cannot copy"); }
void copy_strided(const StridedView&, const StridedView&, const Shape&, int) {
  built_without_cuda("cannot copy");
}
void fill(const StridedView&, const Shape&, uint64_t, int) { built_without_cuda("cannot fill"); }
uint64_t defer_check(int, std::function<std::string(int64_t)>) {
  built_without_cuda("cannot check on a device");
}
unsigned long long* deferred_check_word(int) { built_without_cuda("cannot check on a device"); }
void raise_deferred_errors(int) {}  // nothing can be pending
void synchronize(int) { built_without_cuda("cannot synchronize"); }
Allocator& pinned_host_allocator() { built_without_cuda("cannot pin host memory"); }
bool is_pinned(const void*) { return false; }
void memcpy_from_pinned_async(void*, const void*, size_t, int) {
  built_without_cuda("cannot copy");
}
void memcpy_to_pinned_async(void*, const void*, size_t, int) { built_without_cuda("cannot copy"); }

Event::Event(int device) : device_(device) { built_without_cuda("cannot create an event"); }
Event::~Event() = default;
void Event::record() { built_without_cuda("cannot record an event"); }
bool Event::done() const { return true; }
void Event::synchronize() const {}
double Event::elapsed_ms(const Event&, const Event&) { built_without_cuda("cannot time events"); }

}  // namespace tessera::cuda
