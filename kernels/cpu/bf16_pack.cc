#include "kernels/cpu/bf16_pack.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "kernels/cpu/transpose16.h"

namespace tessera::kernels::cpu::bf16 {
namespace {

constexpr int kLanes = 16;

Word make_word(BFloat16 first, BFloat16 second) {
  return Word{first.bits} | (Word{second.bits} << 16);
}

void* aligned_bytes(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

// The 16 bf16 at `lo` and the 16 at `hi` interleaved: word j = (lo[j], hi[j]).
__m512i interleave16(const BFloat16* lo, const BFloat16* hi) {
  const __m512i both = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, both);
}

// The 16 bf16 at `lo` paired with zeros: the last pair of an odd k.
__m512i with_zeros16(const BFloat16* lo) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo)));
}

// The 8 bf16 at `lo` and the 8 at `hi` interleaved: word j = (lo[j], hi[j]).
__m256i interleave8(const BFloat16* lo, const BFloat16* hi) {
  const __m256i both = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
  const __m256i order = _mm256_set_epi16(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  return _mm256_permutexvar_epi16(order, both);
}

// Element (r, c) of m, or zero outside (rows, cols).
BFloat16 at_or_zero(Bf16Matrix m, int64_t r, int64_t c, int64_t rows, int64_t cols) {
  return r < rows && c < cols ? m.data[r * m.row_stride + c * m.col_stride] : BFloat16();
}

}  // namespace

AlignedWords aligned_words(int64_t count) {
  return AlignedWords(static_cast<Word*>(aligned_bytes(static_cast<size_t>(count) * sizeof(Word))));
}

AlignedBf16 aligned_bf16(int64_t count) {
  return AlignedBf16(
      static_cast<BFloat16*>(aligned_bytes(static_cast<size_t>(count) * sizeof(BFloat16))));
}

void pack_b(Bf16Matrix b, int64_t k, int64_t n, int64_t pairs_stride, Word* dst) {
  constexpr int kVectors = kPanelCols / kLanes;
  const int64_t pairs = (k + 1) / 2;
  const int64_t full_pairs = k / 2;
  for (int64_t j0 = 0; j0 < n; j0 += kPanelCols, dst += pairs_stride * kPanelCols) {
    const int64_t cols = std::min<int64_t>(kPanelCols, n - j0);
    const Bf16Matrix src{b.data + j0 * b.col_stride, b.row_stride, b.col_stride};
    int64_t p = 0;
    if (cols == kPanelCols && b.col_stride == 1) {  // rows contiguous along n: interleave two
      for (; p < full_pairs; ++p) {
        const BFloat16* r0 = src.data + 2 * p * b.row_stride;
        for (int v = 0; v < kVectors; ++v) {
          _mm512_store_si512(dst + p * kPanelCols + v * kLanes,
                             interleave16(r0 + v * kLanes, r0 + b.row_stride + v * kLanes));
        }
      }
      if (p < pairs) {
        for (int v = 0; v < kVectors; ++v) {
          _mm512_store_si512(dst + p * kPanelCols + v * kLanes,
                             with_zeros16(src.data + 2 * p * b.row_stride + v * kLanes));
        }
        ++p;
      }
    } else if (cols == kPanelCols && b.row_stride == 1) {  // columns along k: words are pairs
      // 16 columns by 16 pairs at a time, a 16 x 16 transpose of 32-bit words.
      const int64_t p16 = full_pairs / kLanes * kLanes;
      for (int v = 0; v < kVectors; ++v) {
        for (int64_t p0 = 0; p0 < p16; p0 += kLanes) {
          __m512 r[kLanes];
          for (int j = 0; j < kLanes; ++j) {
            r[j] = _mm512_loadu_ps(reinterpret_cast<const float*>(
                src.data + (v * kLanes + j) * b.col_stride + 2 * p0));
          }
          transpose16(r);
          for (int q = 0; q < kLanes; ++q) {
            _mm512_store_ps(reinterpret_cast<float*>(dst + (p0 + q) * kPanelCols + v * kLanes),
                            r[q]);
          }
        }
      }
      p = p16;
    }
    for (; p < pairs; ++p) {
      Word* d = dst + p * kPanelCols;
      for (int64_t j = 0; j < kPanelCols; ++j) {
        d[j] =
            make_word(at_or_zero(src, 2 * p, j, k, cols), at_or_zero(src, 2 * p + 1, j, k, cols));
      }
    }
    std::fill(dst + pairs * kPanelCols, dst + pairs_stride * kPanelCols, Word{0});
  }
}

