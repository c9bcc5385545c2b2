#include "kernels/cpu/sgemm.h"

#if defined(__AVX512F__)

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>

#include "kernels/cpu/block_prefetcher.h"
#include "kernels/cpu/transpose16.h"

namespace tessera::kernels::cpu {
namespace {

// See Note [Packed SGEMM]. A tile is kMr rows by Nv vectors of kLanes columns, and each
// output layout has its own blocking:
// - Row-major C: tiles of 8 x 48 (Nv = 3): 8 x 3 accumulators plus three B vectors and one
//   broadcast fit the 32 zmm registers, one broadcast per three FMAs, and a GPT-2 step's
//   products (256 rows, widths that are multiples of 48 per thread) have no edge tiles. An
//   A micro-panel (kMr x kKc, 12 KiB) stays in L1; the packed B block (kKc x kNc, 288 KiB),
//   the A block of a GPT-2 step's 256 rows (384 KiB) and the next B block's source fit L2
//   together (1 MiB on Zen 4); a taller A block (kMc x kKc) is read from L3.
// - Transposed C (Note [Transposed SGEMM]): tiles of 8 x 32 (Nv = 2), so that a step's 256
//   tokens are eight full tiles, and kKc = 768: each tile's transposed store then comes
//   once per 768 steps of k, which took 3-5% of the tile time at 384. The packed B block
//   (the tokens, 768 x 256, 768 KiB) fills most of L2, and each A micro-panel (24 KiB,
//   weights read in place from DRAM) is used by its eight tiles in turn from L1.
// Both tiles run at the FMA peak in cache on Zen 4 (229 and 228 GFLOP/s on two cores).
constexpr int kLanes = 16;
constexpr int kMr = 8;
constexpr int64_t kMc = 1536;

// The blocking of one output layout: Nv vectors per tile row, kNc columns per B block and
// kKc steps of k per block.
template <bool TransposedC>
struct Layout {
  static constexpr int kNv = TransposedC ? 2 : 3;
  static constexpr int kNr = kNv * kLanes;
  static constexpr int64_t kNc = TransposedC ? 256 : 192;
  static constexpr int64_t kKc = TransposedC ? 768 : 384;
};

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<float[], FreeDeleter>;

AlignedBuffer aligned_floats(int64_t count) {
  const size_t bytes = (static_cast<size_t>(count) * sizeof(float) + 63) / 64 * 64;
  auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) throw std::bad_alloc();
  return AlignedBuffer(p);
}

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// 16 consecutive source values as f32 (f16 through vcvtph2ps), and one value.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline float value(float v) { return v; }
inline float value(Half v) { return static_cast<float>(v); }

// dst[0, kMr) = src[0, kMr) as f32.
inline void copy_row_of_a(const float* src, float* dst) {
  constexpr __mmask16 kRowMask = (1u << kMr) - 1;
  // One masked vector copy (std::copy_n of 12 floats became a memmove call).
  _mm512_mask_storeu_ps(dst, kRowMask, _mm512_maskz_loadu_ps(kRowMask, src));
}
inline void copy_row_of_a(const Half* src, float* dst) {
  static_assert(kMr == 8);
  const __m256i halves =
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  _mm512_mask_storeu_ps(dst, (1u << kMr) - 1, _mm512_cvtph_ps(halves));
}

// Packs a (m, k) into ceil(m / kMr) micro-panels: for each k, kMr values, zero past row m.
template <class Src>
void pack_a(StridedOf<Src> a, int64_t m, int64_t k, float* dst) {
  int64_t i0 = 0;
  if (a.row_stride == 1) {
    // Columns contiguous (the weight gradients' dY^T): two micro-panels per pass, each k's
    // 2 kMr values one 64-byte load split in halves. 2x faster than a masked load and
    // store of kMr values per panel, and the step's weight gradients 1.4% faster.
    static_assert(2 * kMr == kLanes);
    for (; i0 + 2 * kMr <= m; i0 += 2 * kMr) {
      const Src* src = a.data + i0;
      float* lo = dst + i0 * k;
      float* hi = lo + kMr * k;
      for (int64_t kk = 0; kk < k; ++kk) {
        const __m512 v = load16(src + kk * a.col_stride);
        _mm256_storeu_ps(lo + kk * kMr, _mm512_castps512_ps256(v));
        _mm256_storeu_ps(hi + kk * kMr, _mm512_extractf32x8_ps(v, 1));
      }
    }
    dst += i0 * k;
  }
  for (; i0 < m; i0 += kMr) {
    const int64_t rows = std::min<int64_t>(kMr, m - i0);
    const Src* src = a.data + i0 * a.row_stride;
    int64_t kk = 0;
    if (rows == kMr && a.row_stride == 1) {  // each k: kMr contiguous values
      for (; kk < k; ++kk, dst += kMr) copy_row_of_a(src + kk * a.col_stride, dst);
    } else if (rows == kMr && a.col_stride == 1) {  // rows contiguous: transpose 16 k at once
      for (; kk + kLanes <= k; kk += kLanes, dst += kLanes * kMr) {
        __m512 r[kLanes];
        for (int i = 0; i < kMr; ++i) r[i] = load16(src + i * a.row_stride + kk);
        for (int i = kMr; i < kLanes; ++i) r[i] = _mm512_setzero_ps();
        transpose16(r);
        for (int q = 0; q < kLanes; ++q) {
          _mm512_mask_storeu_ps(dst + q * kMr, (1u << kMr) - 1, r[q]);
        }
      }
    }
    for (; kk < k; ++kk, dst += kMr) {
      for (int i = 0; i < kMr; ++i) {
        dst[i] = i < rows ? value(src[i * a.row_stride + kk * a.col_stride]) : 0.0f;
      }
    }
  }
}

// The kMr rows of f16 `a` whose rows run along k (col_stride 1) as f32 rows of k values,
// kc apart in dst, as the micro-kernel reads an A in place; rows past `rows` are zero.
void convert_rows(HalfMatrix a, int64_t rows, int64_t k, float* dst) {
  for (int64_t i = 0; i < kMr; ++i, dst += k) {
    if (i >= rows) {
      std::fill_n(dst, k, 0.0f);
      continue;
    }
    const Half* src = a.data + i * a.row_stride;
    int64_t kk = 0;
    for (; kk + kLanes <= k; kk += kLanes) _mm512_storeu_ps(dst + kk, load16(src + kk));
    for (; kk < k; ++kk) dst[kk] = value(src[kk]);
  }
}

// Packs b (k, n) into ceil(n / kNr) micro-panels of Nv vectors: for each k, kNr values, zero
// past col n.
template <int Nv, class Src>
void pack_b(StridedOf<Src> b, int64_t k, int64_t n, float* dst) {
  constexpr int kNr = Nv * kLanes;
  for (int64_t j0 = 0; j0 < n; j0 += kNr) {
    const int64_t cols = std::min<int64_t>(kNr, n - j0);
    const Src* src = b.data + j0 * b.col_stride;
    int64_t kk = 0;
    if (cols == kNr && b.col_stride == 1) {  // each k: kNr contiguous values
      for (; kk < k; ++kk, dst += kNr) {
        const Src* s = src + kk * b.row_stride;
        for (int v = 0; v < Nv; ++v) _mm512_store_ps(dst + v * kLanes, load16(s + v * kLanes));
      }
    } else if (cols == kNr && b.row_stride == 1) {  // columns contiguous: transpose
      // 16 of the panel's source rows at a time, each walked along k: 16 memory streams
      // instead of 48 when the source comes from DRAM, which packs 1.3-1.8x faster here.
      const int64_t k16 = k / kLanes * kLanes;
      for (int part = 0; part < Nv; ++part) {
        float* d = dst + part * kLanes;
        for (int64_t k0 = 0; k0 < k16; k0 += kLanes, d += kLanes * kNr) {
          __m512 r[kLanes];
          for (int j = 0; j < kLanes; ++j) {
            r[j] = load16(src + (part * kLanes + j) * b.col_stride + k0);
          }
          transpose16(r);
          for (int q = 0; q < kLanes; ++q) _mm512_store_ps(d + q * kNr, r[q]);
        }
      }
      kk = k16;
      dst += k16 * kNr;
    }
    for (; kk < k; ++kk, dst += kNr) {
      for (int j = 0; j < kNr; ++j) {
        dst[j] = j < cols ? value(src[kk * b.row_stride + j * b.col_stride]) : 0.0f;
      }
    }
  }
}

// kMr rows of A over a block's kc steps of k, as the micro-kernel reads them: packed (for each
// k, kMr values) or in place in a matrix whose rows are contiguous along k.
struct APanel {
  const float* data;
  int64_t row_stride;  // elements between the rows, in place; 0 when packed
};

// kNr columns of B over a block's kc steps of k: packed (for each k, kNr values) or in place
// in a matrix whose rows are contiguous along n.
struct BPanel {
  const float* data;
  int64_t row_stride;  // elements between the rows (steps of k), in place; 0 when packed
};

// c (kMr, kNr) = (or +=, when Accumulate) a_panel @ b_panel over kc steps of k: row-major
// with leading dimension ldc, or transposed, tile element (i, j) at c[j * ldc + i]. AInPlace
// reads a_panel's rows lda apart instead of packed, BInPlace b_panel's rows ldb apart. Unless
// Accumulate, a non-null bias is added: bias[j] to tile column j, or bias[i] to tile row i
// when TransposedC (both are columns of C).
template <int Nv, bool Accumulate, bool AInPlace, bool BInPlace, bool TransposedC>
inline void micro_kernel(int64_t kc, const float* __restrict a, int64_t lda,
                         const float* __restrict b, int64_t ldb, float* c, int64_t ldc,
                         const float* bias) {
  constexpr int kNr = Nv * kLanes;
  // Every loop over the tile is unrolled so acc lives in registers (-O2 would not).
  __m512 acc[kMr][Nv];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 3
    for (int v = 0; v < Nv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  if constexpr (TransposedC) {
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(c + j * ldc), _MM_HINT_T0);
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 3
      for (int v = 0; v < Nv; ++v) {
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + v * kLanes), _MM_HINT_T0);
      }
    }
  }
