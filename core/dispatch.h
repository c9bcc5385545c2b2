// Calls a generic lambda with the C++ type of a runtime DType.
//
//   dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
//     using T = typename decltype(tag)::type;
//     ...
//   });
#pragma once

#include "core/dtype.h"
#include "core/error.h"

namespace tessera {

template <class T>
struct TypeTag {
  using type = T;
};

// Any of the eight dtypes.
template <class F>
decltype(auto) dispatch_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(TypeTag<float>{});
    case DType::f16:
      return f(TypeTag<Half>{});
    case DType::bf16:
      return f(TypeTag<BFloat16>{});
    case DType::f64:
      return f(TypeTag<double>{});
    case DType::i32:
      return f(TypeTag<int32_t>{});
    case DType::i64:
      return f(TypeTag<int64_t>{});
    case DType::u8:
      return f(TypeTag<uint8_t>{});
    case DType::boolean:
      return f(TypeTag<bool>{});
  }
  TS_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(dtype));
}

// The dtypes CPU math kernels compute in: f32 (training) and f64 (gradcheck).
template <class F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(TypeTag<float>{});
    case DType::f64:
      return f(TypeTag<double>{});
    default:
      TS_FAIL("[", op, "] expected dtype f32 or f64, found ", dtype_name(dtype));
  }
}

// The floating dtypes of CPU loops that convert f16 and bf16 to f32 as they go (Note
// [16-bit math on the CPU] in kernels/cpu/widen.h): f32, f64, f16 and bf16.
template <class F>
decltype(auto) dispatch_floating_and_half(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(TypeTag<float>{});
    case DType::f64:
      return f(TypeTag<double>{});
    case DType::f16:
      return f(TypeTag<Half>{});
    case DType::bf16:
      return f(TypeTag<BFloat16>{});
    default:
      TS_FAIL("[", op, "] expected dtype f32, f64, f16 or bf16, found ", dtype_name(dtype));
  }
}

// Integer index dtypes: i32 and i64.
template <class F>
decltype(auto) dispatch_index(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::i32:
      return f(TypeTag<int32_t>{});
    case DType::i64:
      return f(TypeTag<int64_t>{});
    default:
      TS_FAIL("[", op, "] expected index dtype i32 or i64, found ", dtype_name(dtype));
  }
}

}  // namespace tessera