void pack_a_pairs(Bf16Matrix a, int64_t m, int64_t k, int rows, Word* dst) {
  const int64_t pairs = (k + 1) / 2;
  const int64_t full_pairs = k / 2;
  for (int64_t i0 = 0; i0 < m; i0 += rows, dst += pairs * rows) {
    const int64_t valid = std::min<int64_t>(rows, m - i0);
    const Bf16Matrix src{a.data + i0 * a.row_stride, a.row_stride, a.col_stride};
    int64_t p = 0;
    if (valid == rows && a.row_stride == 1) {  // columns contiguous along m (dY^T): interleave
      for (; p < full_pairs; ++p) {
        const BFloat16* c0 = src.data + 2 * p * a.col_stride;
        if (rows == 16) {
          _mm512_store_si512(dst + p * rows, interleave16(c0, c0 + a.col_stride));
        } else {
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + p * rows),
                             interleave8(c0, c0 + a.col_stride));
        }
      }
    }
    for (; p < pairs; ++p) {
      Word* d = dst + p * rows;
      for (int64_t i = 0; i < rows; ++i) {
        d[i] =
            make_word(at_or_zero(src, i, 2 * p, valid, k), at_or_zero(src, i, 2 * p + 1, valid, k));
      }
    }
  }
}

void pack_a_rows(Bf16Matrix a, int64_t m, int64_t k, int64_t k_pad, BFloat16* dst) {
  const int64_t m_pad = round_up(m, 2 * kLanes);
  const int64_t full_pairs = k / 2;
  int64_t i0 = 0;
  if (a.row_stride == 1) {  // columns contiguous along m (dY^T): pairs, then transposed
    // 16 rows by 16 pairs: interleave 16 values of rows 2p and 2p+1 of the source (its
    // columns) into the rows' pairs, then transpose the 16 x 16 words into 16 rows.
    const int64_t p16 = full_pairs / kLanes * kLanes;
    for (; i0 + kLanes <= m; i0 += kLanes) {
      const BFloat16* src = a.data + i0;
      for (int64_t p0 = 0; p0 < p16; p0 += kLanes) {
        __m512 r[kLanes];
        for (int q = 0; q < kLanes; ++q) {
          const BFloat16* c0 = src + 2 * (p0 + q) * a.col_stride;
          r[q] = _mm512_castsi512_ps(interleave16(c0, c0 + a.col_stride));
        }
        transpose16(r);  // r[i]: row i0 + i, pairs p0..p0 + 15
        for (int i = 0; i < kLanes; ++i) {
          _mm512_storeu_ps(reinterpret_cast<float*>(dst + (i0 + i) * k_pad + 2 * p0), r[i]);
        }
      }
      for (int64_t i = i0; i < i0 + kLanes; ++i) {
        for (int64_t c = 2 * p16; c < k_pad; ++c) dst[i * k_pad + c] = at_or_zero(a, i, c, m, k);
      }
    }
  } else if (a.col_stride == 1) {  // rows contiguous along k: copy them
    for (; i0 < m; ++i0) {
      std::memcpy(dst + i0 * k_pad, a.data + i0 * a.row_stride, k * sizeof(BFloat16));
      std::fill(dst + i0 * k_pad + k, dst + (i0 + 1) * k_pad, BFloat16());
    }
  }
  for (int64_t i = i0; i < m_pad; ++i) {
    for (int64_t c = 0; c < k_pad; ++c) dst[i * k_pad + c] = at_or_zero(a, i, c, m, k);
  }
}

}  // namespace tessera::kernels::cpu::bf16

#endif  // __AVX512BF16__ && __AVX512BW__
