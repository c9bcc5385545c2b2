#include "kernels/cpu/signs.h"

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kGrainBytes = 1 << 14;

}  // namespace

Tensor pack_signs(const Tensor& x) {
  if (is_half(x.dtype())) return cpu::pack_signs(widened(x));  // widening keeps every sign
  const int64_t n = x.numel();
  const int64_t bytes = (n + 7) / 8;
  Tensor out = empty({bytes}, {DType::u8});
  uint8_t* po = out.data_ptr<uint8_t>();
  dispatch_floating(x.dtype(), "pack_signs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    parallel_for(bytes, kGrainBytes, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        uint8_t byte = 0;
        const int64_t first = b * 8;
        for (int64_t k = 0; k < 8; ++k) {
          const int64_t i = first + k;
          // Not negative (0, -0 and nan included) is bit 1, first element the top bit.
          const bool bit = i < n && !(static_cast<float>(px[i]) < 0.0f);
          byte = static_cast<uint8_t>(byte | (bit ? 0x80u >> k : 0u));
        }
        po[b] = byte;
      }
    });
  });
  return out;
}

Tensor unpack_signs(const Tensor& bits, int64_t n, DType dtype) {
  if (is_half(dtype)) return narrowed(cpu::unpack_signs(bits, n, DType::f32), dtype);
  Tensor out = empty({n}, {dtype});
  const uint8_t* pb = bits.data_ptr<uint8_t>();
  dispatch_floating(dtype, "unpack_signs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.data_ptr<T>();
    parallel_for(n, 8 * kGrainBytes, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        po[i] = static_cast<T>((pb[i / 8] >> (7 - i % 8)) & 1 ? 1.0f : -1.0f);
      }
    });
  });
  return out;
}

}  // namespace tessera::kernels::cpu