#pragma GCC unroll 4
  for (int64_t kk = 0; kk < kc; ++kk, a += AInPlace ? 1 : kMr, b += BInPlace ? ldb : kNr) {
    __m512 bv[Nv];
#pragma GCC unroll 3
    for (int v = 0; v < Nv; ++v) {
      bv[v] = BInPlace ? _mm512_loadu_ps(b + v * kLanes) : _mm512_load_ps(b + v * kLanes);
    }
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512 ai = _mm512_set1_ps(AInPlace ? a[i * lda] : a[i]);
#pragma GCC unroll 3
      for (int v = 0; v < Nv; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
  }
  // The bias joins the first k block's sums (one per tile row, or per tile column).
  if (!Accumulate && bias != nullptr) {
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 3
      for (int v = 0; v < Nv; ++v) {
        const __m512 bias_v =
            TransposedC ? _mm512_set1_ps(bias[i]) : _mm512_loadu_ps(bias + v * kLanes);
        acc[i][v] = _mm512_add_ps(acc[i][v], bias_v);
      }
    }
  }
  // The stores stay in this function: passing acc to a helper by reference made GCC keep
  // it in memory inside the k loop.
  if constexpr (TransposedC) {
#pragma GCC unroll 3
    for (int v = 0; v < Nv; ++v) {
      __m512 r[kLanes];  // the kMr rows of this vector, padded to a 16 x 16 block
#pragma GCC unroll 16
      for (int i = 0; i < kLanes; ++i) r[i] = i < kMr ? acc[i][v] : _mm512_setzero_ps();
      transpose16(r);  // r[q]: column v * 16 + q of the tile, its kMr values in the low lanes
#pragma GCC unroll 16
      for (int q = 0; q < kLanes; ++q) {
        float* cq = c + (v * kLanes + q) * ldc;
        __m256 col = _mm512_castps512_ps256(r[q]);
        if (Accumulate) col = _mm256_add_ps(col, _mm256_loadu_ps(cq));
        _mm256_storeu_ps(cq, col);
      }
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 3
      for (int v = 0; v < Nv; ++v) {
        float* cv = c + i * ldc + v * kLanes;
        if (Accumulate) acc[i][v] = _mm512_add_ps(acc[i][v], _mm512_loadu_ps(cv));
        _mm512_storeu_ps(cv, acc[i][v]);
      }
    }
  }
}

