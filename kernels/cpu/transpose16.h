// An in-register 16 x 16 transpose of 32-bit lanes, shared by the packing loops of the f32
// and bf16 GEMMs (kernels/cpu/sgemm.cc, kernels/cpu/bf16_pack.cc).
#pragma once

#if defined(__AVX512F__)

#include <immintrin.h>

namespace tessera::kernels::cpu {

// Transposes the 16 x 16 block held in rows r[0..15] in place. Always inlined: as a call,
// GCC passed the 16 rows through memory.
__attribute__((always_inline)) inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // interleave pairs of rows: 2 x 2 blocks
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks within each 128-bit lane
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 16; i += 8) {  // 128-bit lanes across rows i.. and i+4..
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {  // and across rows j and j+8
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

}  // namespace tessera::kernels::cpu

#endif  // __AVX512F__
