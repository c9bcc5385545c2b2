// Tensor::copy_ and Tensor::fill_: memory movement between any layouts, dtypes and
// devices. The one place where elements are converted between dtypes.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/cuda_runtime.h"
#include "core/dispatch.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/half_convert.h"
#include "core/strided_loop.h"
#include "core/tensor.h"

namespace tessera {
namespace {

// Whether S converts to D in bulk (core/half_convert.h): f32 to or from a 16-bit format.
template <class D, class S>
constexpr bool kBulkPair = (std::is_same_v<S, float> && kIsHalf<D>) ||
                           (kIsHalf<S> && std::is_same_v<D, float>);

// Converts n contiguous S values at s into D values at d; kBulkPair<D, S>.
template <class D, class S>
void convert_run(D* d, const S* s, int64_t n) {
  if constexpr (std::is_same_v<D, BFloat16>) {
    f32_to_bf16(s, d, n);
  } else if constexpr (std::is_same_v<D, Half>) {
    f32_to_f16(s, d, n);
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    bf16_to_f32(s, d, n);
  } else {
    static_assert(std::is_same_v<S, Half>);
    f16_to_f32(s, d, n);
  }
}

void copy_cpu(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    char* d = static_cast<char*>(dst.raw_data());
    const char* s = static_cast<const char*>(src.raw_data());
    const int64_t bytes = static_cast<int64_t>(dst.nbytes());
    parallel_for(bytes, 1 << 20, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, e - b); });
    return;
  }
  const LoopPlan<2> plan =
      plan_loop<2>(dst.shape(), {dst.strides(), src.strides()},
                   {static_cast<int64_t>(dst.itemsize()), static_cast<int64_t>(src.itemsize())});
  dispatch_all(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch_all(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      for_each_span<2>(
          plan, {static_cast<char*>(dst.raw_data()), static_cast<char*>(src.raw_data())},
          [](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>& st) {
            char* d = p[0];
            const char* s = p[1];
            // A run contiguous on both sides (all of a contiguous tensor, a row of a
            // transposed or narrowed view) converts in bulk between f32 and 16 bits.
            if constexpr (kBulkPair<D, S>) {
              if (st[0] == sizeof(D) && st[1] == sizeof(S)) {
                convert_run(reinterpret_cast<D*>(d), reinterpret_cast<const S*>(s), n);
                return;
              }
            }
            for (int64_t i = 0; i < n; ++i) {
              *reinterpret_cast<D*>(d + i * st[0]) =
                  convert<D>(*reinterpret_cast<const S*>(s + i * st[1]));
            }
          });
    });
  });
}

void copy_with_cuda(const Tensor& dst, const Tensor& src) {
  const bool same_layout = dst.dtype() == src.dtype() && dst.is_contiguous() &&
                           src.is_contiguous() && dst.shape() == src.shape();
  if (dst.device().is_cuda() && src.device().is_cuda()) {
    TS_CHECK(dst.device() == src.device(), "[copy_] copies between two CUDA devices go through ",
             "the host: expected one device, found ", dst.device(), " and ", src.device());
    cuda::copy_strided({dst.raw_data(), dst.dtype(), dst.strides()},
                       {src.raw_data(), src.dtype(), src.strides()}, dst.shape(),
                       dst.device().index);
    return;
  }
  if (same_layout) {
    const bool to_device = dst.device().is_cuda();
    cuda::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes(),
                 to_device ? cuda::CopyKind::host_to_device : cuda::CopyKind::device_to_host,
                 (to_device ? dst : src).device().index);
    return;
  }
  // Different layouts across the host/device boundary: convert on the source side into a
  // contiguous staging tensor of dst's dtype, move the bytes, then scatter on dst's side.
  Tensor staged = make_tensor(dst.shape(), dst.dtype(), src.device());
  staged.copy_(src);
  Tensor moved = make_tensor(dst.shape(), dst.dtype(), dst.device());
  moved.copy_(staged);
  dst.copy_(moved);
}

