// 16-bit floating-point storage types: IEEE half (f16) and bfloat16 (bf16).
//
// They are storage formats: arithmetic converts to float. Conversions round to nearest
// even, as the hardware and PyTorch do, and keep NaN a NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace tessera {

// Note [Rounding once to 16 bits]
// A double rounded to float and then to a 16-bit type can round twice: a value just above a
// 16-bit tie becomes the tie in float, which then rounds to even (down). Rounding the double
// to float *to odd* (truncate, then set the last bit when anything was dropped) keeps the
// dropped bits' trace in a bit that the 16-bit rounding sees, so double -> odd float -> f16
// or bf16 (round to nearest even) is the correctly rounded result; float has 13 or more bits
// beyond either 16-bit mantissa (Boldo and Melquiond, "Emulation of FMA and correctly rounded
// sums: proved algorithms using rounding to odd", IEEE TC 2008). The CUDA copy kernel does
// the same (core/cuda/copy_kernel.cu).
inline float round_to_odd_float(double d) {
  const float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || d != d) return f;  // exact, or NaN
  uint32_t u = std::bit_cast<uint32_t>(f);
  // Round to nearest went away from zero: one step back (|f| > 0 here, and inf steps back to
  // the largest float, which is odd).
  if ((static_cast<double>(f) < 0 ? -static_cast<double>(f) : static_cast<double>(f)) >
      (d < 0 ? -d : d)) {
    u -= 1;
  }
  return std::bit_cast<float>(u | 1u);
}

struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return std::bit_cast<float>(uint32_t{bits} << 16); }

  static uint16_t from_float(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>(u >> 16);
  }
};

struct Half {
  uint16_t bits = 0;

  Half() = default;
  explicit Half(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

inline uint16_t Half::from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in half: add 0.5 so the float adder rounds to nearest even.
    const float shifted = std::bit_cast<float>(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
  }
  const uint32_t mant_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exponent, round to even
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

inline float Half::to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf/NaN
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -mag : mag;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace tessera
