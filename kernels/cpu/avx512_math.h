// f32 exp and GELU on 16-lane AVX-512 vectors, and the loop that writes their results, for
// the memory-bound kernels (layer_norm.cc, softmax.cc, elementwise.cc).
//
// Note [Memory-bound kernels]
// layer_norm, softmax and GELU forward read each input byte from memory once and write
// each output byte once, so tools/bench/cpu_kernels_bench compares them with a memcpy of
// the same tensor into the same block. Three things decide whether they keep up:
//  - Arithmetic: Eigen's packet exp and logistic, written for every ISA, cost GELU about
//    15 GB/s even in L1, slower than memory at 2 threads. Note [Vector exp] below is about
//    twice as fast.
//  - Overlap: a row kernel that reads a row (mean, max) and then computes and writes it
//    leaves memory idle in between. layer_norm and softmax read the next row's first pass
//    in the loop that writes this row's output; GELU, whose loads each feed a long chain of
//    arithmetic, prefetches its input kPrefetchFloats ahead.
//  - Stores: non-temporal stores (vmovntps) skip the read-for-ownership of each output
//    line and measured 1.0-1.1x memcpy with all operands out of the caches, but half the
//    speed of ordinary stores when the operands sat in this host's L3 (hundreds of MB,
//    where tensors of this size stay between ops), so the kernels use ordinary stores.
//
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

namespace tessera::kernels::cpu {

// How far ahead (in floats) GELU and softmax prefetch their operands: 4 KiB, 64 lines.
inline constexpr int64_t kPrefetchFloats = 1024;

// The mask of the first `n` lanes, n >= 0 (all 16 from 16 up).
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// out[0, n) = the lanes produce(i, mask) returns for elements [i, i + 16) under `mask`
// (the lanes inside [0, n)); produce loads its inputs with that mask.
template <class Produce>
inline void for_each_vector(float* out, int64_t n, Produce&& produce) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, produce(i, __mmask16(0xffff)));
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    _mm512_mask_storeu_ps(out + i, m, produce(i, m));
  }
}

// Note [Vector exp]
// exp(x) reduces x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 split in two
// parts, so that n ln2_hi is exact), takes e^r from the degree-6 minimax polynomial of
// Cephes' expf (Moshier, Cephes Math Library, expf.c; about 1 ulp on that range) and
// scales by 2^n with vscalefps, which itself gives +inf past the f32 range and denormals
// or 0 below it. x is clamped to [-110, 100] first, beyond which the result is 0 or +inf
// already, so exp(-inf) is exactly 0 and the reduction never sees an infinity. The clamps
// keep NaN: vminps and vmaxps return their second operand when either is NaN, and x is
// passed second. The kernels' tests compare against f64 (softmax within 4e-6 relative,
// GELU within 2e-6).
//
// e^x per lane (Note [Vector exp]).
inline __m512 exp_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(100.0f), x);
  x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, with ln2 split in two so that n * ln2_hi is exact.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// GELU's tanh approximation per lane, written as x * sigmoid(2u) = x / (1 + e^(-2u)) with
// u = sqrt(2/pi) (x + 0.044715 x^3), the same function as elementwise.cc's Eigen form, with
// its limits: x for large x (e^(-2u) is 0) and -0 for very negative x (e^(-2u) is +inf).
inline __m512 gelu_tanh_avx512(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 minus_2u = _mm512_mul_ps(_mm512_set1_ps(-2 * 0.7978845608028654f),
                                        _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_avx512(minus_2u)));
}

}  // namespace tessera::kernels::cpu

#endif  // __AVX512F__