// The micro-kernel for the panels' layouts (B in place only with row-major C).
template <int Nv, bool TransposedC, bool Accumulate>
void micro_kernel(int64_t kc, APanel a, BPanel b, float* c, int64_t ldc, const float* bias) {
  const bool b_in_place = !TransposedC && b.row_stride != 0;
  if (a.row_stride != 0) {
    if (b_in_place) {
      micro_kernel<Nv, Accumulate, true, true, false>(kc, a.data, a.row_stride, b.data,
                                                      b.row_stride, c, ldc, bias);
    } else {
      micro_kernel<Nv, Accumulate, true, false, TransposedC>(kc, a.data, a.row_stride, b.data, 0, c,
                                                             ldc, bias);
    }
  } else if (b_in_place) {
    micro_kernel<Nv, Accumulate, false, true, false>(kc, a.data, 0, b.data, b.row_stride, c, ldc,
                                                     bias);
  } else {
    micro_kernel<Nv, Accumulate, false, false, TransposedC>(kc, a.data, 0, b.data, 0, c, ldc, bias);
  }
}

// The micro-kernel on a tile with rows x cols valid entries, c pointing at its (0, 0) and
// bias (null for none) at its first entry (an edge tile goes through a local buffer so
// nothing past the edge of c or bias is touched).
template <int Nv, bool TransposedC>
void tile(bool accumulate, int64_t kc, APanel a, BPanel b, float* c, int64_t ldc, int64_t rows,
          int64_t cols, const float* bias) {
  constexpr int kNr = Nv * kLanes;
  if (rows == kMr && cols == kNr) {
    if (accumulate) {
      micro_kernel<Nv, TransposedC, true>(kc, a, b, c, ldc, nullptr);
    } else {
      micro_kernel<Nv, TransposedC, false>(kc, a, b, c, ldc, bias);
    }
    return;
  }
  alignas(64) float buffer[kMr * kNr];
  micro_kernel<Nv, false, false>(kc, a, b, buffer, kNr, nullptr);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      float& out = TransposedC ? c[j * ldc + i] : c[i * ldc + j];
      const float first = bias == nullptr ? 0.0f : bias[TransposedC ? i : j];
      out = (accumulate ? out : first) + buffer[i * kNr + j];
    }
  }
}

