// Products of small f32 blocks (up to 64 output columns) with a k range per group of rows,
// for the causal attention's 64 x 64 blocks (kernels/cpu/attention.cc).
//
// Note [Small block products]
// At T = 64 a head's products are 64 x 64 x 64, where Eigen's GEMM packs both operands on
// every call and multiplies the masked triangle of diagonal blocks too. Here the output is
// walked in groups of kSmallRows rows, each held in registers as up to four 16-lane
// vectors per row while k runs: one broadcast of A per row and k, one load per vector of
// B's row k, and no packing. A is read through two strides, so a transposed operand (P^T,
// dS^T) needs no copy; B's rows must be unit-strided. Causal structure is skipped rather
// than multiplied by zero: the caller gives each row group its k range and its column
// count, so a diagonal block does about 55-60% of the full block's work.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tessera::kernels::cpu {

// Whether this build has the block products: they need AVX-512F at compile time.
#if defined(__AVX512F__)
inline constexpr bool kHaveSmallGemm = true;
#else
inline constexpr bool kHaveSmallGemm = false;
#endif

inline constexpr int kSmallRows = 4;       // rows per group
inline constexpr int64_t kSmallCols = 64;  // most output columns

// An f32 operand: element (r, c) at data[r * row_stride + c * col_stride].
struct SmallOperand {
  const float* data;
  int64_t row_stride;
  int64_t col_stride;
};

#if defined(__AVX512F__)
namespace small_gemm_detail {

// c rows [0, R), the first `cols` columns (Nv vectors, the last one masked to cols) =
// alpha * sum over k in [k0, k1) of a(i, k) b(k, :), added to c when accumulate.
template <int R, int Nv>
inline void row_group(SmallOperand a, const float* b, int64_t ldb, float* c, int64_t ldc,
                      int64_t k0, int64_t k1, int64_t cols, float alpha, bool accumulate) {
  const auto last = static_cast<__mmask16>((1u << (cols - 16 * (Nv - 1))) - 1);
  __m512 acc[R][Nv];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (int64_t k = k0; k < k1; ++k) {
    const float* bk = b + k * ldb;
    __m512 bv[Nv];
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) {
      // The last vector is loaded masked: B's last row may end where its memory does.
      bv[v] = v == Nv - 1 ? _mm512_maskz_loadu_ps(last, bk + 16 * v) : _mm512_loadu_ps(bk + 16 * v);
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const __m512 ai = _mm512_set1_ps(a.data[i * a.row_stride + k * a.col_stride]);
#pragma GCC unroll 4
      for (int v = 0; v < Nv; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) {
      const __mmask16 mask = v == Nv - 1 ? last : static_cast<__mmask16>(0xffff);
      float* cv = c + i * ldc + 16 * v;
      __m512 out = _mm512_mul_ps(acc[i][v], scale);
      if (accumulate) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, cv));
      _mm512_mask_storeu_ps(cv, mask, out);
    }
  }
}

template <int R>
inline void row_group(SmallOperand a, const float* b, int64_t ldb, float* c, int64_t ldc,
                      int64_t k0, int64_t k1, int64_t cols, float alpha, bool accumulate) {
  switch ((cols + 15) / 16) {
    case 1:
      return row_group<R, 1>(a, b, ldb, c, ldc, k0, k1, cols, alpha, accumulate);
    case 2:
      return row_group<R, 2>(a, b, ldb, c, ldc, k0, k1, cols, alpha, accumulate);
    case 3:
      return row_group<R, 3>(a, b, ldb, c, ldc, k0, k1, cols, alpha, accumulate);
    default:
      return row_group<R, 4>(a, b, ldb, c, ldc, k0, k1, cols, alpha, accumulate);
  }
}

}  // namespace small_gemm_detail

// c (m, <= kSmallCols), row-major with leading dimension ldc, = alpha * a b, or += when
// accumulate, group by group: rows [i, i + kSmallRows) (fewer at the end) take k in
// k_range(i, rows) -> pair [k0, k1) and write the first cols(i, rows) columns (1 to
// kSmallCols); b is (k, n) with unit-strided rows ldb apart. Columns past a group's count
// are not written; an empty k range writes zeros (adds nothing, when accumulating).
template <class KRange, class Cols>
void small_gemm(SmallOperand a, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
                float alpha, bool accumulate, const KRange& k_range, const Cols& cols) {
  using small_gemm_detail::row_group;
  for (int64_t i = 0; i < m; i += kSmallRows) {
    const int64_t rows = std::min<int64_t>(kSmallRows, m - i);
    const std::pair<int64_t, int64_t> k = k_range(i, rows);
    const int64_t n = cols(i, rows);
    const SmallOperand ai{a.data + i * a.row_stride, a.row_stride, a.col_stride};
    float* ci = c + i * ldc;
    switch (rows) {
      case 4:
        row_group<4>(ai, b, ldb, ci, ldc, k.first, k.second, n, alpha, accumulate);
        break;
      case 3:
        row_group<3>(ai, b, ldb, ci, ldc, k.first, k.second, n, alpha, accumulate);
        break;
      case 2:
        row_group<2>(ai, b, ldb, ci, ldc, k.first, k.second, n, alpha, accumulate);
        break;
      default:
        row_group<1>(ai, b, ldb, ci, ldc, k.first, k.second, n, alpha, accumulate);
        break;
    }
  }
}
#endif  // __AVX512F__

}  // namespace tessera::kernels::cpu
