// Element types of tensors and the mapping between DType values and C++ types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/half.h"

namespace tessera {

enum class DType : uint8_t { f32, f16, bf16, f64, i32, i64, u8, boolean };

// Size of one element in bytes.
size_t itemsize(DType dtype);
// Short name used in messages and files: "f32", "bf16", "bool", ...
std::string_view dtype_name(DType dtype);
// Parses a short name; throws naming the accepted names.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);
// f16 or bf16: the 16-bit floating formats (storage formats; arithmetic widens to float).
bool is_half(DType dtype);

// C++ type of each DType (bool is stored as one byte).
template <DType D>
struct CppTypeOf;
template <>
struct CppTypeOf<DType::f32> {
  using type = float;
};
template <>
struct CppTypeOf<DType::f16> {
  using type = Half;
};
template <>
struct CppTypeOf<DType::bf16> {
  using type = BFloat16;
};
template <>
struct CppTypeOf<DType::f64> {
  using type = double;
};
template <>
struct CppTypeOf<DType::i32> {
  using type = int32_t;
};
template <>
struct CppTypeOf<DType::i64> {
  using type = int64_t;
};
template <>
struct CppTypeOf<DType::u8> {
  using type = uint8_t;
};
template <>
struct CppTypeOf<DType::boolean> {
  using type = bool;
};

// Whether T is one of the 16-bit floating types (is_half's C++ side).
template <class T>
inline constexpr bool kIsHalf = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// DType of a C++ type; compile error for unsupported types.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

// Converts between element types, rounding once: 16-bit results are correctly rounded from
// any source (Note [Rounding once to 16 bits]); floating values become integers by
// truncation to int64, then wrap to the integer's width (as PyTorch's CPU casts, and
// defined where a direct cast out of range is not). The 64-bit integers above 2^53 are not
// used as values. core/cuda/copy_kernel.cu converts the same way on the device.
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    if constexpr (std::is_same_v<From, double> || std::is_same_v<From, int32_t> ||
                  std::is_same_v<From, int64_t>) {
      return To(round_to_odd_float(static_cast<double>(v)));  // float cannot hold them all
    } else {
      return To(static_cast<float>(v));  // exact in float
    }
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From{};
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return static_cast<To>(static_cast<int64_t>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace tessera