// Every element of `dst` has its own memory location (no expanded dim), so writing it
// element by element is well defined.
void check_writable_destination(const char* op, const Tensor& dst) {
  for (int64_t d = 0; d < dst.dim(); ++d) {
    TS_CHECK(dst.strides()[d] != 0 || dst.shape()[d] <= 1, "[", op, "] destination ",
             shape_str(dst.shape()), " with strides ", shape_str(dst.strides()),
             " is expanded: several elements share one memory location");
  }
}

}  // namespace

const Tensor& Tensor::copy_(const Tensor& src) const {
  TS_CHECK(src.defined(), "[copy_] expected a defined source tensor, found an undefined one");
  check_writable_destination("copy_", *this);
  const Shape& want = shape();
  Shape b = broadcast_shapes(want, src.shape(), "copy_");
  TS_CHECK(b == want, "[copy_] source shape ", shape_str(src.shape()),
           " does not broadcast to destination shape ", shape_str(want));
  Tensor s = src.detach();
  if (s.shape() != want) {
    NoGradGuard no_grad;
    s = s.expand(want);
  }
  if (numel() == 0) return *this;
  if (device().is_cpu() && s.device().is_cpu()) {
    copy_cpu(*this, s);
  } else {
    copy_with_cuda(*this, s);
  }
  return *this;
}

const Tensor& Tensor::copy_queued_(const Tensor& src, const Tensor& staging) const {
  TS_CHECK(device().is_cuda() && is_contiguous() && src.defined() && src.device().is_cpu(),
           "[copy_queued_] expected a CPU source and a contiguous CUDA destination, found ",
           src.str(), " into ", str());
  TS_CHECK(staging.is_pinned() && staging.is_contiguous() && staging.nbytes() >= nbytes(),
           "[copy_queued_] expected staging of at least ", nbytes(),
           " bytes in pinned host memory, found ", staging.str(),
           staging.is_pinned() ? "" : " in pageable memory");
  if (numel() == 0) return *this;
  const Tensor converted = from_blob(staging.raw_data(), shape(), dtype());
  converted.copy_(src);
  cuda::memcpy_from_pinned_async(raw_data(), converted.raw_data(), nbytes(), device().index);
  return *this;
}

Tensor Tensor::pin_memory() const {
  TS_CHECK(device().is_cpu(), "[pin_memory] expected a CPU tensor, found one on ", device());
  if (is_contiguous() && is_pinned()) return *this;
  Allocator& pinned = cuda::pinned_host_allocator();
  const size_t bytes = static_cast<size_t>(numel()) * itemsize();
  void* block = pinned.allocate(bytes);
  Tensor out = from_blob(block, shape(), dtype(), Device::cpu(),
                         [&pinned, bytes](void* p) { pinned.deallocate(p, bytes); });
  out.copy_(*this);
  return out;
}

bool Tensor::is_pinned() const {
  return device().is_cpu() && numel() > 0 && cuda::is_pinned(raw_data());
}

const Tensor& Tensor::fill_(double value) const {
  if (numel() == 0) return *this;
  check_writable_destination("fill_", *this);
  if (device().is_cuda()) {
    // The value converted once on the host, as copy_ from an f64 scalar converts it, then
    // written on the device: no host round trip per fill (zero_grad, zeros()).
    uint64_t pattern = 0;
    dispatch_all(dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T converted = convert<T>(value);
      std::memcpy(&pattern, &converted, sizeof(T));
    });
    cuda::fill({raw_data(), dtype(), strides()}, shape(), pattern, device().index);
    return *this;
  }
  if (is_contiguous()) {
    // The value converted once, then stored in parallel runs (zeros(), zero_grad and the
    // gradient buffers fill large tensors).
    dispatch_all(dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* p = data_ptr<T>();
      const T converted = convert<T>(value);
      parallel_for(numel(), 1 << 18,
                   [&](int64_t b, int64_t e) { std::fill(p + b, p + e, converted); });
    });
    return *this;
  }
  // A one-element source broadcast over this view reuses copy_'s loops.
  Tensor one = make_tensor({}, DType::f64, Device::cpu());
  *one.data_ptr<double>() = value;
  return copy_(one);
}

}  // namespace tessera
