#include "core/dtype.h"

#include "core/error.h"

namespace tessera {

size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::boolean:
      return 1;
  }
  TS_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::boolean:
      return "bool";
  }
  TS_INTERNAL_ASSERT(false, "unknown dtype ", static_cast<int>(dtype));
}

DType parse_dtype(std::string_view name) {
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64,
                  DType::u8, DType::boolean}) {
    if (dtype_name(d) == name) return d;
  }
  TS_FAIL("[dtype] expected one of f32, f16, bf16, f64, i32, i64, u8, bool; found \"", name, "\"");
}

bool is_half(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::f64;
}

}  // namespace tessera
