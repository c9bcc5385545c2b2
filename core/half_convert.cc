#include "core/half_convert.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tessera {

#if defined(__AVX512F__)
namespace {

constexpr int kLanes = 16;

// Lanes of u (f32 bits) that hold a NaN.
__mmask16 nan_lanes(__m512i u) {
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
}

// BFloat16::from_float on 16 lanes: round to nearest even on the bits, NaN quieted.
__m256i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  r = _mm512_srli_epi32(r, 16);
  const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan_lanes(u), r, nan));
}

// Half::from_float on 16 lanes: the hardware conversion rounds to nearest even as the
// scalar one does (subnormals included); NaN lanes take the scalar's sign | 0x7e00.
__m256i f16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i r =
      _mm512_cvtepu16_epi32(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m512i nan =
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                      _mm512_set1_epi32(0x7e00));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan_lanes(u), r, nan));
}

// Half::to_float on 16 lanes: the hardware widening is exact, but it quiets a signaling
// NaN; the scalar keeps the payload as it is, so NaN lanes are rebuilt from the bits.
__m512 f16_values(__m256i h) {
  const __m512i bits = _mm512_cvtepu16_epi32(h);
  const __m512 wide = _mm512_cvtph_ps(h);
  const __m512i exp_all_ones = _mm512_set1_epi32(0x7c00);
  const __mmask16 nan =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exp_all_ones), exp_all_ones) &
      _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x03ff));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x8000)), 16);
  const __m512i mant = _mm512_slli_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x03ff)), 13);
  const __m512i nan_bits =
      _mm512_or_si512(_mm512_or_si512(sign, _mm512_set1_epi32(0x7f800000)), mant);
  return _mm512_mask_blend_ps(nan, wide, _mm512_castsi512_ps(nan_bits));
}

}  // namespace
#endif

void f32_to_bf16(const float* src, BFloat16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), bf16_bits(_mm512_loadu_ps(src + i)));
  }
#endif
  for (; i < n; ++i) dst[i] = BFloat16(src[i]);
}

void f32_to_f16(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), f16_bits(_mm512_loadu_ps(src + i)));
  }
#endif
  for (; i < n; ++i) dst[i] = Half(src[i]);
}

void bf16_to_f32(const BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + kLanes <= n; i += kLanes) {
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

void f16_to_f32(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(dst + i,
                     f16_values(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

}  // namespace tessera