// c (m, n) = a @ b (see sgemm) in the given output layout: row-major with leading dimension
// ldc, or, when TransposedC, element (i, j) at c[j * ldc + i]. f16 operands are always packed.
template <bool TransposedC, class Src>
void sgemm_blocked(StridedOf<Src> a, StridedOf<Src> b, float* c, int64_t ldc, int64_t m, int64_t n,
                   int64_t k, const float* bias) {
  using L = Layout<TransposedC>;
  constexpr bool kF32 = std::is_same_v<Src, float>;
  const int64_t kc_max = std::min(L::kKc, k);
  // Rows contiguous along k (the forward's activations, the backward's output gradients, the
  // weights of C^T = W x^T): full micro-panels are read in place, and only a last partial
  // one is packed.
  const bool a_in_place = kF32 && a.col_stride == 1;
  // With a single B block each A micro-panel meets B once, so an f16 A is converted one
  // micro-panel at a time just before its tiles, into a buffer L1 holds, rather than a
  // block of up to kMc rows that only L3 does: the f16 forward's C^T = W x^T, where W is
  // converted, ran at 0.68 of the f32 product before. (Not measured for an f32 A that is
  // packed, so f32 keeps its block.)
  const bool a_by_panel = !kF32 && n <= L::kNc;
  const int64_t a_pack_rows = a_in_place || a_by_panel ? kMr : std::min(kMc, round_up(m, kMr));
  AlignedBuffer a_packed = aligned_floats(a_pack_rows * kc_max);
  // Likewise B's full micro-panels when its rows are contiguous along n (the backward's
  // weights and activations), with row-major C: reading them from the block the prefetcher
  // brought into L2 instead of packing them was 4-6% faster on the input gradients.
  const bool b_in_place = kF32 && !TransposedC && b.col_stride == 1;
  const int64_t b_pack_cols = b_in_place ? L::kNr : std::min(L::kNc, round_up(n, L::kNr));
  AlignedBuffer b_packed = aligned_floats(b_pack_cols * kc_max);
  const auto a_block = [&](int64_t ic, int64_t pc) -> StridedOf<Src> {
    return {a.data + ic * a.row_stride + pc * a.col_stride, a.row_stride, a.col_stride};
  };
  const auto b_block = [&](int64_t pc, int64_t jc) -> StridedOf<Src> {
    return {b.data + pc * b.row_stride + jc * b.col_stride, b.row_stride, b.col_stride};
  };
  const auto c_tile = [&](int64_t i, int64_t j) {
    return TransposedC ? c + j * ldc + i : c + i * ldc + j;
  };
  // Blocks of kMc rows keep A in L3 while it meets each B block. With a single B block and A
  // read in place or converted by panel there is nothing to keep, and one block of all rows
  // packs B once instead of once per kMc rows (the LM head's 25152 weight rows per thread
  // packed the same tokens 17 times: 2% of its forward).
  const int64_t mc_block = (a_in_place || a_by_panel) && n <= L::kNc ? m : kMc;
  for (int64_t ic = 0; ic < m; ic += mc_block) {
    const int64_t mc = std::min(mc_block, m - ic);
    for (int64_t pc = 0; pc < k; pc += L::kKc) {
      const int64_t kc = std::min(L::kKc, k - pc);
      const bool accumulate = pc > 0;
      const int64_t mc_in_place = a_in_place ? mc / kMr * kMr : 0;
      if (!a_by_panel && mc_in_place < mc) {
        pack_a(a_block(ic + mc_in_place, pc), mc - mc_in_place, kc, a_packed.get());
      }
      // Called once per micro-panel and B block: it packs the panel when a_by_panel.
      const auto a_panel = [&](int64_t ir) -> APanel {
        if constexpr (kF32) {
          if (ir < mc_in_place) return {a_block(ic + ir, pc).data, a.row_stride};
        }
        if (a_by_panel) {
          const int64_t rows = std::min<int64_t>(kMr, mc - ir);
          if constexpr (!kF32) {      // (f32 rows along k are read in place)
            if (a.col_stride == 1) {  // rows along k: converted into f32 rows, no transpose
              convert_rows(a_block(ic + ir, pc), rows, kc, a_packed.get());
              return {a_packed.get(), kc};
            }
          }
          pack_a(a_block(ic + ir, pc), rows, kc, a_packed.get());
          return {a_packed.get(), 0};
        }
        return {a_packed.get() + (ir - mc_in_place) * kc, 0};
      };
      for (int64_t jc = 0; jc < n; jc += L::kNc) {
        const int64_t nc = std::min(L::kNc, n - jc);
        const int64_t nc_in_place = b_in_place ? nc / L::kNr * L::kNr : 0;
        if (nc_in_place < nc) {
          pack_b<L::kNv>(b_block(pc, jc + nc_in_place), kc, nc - nc_in_place, b_packed.get());
        }
        const auto b_panel = [&](int64_t jr) -> BPanel {
          if constexpr (kF32) {
            if (jr < nc_in_place) return {b_block(pc, jc + jr).data, b.row_stride};
          }
          return {b_packed.get() + (jr - nc_in_place) * kc, 0};
        };
        BlockPrefetcher next;  // the B block read after this one, spread over its tiles
        if (jc + L::kNc < n) {
          next = BlockPrefetcher(b_block(pc, jc + L::kNc), kc, std::min(L::kNc, n - jc - L::kNc));
        } else if (pc + L::kKc < k) {
          next = BlockPrefetcher(b_block(pc + L::kKc, 0), std::min(L::kKc, k - pc - L::kKc),
                                 std::min(L::kNc, n));
        }
        const int64_t tiles = (mc + kMr - 1) / kMr * ((nc + L::kNr - 1) / L::kNr);
        const int64_t lines_per_tile = (next.lines() + tiles - 1) / tiles;
        for (int64_t ir = 0; ir < mc; ir += kMr) {
          const APanel panel = a_panel(ir);
          for (int64_t jr = 0; jr < nc; jr += L::kNr) {
            const float* tile_bias =
                bias == nullptr ? nullptr : bias + (TransposedC ? ic + ir : jc + jr);
            tile<L::kNv, TransposedC>(accumulate, kc, panel, b_panel(jr), c_tile(ic + ir, jc + jr),
                                      ldc, std::min<int64_t>(kMr, mc - ir),
                                      std::min<int64_t>(L::kNr, nc - jr), tile_bias);
            next.issue(lines_per_tile);
          }
        }
      }
    }
  }
}

template <class Src>
void sgemm_any(StridedOf<Src> a, StridedOf<Src> b, float* c, int64_t ldc, int64_t m, int64_t n,
               int64_t k, const float* bias) {
  // Note [Transposed SGEMM]: when B's columns are contiguous along k (x W^T) and B is the
  // wider operand, C^T = B^T A^T reads B^T's rows in place and packs the narrower A^T.
  const bool b_rows_along_k = b.row_stride == 1 && b.col_stride != 1;
  if (b_rows_along_k && n > m) {
    sgemm_blocked<true, Src>({b.data, b.col_stride, b.row_stride},
                             {a.data, a.col_stride, a.row_stride}, c, ldc, n, m, k, bias);
  } else {
    sgemm_blocked<false, Src>(a, b, c, ldc, m, n, k, bias);
  }
}

}  // namespace

void sgemm(StridedMatrix a, StridedMatrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
           const float* bias) {
  sgemm_any(a, b, c, ldc, m, n, k, bias);
}

void sgemm(HalfMatrix a, HalfMatrix b, float* c, int64_t ldc, int64_t m, int64_t n, int64_t k,
           const float* bias) {
  sgemm_any(a, b, c, ldc, m, n, k, bias);
}

}  // namespace tessera::kernels::cpu

#endif  // __AVX512F__
